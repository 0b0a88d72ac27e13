"""`pipesim plan --framework NAME` plans what the stack can run (pipesim.plan.stack_space), refuses a typed choice it
cannot run in one line, and exports the winner in the stack's own terms."""

from __future__ import annotations

import json
import shlex

import pytest
import tomllib

from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig
from pipesim.plan.space import PlanRequest, enumerate_candidates
from pipesim.plan.stack_space import SPACES, stack_space
from tests.plan_checks import bounds_hold

SMALL = ["--model", "gpt", "--hidden", "512", "--layers", "8", "--heads", "8", "--seq", "512", "--vocab", "8000",
         "--batch", "16", "--dtype", "bfloat16"]
# a Llama-like block (SwiGLU, grouped-query attention): the one torchtitan's per-op policy is modelled for
LLAMA = ["--model", "gpt", "--hidden", "512", "--layers", "8", "--heads", "8", "--kv-heads", "2", "--activation",
         "swiglu", "--ffn-hidden", "1408", "--seq", "1024", "--vocab", "8000", "--batch", "16", "--dtype", "bfloat16"]
H100 = ["--hardware", "dgx-h100", "--gpus", "8"]


def _plan(capsys, tmp_path, *argv: str) -> dict:
    out = tmp_path / "plan.json"
    assert main(["plan", *argv, "--top", "500", "--json", str(out)]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


@pytest.mark.parametrize("framework", sorted(SPACES))
def test_every_stack_plans_only_what_it_runs_and_exports_its_own_terms(capsys, tmp_path, framework):
    space = SPACES[framework]
    data = _plan(capsys, tmp_path, *LLAMA, *H100, "--framework", framework, "--max-candidates", "60")
    rows = data["rows"]
    assert rows
    for r in rows:
        assert r["schedule"] in space.schedule_names or (r["pp"] == 1 and r["schedule"] == "1f1b")
        assert r["zero"] in space.zeros or (r["dp"] == 1 and r["zero"] == 0)
        assert r["recompute"] in space.recomputes
        # searched on wherever the stack offers it (Megatron's practice); off where it has none
        assert r["sequence_parallel"] == (r["tp"] > 1 and True in space.sequence_parallel)
        if r["recompute"] == "op":  # only where pipesim models torchtitan's policy
            assert r["tp"] == 1 and r["cp"] == 1
    winner = data["winner"]
    assert ("torchtitan_toml" in winner) == (framework == "torchtitan")
    assert ("megatron_args" in winner) == (framework != "torchtitan")


def test_the_plan_without_a_framework_is_pipesims_own_and_exports_both(capsys, tmp_path):
    data = _plan(capsys, tmp_path, *SMALL, *H100, "--max-candidates", "40")
    assert {r["recompute"] for r in data["rows"]} <= {"none", "selective", "full"}
    assert {r["zero"] for r in data["rows"]} <= {0, 1}
    assert "torchtitan_toml" in data["winner"] and "megatron_args" in data["winner"]


@pytest.mark.parametrize("framework, extra, expected", [
    ("torchtitan", ["--zero", "0,1"],
     "--framework torchtitan has no ZeRO 1 (it offers ZeRO 0, 3: pytorch/torchtitan v0.2.2, docs/frameworks.md)"),
    ("torchtitan", ["--recompute", "selective"], "--framework torchtitan has no --recompute selective"),
    ("torchtitan", ["--schedules", "1f1b,dualpipe"], "--framework torchtitan has no dualpipe schedule"),
    ("torchtitan", ["--sequence-parallel", "off"], "--framework torchtitan has no --sequence-parallel off"),
    ("torchtitan", ["--cp", "1,2", "--cp-comm-type", "a2a"], "--framework torchtitan has no --cp-comm-type a2a"),
    ("deepspeed", ["--schedules", "zb-h1"], "--framework deepspeed has no zb-h1 schedule (it offers deepspeed-1f1b"),
    ("deepspeed", ["--zero", "3"], "--framework deepspeed has no ZeRO 3"),
    ("megatron-core", ["--recompute", "op"], "--framework megatron-core has no --recompute op"),
    ("megatron-core", ["--schedules", "zb-v"], "--framework megatron-core has no zb-v schedule"),
    ("megatron-lm-2021", ["--cp", "2"], "--framework megatron-lm-2021 has no context parallelism"),
    ("megatron-lm-2021", ["--recompute", "selective"], "--framework megatron-lm-2021 has no --recompute selective"),
    (None, ["--recompute", "op"], "--recompute op is torchtitan's per-op checkpointing: plan it with --framework "
                                  "torchtitan"),
])
def test_a_choice_the_stack_cannot_run_is_refused_in_one_line(capsys, framework, extra, expected):
    fw = ["--framework", framework] if framework else []
    assert main(["plan", *LLAMA, *H100, *fw, *extra]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_torchtitans_op_checkpointing_is_planned_simulated_and_exported_as_it_runs(capsys, tmp_path):
    data = _plan(capsys, tmp_path, *LLAMA, *H100, "--framework", "torchtitan", "--recompute", "op",
                 "--cp", "1,2")
    assert data["rows"] and all(r["recompute"] == "op" and r["tp"] == 1 and r["cp"] == 1 for r in data["rows"])
    winner = data["winner"]
    argv = shlex.split(winner["simulate_command"])
    assert argv[argv.index("--recompute") + 1] == "op"
    assert main(argv[1:] + ["--json"]) == 0  # the export reproduces the planned step, bit for bit
    assert json.loads(capsys.readouterr().out)["step_time"] == data["rows"][0]["step_time"]
    toml = tomllib.loads(winner["torchtitan_toml"])
    assert toml["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    best = data["rows"][0]
    shard = toml["parallelism"]["data_parallel_shard_degree"]
    assert (shard, toml["parallelism"]["data_parallel_replicate_degree"]) == (
        (best["dp"], 1) if best["zero"] == 3 else (1, best["dp"]))
    run = shlex.split(winner["run_command"])
    assert run[run.index("--recompute") + 1] == "full"  # the executor has no per-op policy, and says so
    assert winner["run_note"].startswith("# the executor has no per-op checkpointing: this runs full recomputation")


def test_op_alone_on_a_block_it_is_not_modelled_for_names_why(capsys):
    assert main(["plan", *SMALL, *H100, "--framework", "torchtitan", "--recompute", "op"]) == 2
    err = capsys.readouterr().err
    assert "--recompute op (torchtitan's per-op checkpointing) is not modelled with a gelu MLP" in err


def test_torchtitan_context_parallelism_is_its_rotate_method(capsys, tmp_path):
    """The profile's K/V exchange is torch's default all-gather rotater; the export names the rotate method."""
    data = _plan(capsys, tmp_path, *LLAMA, *H100, "--framework", "torchtitan", "--cp", "2", "--recompute", "none")
    assert all(r["cp"] == 2 for r in data["rows"])
    assert tomllib.loads(data["winner"]["torchtitan_toml"])["parallelism"]["context_parallel_rotate_method"] == \
        "allgather"
    argv = shlex.split(data["winner"]["simulate_command"])
    assert argv[argv.index("--cp-comm-type") + 1] == "all_gather"
    ring = _plan(capsys, tmp_path, *LLAMA, *H100, "--framework", "torchtitan", "--cp", "2", "--recompute", "none",
                 "--cp-comm-type", "p2p")
    assert tomllib.loads(ring["winner"]["torchtitan_toml"])["parallelism"]["context_parallel_rotate_method"] == \
        "alltoall"


def test_simulate_with_the_torchtitan_profile_exchanges_kv_as_torchtitan_does(capsys):
    base = ["simulate", "1f1b", *LLAMA, "--hardware", "dgx-h100", "--stages", "2", "--dp", "2", "--cp", "2", "--json"]
    steps = {}
    for name, extra in (("profile", ["--framework", "torchtitan"]),
                        ("typed", ["--framework", "torchtitan", "--cp-comm-type", "all_gather"]),
                        ("ring", ["--framework", "torchtitan", "--cp-comm-type", "p2p"])):
        assert main([*base, *extra]) == 0
        steps[name] = json.loads(capsys.readouterr().out)["step_time"]
    assert steps["profile"] == steps["typed"] != steps["ring"]


def test_the_memory_bound_holds_for_op_checkpointing():
    """The planner prunes on a lower bound of the peak; with op checkpointing too it never exceeds rank_memory's."""
    model = ModelConfig(kind="gpt", hidden=512, layers=8, heads=8, kv_heads=2, activation="swiglu", ffn_hidden=1408,
                        seq=1024, vocab=8000, batch=16, dtype="bfloat16")
    req = PlanRequest(model, load_hardware("dgx-h100"), 8, ("1f1b", "interleaved-1f1b", "zb-v"), None, ("op",),
                      (0, 3), framework="torchtitan")
    assert all(c.recompute == "op" and c.tp == 1 for c in enumerate_candidates(req))
    assert len(bounds_hold(req)) > 20


def test_an_unknown_framework_has_no_space():
    assert stack_space(None) is None
    with pytest.raises(PipesimError, match="the planner knows"):
        stack_space("jax")


def test_torchtitans_compile_and_async_tp_are_planned_and_exported(capsys, tmp_path):
    data = _plan(capsys, tmp_path, *LLAMA, *H100, "--framework", "torchtitan", "--compile", "--async-tp",
                 "--recompute", "none", "--max-candidates", "40")
    rows = data["rows"]
    tp_rows = [r for r in rows if r["tp"] > 1]
    assert tp_rows and all(r["sequence_parallel"] for r in tp_rows)
    argv = shlex.split(data["winner"]["simulate_command"])
    assert "--no-kernel-fusion" not in argv  # compiled: the fused kernels pipesim times by default
    assert ("--async-tp" in argv) == (rows[0]["tp"] > 1)
    assert main(argv[1:] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == rows[0]["step_time"]
    toml = tomllib.loads(data["winner"]["torchtitan_toml"])
    assert toml["compile"] == {"enable": True}
    assert toml["parallelism"].get("enable_async_tensor_parallel", False) == (rows[0]["tp"] > 1)
    # the same plan eager: every candidate slower, no [compile]
    eager = _plan(capsys, tmp_path, *LLAMA, *H100, "--framework", "torchtitan", "--recompute", "none",
                  "--max-candidates", "40")
    assert "compile" not in tomllib.loads(eager["winner"]["torchtitan_toml"])
    assert eager["rows"][0]["step_time"] > rows[0]["step_time"]
    assert main(["plan", *LLAMA, *H100, "--framework", "torchtitan", "--async-tp"]) == 2
    assert "--async-tp needs torch.compile (--compile)" in capsys.readouterr().err


def test_fsdp_resharding_plans_zero_3_and_fp8_gathers_the_distributed_optimizer(capsys, tmp_path):
    data = _plan(capsys, tmp_path, *LLAMA, *H100, "--framework", "torchtitan", "--fsdp-reshard-after-forward",
                 "always", "--recompute", "none", "--max-candidates", "40")
    assert all(r["zero"] == 3 or r["dp"] == 1 for r in data["rows"])
    best = data["rows"][0]
    argv = shlex.split(data["winner"]["simulate_command"])
    assert argv[argv.index("--fsdp-reshard-after-forward") + 1] == "always"
    assert main(argv[1:] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == best["step_time"]
    assert tomllib.loads(data["winner"]["torchtitan_toml"])["parallelism"]["fsdp_reshard_after_forward"] == "always"
    assert main(["plan", *LLAMA, *H100, "--framework", "torchtitan", "--fsdp-reshard-after-forward", "always",
                 "--zero", "0,3"]) == 2
    assert ("--fsdp-reshard-after-forward always needs ZeRO 3 among the plan's --zero, got 0,3"
            in capsys.readouterr().err)
    fp8 = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"]
    data = _plan(capsys, tmp_path, *LLAMA, *H100, "--framework", "megatron-core", *fp8, "--recompute", "none",
                 "--max-candidates", "40")
    assert all(r["zero"] == 1 or r["dp"] == 1 for r in data["rows"])
    assert ("--fp8-param-gather" in data["winner"]["megatron_args"]) == (data["rows"][0]["dp"] > 1)


@pytest.mark.parametrize("framework", ["deepspeed", "megatron-lm-2021"])
def test_the_2021_megatron_stacks_export_their_own_flags(capsys, tmp_path, framework):
    """Megatron-LM @ 46c74b4 and Megatron-DeepSpeed @ 119a0d2 checkpoint with --checkpoint-activations, have no
    distributed optimizer (DeepSpeed's ZeRO 1 is its config) and no flash attention."""
    data = _plan(capsys, tmp_path, *SMALL, "--hardware", "dgx-a100", "--gpus", "16", "--framework", framework,
                 "--recompute", "full", "--max-candidates", "20")
    args = data["winner"]["megatron_args"]
    assert "--checkpoint-activations" in args and not any("--recompute-granularity" in a for a in args)
    assert "--use-distributed-optimizer" not in " ".join(args) and "--use-flash-attn" not in " ".join(args)
    deepspeed_zero1 = framework == "deepspeed" and data["rows"][0]["zero"] == 1
    assert any(a.startswith("# ZeRO 1 is DeepSpeed's") for a in args) == deepspeed_zero1
    # flash on the A100 by default; megatron-lm-2021's profile plans eager attention, as NAR21 ran it
    assert any(a.startswith("# pipesim timed flash attention") for a in args) == (framework == "deepspeed")
