"""`pipesim plan` on mixture-of-experts models: the expert layouts it tries, its memory bound against the exact
peak, and a Mixtral 8x22B plan on 64 H100s with its expert-parallel exports."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest

from executor.run_config import RunConfig
from pipesim.cli import build_parser, main
from pipesim.commands.common import model_config
from pipesim.commands.run_args import config_from_args
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.flops import model_flops, moe_mlp_delta
from pipesim.model.moe import MoeConfig
from pipesim.parallel_dims import ParallelDims
from pipesim.plan.exports import megatron_args, run_note
from pipesim.plan.space import Candidate, PlanRequest, enumerate_candidates, expert_layouts
from tests.plan_checks import bounds_hold

SMALL_MOE = ModelConfig(kind="gpt", hidden=256, layers=8, heads=8, seq=256, vocab=4000, batch=32, dtype="bfloat16",
                        activation="swiglu", norm="rmsnorm", dropout=False, biases=False, positions="rope",
                        ffn_hidden=512, moe=MoeConfig(8, 2, 256, shared_experts=1, dense_layers=1))


def test_expert_layouts_are_megatron_cores_admissible_ones():
    """ep divides the experts and, with etp (tp: 0, or 1), the stage's t cp d ranks; with tp, sp is required
    for ep > 1, and without sp the experts split as the MLP (etp = tp)."""
    assert expert_layouts(SMALL_MOE, 2, 1, 8, True) == [(1, 0), (1, 1), (2, 0), (2, 1), (4, 0), (4, 1), (8, 0),
                                                        (8, 1)]
    assert expert_layouts(SMALL_MOE, 2, 1, 2, True) == [(1, 0), (1, 1), (2, 0), (2, 1), (4, 1)]
    assert expert_layouts(SMALL_MOE, 2, 1, 8, False) == [(1, 0)]
    assert expert_layouts(SMALL_MOE, 1, 1, 4, False) == [(1, 0), (2, 0), (4, 0)]
    assert expert_layouts(ModelConfig(kind="gpt"), 2, 1, 8, True) == [(1, 0)]
    c = Candidate("1f1b", 2, 1, 2, 4, 1, 8, "none", 1, True, 1, 4, 1)
    dims = c.job(PlanRequest(SMALL_MOE, load_hardware("dgx-h100"), 16).shared_job).dims
    assert (dims.ep, dims.etp, dims.edp) == (4, 1, 2) and c.label() == "1f1b p2 t2 sp ep4 etp1 d4 mbs1 m8 rc=none zero1"


def test_model_flops_count_the_active_experts():
    """Per token, a MoE layer's GEMMs are the router's and its top-k routed and shared experts', not the dense MLP's:
    6 x (h E + (k + shared) 3 h f_e) per token and layer for F + I + W."""
    dense = ModelConfig(**{**SMALL_MOE.to_dict(), "moe": None})
    tokens = SMALL_MOE.batch * SMALL_MOE.seq
    h, f = 256, 256
    assert moe_mlp_delta(SMALL_MOE, tokens) == 2 * tokens * (h * 8 + 3 * 3 * h * f - 3 * h * 512)
    assert model_flops(SMALL_MOE, SMALL_MOE.batch) - model_flops(dense, dense.batch) == 7 * 3 * moe_mlp_delta(
        SMALL_MOE, tokens)  # 7 of the 8 layers have experts (the first is dense)


def test_memory_bound_never_exceeds_the_exact_peak_with_experts():
    req = PlanRequest(SMALL_MOE, load_hardware("dgx-h100"), 8, zeros=(0, 1, 3))
    checked = bounds_hold(req, lambda c: c.mbs == 1 and c.recompute != "selective")  # keeps the test to seconds
    assert len(checked) > 100 and sum(c.ep > 1 for c, _, _ in checked) > 50


def test_plan_mixtral_8x22b_on_64_h100s_exports_the_expert_layout(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model-config", "mixtral-8x22b", "--seq", "4096", "--batch", "512",
                 "--hardware", "dgx-h100", "--nodes", "8", "--moe-aux-loss-coeff", "0.02", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    winner = data["winner"]
    best = data["rows"][0]
    assert f" --ep {best['ep']} " in winner["simulate_command"] and best["ep"] > 1
    args = winner["megatron_args"]
    assert "--num-experts 8" in args and "--moe-router-topk 2" in args
    assert "--moe-token-dispatcher-type alltoall" in args
    assert any(a.startswith("--expert-model-parallel-size ") for a in args)
    assert "expert_parallel_degree = " in winner["torchtitan_toml"]
    # the executor builds Mixtral's SwiGLU experts and takes the layout: its checks pass on the command's ranks
    assert "run_note" not in winner
    run = config_from_args(build_parser().parse_args(shlex.split(winner["run_command"])[1:] + ["--backend", "gloo"]))
    assert run.model == model_config(build_parser().parse_args(shlex.split(winner["simulate_command"])[1:]))
    assert [s.name for s in run.check(best["tp"] * best["pp"] * best["dp"])] == [best["schedule"]]
    assert data["model_config"]["source"] == "mixtral-8x22b"
    # the load-balancing loss travels to both: the run trains it, Megatron-core is told it
    assert run.model.moe.balance_loss and run.model.moe.aux_loss_coeff == 0.02
    assert "--moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 0.02" in " ".join(args)
    assert "--moe-router-pre-softmax" not in args  # Mixtral's softmax over its top 2: Megatron-core's default


def test_combined_1f1b_is_planned_only_where_megatron_core_runs_it():
    """Megatron-core's A2A overlap asserts ep > 1 and no full recomputation: the planner offers combined-1f1b with
    sharded experts only, never with full recomputation, and on a dense model not at all."""
    req = PlanRequest(SMALL_MOE, load_hardware("dgx-h100"), 16, schedules=("combined-1f1b", "interleaved-1f1b"),
                      recomputes=("none", "full"))
    found = enumerate_candidates(req)
    combined = [c for c in found if c.schedule == "combined-1f1b"]
    plain = [c for c in found if c.schedule == "interleaved-1f1b"]
    assert combined and all(c.ep > 1 and c.recompute != "full" for c in combined)
    assert {c.ep for c in plain} >= {1, 2} and {c.recompute for c in plain} == {"none", "full"}
    exported = megatron_args(combined[0], req)
    assert "--overlap-moe-expert-parallel-comm" in exported and not exported[0].startswith("#")
    # pipesim's own router takes the softmax over every expert before the top k: Megatron-core's pre-softmax
    assert "--moe-router-pre-softmax" in exported
    capped = replace(SMALL_MOE, moe=replace(SMALL_MOE.moe, capacity_factor=1.0, drop_policy="position"))
    words = " ".join(megatron_args(combined[0], PlanRequest(capped, load_hardware("dgx-h100"), 16)))
    assert "--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity --moe-token-drop-policy position" \
        in words  # probs, Megatron-core's default, goes unsaid
    # DeepSeek-V3's router as simulated: sigmoid scores, the score bias, group-limited routing; no pre-softmax
    routed = replace(SMALL_MOE, moe=replace(SMALL_MOE.moe, score="sigmoid", expert_bias=True, groups=2, group_topk=1))
    words = " ".join(megatron_args(combined[0], PlanRequest(routed, load_hardware("dgx-h100"), 16)))
    assert ("--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-num-groups 2 "
            "--moe-router-group-topk 1") in words and "--moe-router-pre-softmax" not in words
    assert "--moe-token-drop-policy" not in " ".join(megatron_args(combined[0], PlanRequest(
        replace(SMALL_MOE, moe=replace(SMALL_MOE.moe, capacity_factor=1.0)), load_hardware("dgx-h100"), 16)))
    assert "--overlap-moe-expert-parallel-comm" not in megatron_args(plain[0], req)
    dense = ModelConfig(**{**SMALL_MOE.to_dict(), "moe": None})
    assert not [c for c in enumerate_candidates(PlanRequest(dense, load_hardware("dgx-h100"), 16,
                                                            schedules=("combined-1f1b", "interleaved-1f1b")))
                if c.schedule == "combined-1f1b"]


def test_the_exported_command_keeps_the_expert_flags_over_the_config(tmp_path):
    """Expert and routing flags over a mixture of experts' config change the model: the winner's simulate command
    types them again and re-simulates to the plan's step (before, it dropped them and simulated the file's 128
    experts)."""
    out, again = tmp_path / "plan.json", tmp_path / "again.json"
    assert main(["plan", "--model-config", "qwen3-30b-a3b", "--num-experts", "64", "--moe-load-imbalance", "1.5",
                 "--seq", "4096", "--batch", "64", "--hardware", "dgx-h100", "--gpus", "8", "--max-candidates", "5",
                 "--top", "1", "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    argv = plan["winner"]["simulate_command"].split()
    assert argv[argv.index("--num-experts") + 1] == "64" and argv[argv.index("--moe-load-imbalance") + 1] == "1.5"
    assert main([*argv[1:], "--json", str(again)]) == 0
    assert json.loads(again.read_text())["step_time"] == plan["rows"][0]["step_time"]


def test_the_run_note_names_what_the_executors_expert_checks_refuse():
    """One owner (pipesim.model.config.unrun_expert_layout): the plan's run note and `pipesim run`'s refusal name the
    same flags, here the cost model's load imbalance; recomputation and a capacity factor beside tp run (each tp
    rank counting its part of a sequence)."""
    model = ModelConfig(kind="gpt", hidden=64, heads=4, layers=2, seq=16, batch=8,
                        moe=MoeConfig(experts=4, top_k=2, expert_ffn=32, imbalance=1.5))
    c = Candidate("1f1b", p=1, v=1, tp=2, dp=2, mbs=1, m=4, recompute="selective", zero=0, sp=True, ep=2, etp=1)
    items = "--moe-load-imbalance 1.5 (the cost model's; a run routes what its router routes)"
    assert run_note(c, model) == (f"# the executor's experts do not run {items}: `pipesim run` refuses this layout "
                                  "(simulate it with the command above)")
    job = Job(dims=ParallelDims(tp=2, dp=2, ep=2, etp=1), sp=True, recompute="selective")
    with pytest.raises(PipesimError) as err:
        RunConfig(names=("1f1b",), microbatches=4, job=job, model=model).check(4)
    assert str(err.value) == ("the executor's mixture-of-experts model runs with pp, dp, ep and tp; it does not run "
                              f"{items}")
    runs = replace(model, moe=replace(model.moe, imbalance=1.0, capacity_factor=1.0))
    assert run_note(c, runs) is None
    RunConfig(names=("1f1b",), microbatches=4, job=job, model=runs).check(4)
