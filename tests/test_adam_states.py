"""Megatron-core's precision-aware optimizer (pipesim.model.adam_states): the bytes of Adam's master weights and
moments, exactly, through memory, the optimizer step, the commands and the planner's exports."""

from __future__ import annotations

import json
import shlex

import pytest

from pipesim.cli import build_parser, main
from pipesim.commands.setup_args import sim_job
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.adam_states import AdamStates
from pipesim.model.config import ModelConfig
from pipesim.model.memory import PRECISIONS, named_precision
from pipesim.parallel_dims import ParallelDims

GPT = ["--model", "gpt", "--hidden", "512", "--layers", "4", "--heads", "8", "--seq", "512", "--vocab", "8000",
       "--batch", "16", "--dtype", "bfloat16"]
BF16_MOMENTS = ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]


@pytest.mark.parametrize("states, dtype, recipe, master", [
    (AdamStates(), "bfloat16", None, 2),  # TE's FusedAdam keeps the float32 master's 16-bit remainder
    (AdamStates(), "bfloat16", "delayed", 2),  # delayed scaling: TE still manages the master weights
    (AdamStates(), "bfloat16", "blockwise", 4),  # Megatron-core keeps the float32 master itself
    (AdamStates(), "float16", None, 4),  # the remainder trick needs bfloat16 parameters
    (AdamStates(main_params="fp16"), "bfloat16", "tensorwise", 2),
])
def test_master_weight_bytes_follow_who_keeps_them(states, dtype, recipe, master):
    assert states.master_bytes(dtype=dtype, fp8_recipe=recipe) == master


def test_a_precision_aware_precision_has_the_states_bytes_and_the_base_grads():
    p = named_precision("megatron+" + AdamStates("fp32", "bf16", "fp8").tag(dtype="bfloat16", fp8_recipe=None))
    base = PRECISIONS["megatron"]
    assert (p.param_bytes, p.grad_bytes, p.optimizer_bytes, p.master_bytes) == (base.param_bytes, base.grad_bytes,
                                                                                2 + 2 + 1, 2)
    assert named_precision("mixed") is PRECISIONS["mixed"]
    for bad in ("fp32+adam-2-2-2", "megatron+sgd-1", "fp64"):
        with pytest.raises(PipesimError, match="unknown precision"):
            named_precision(bad)


def _simulate(capsys, *extra: str) -> dict:
    assert main(["simulate", "1f1b", *GPT, "--hardware", "dgx-h100", "--stages", "2", "--microbatches", "4",
                 "--dp", "4", "--zero", "1", *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_bf16_moments_halve_the_sharded_optimizer_states_and_its_step_bytes(capsys):
    """bfloat16 model, no FP8: 2 (master remainder) + 2 + 2 = 6 bytes per parameter instead of 4 + 4 + 4."""
    plain, aware = _simulate(capsys), _simulate(capsys, *BF16_MOMENTS)
    before, after = plain["memory"]["ranks"][0], aware["memory"]["ranks"][0]
    assert after["optimizer_states"] * 2 == before["optimizer_states"]
    assert {k: v for k, v in after.items() if k not in ("optimizer_states", "total")} == \
        {k: v for k, v in before.items() if k not in ("optimizer_states", "total")}
    assert aware["step_time"] < plain["step_time"]  # the Adam step reads and writes fewer bytes


@pytest.mark.parametrize("argv, message", [
    (["--exp-avg-dtype", "bf16"], "--exp-avg-dtype needs --use-precision-aware-optimizer"),
    (["--use-precision-aware-optimizer", "--zero", "0"], "--use-precision-aware-optimizer needs the distributed "
                                                          "optimizer (--zero 1 or 2), got --zero 0"),
    (["--use-precision-aware-optimizer", "--zero", "1", "--dtype", "float32"], "lowers a 16-bit model's optimizer "
                                                                                "states, got float32"),
])
def test_refused_in_one_line(capsys, argv, message):
    base = [a for a in GPT if a not in ("--dtype", "bfloat16")] + (["--dtype", "bfloat16"] if "--dtype" not in argv
                                                                   else [])
    assert main(["simulate", "1f1b", *base, "--hardware", "dgx-h100", "--stages", "2", "--microbatches", "4", "--dp",
                 "4", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_flags_read_back_to_the_same_job():
    job = Job(ParallelDims(dp=2), zero=1, attention="flash", adam_states=AdamStates("fp16", "bf16", "fp8"))
    argv = ["simulate", "1f1b", "--model", "gpt", "--dtype", "bfloat16", "--dp", "2", *job.flags()]
    model = ModelConfig(kind="gpt", dtype="bfloat16")
    assert sim_job(build_parser().parse_args(argv), model, load_hardware("dgx-h100")) == job


def test_the_planner_plans_it_with_the_distributed_optimizer_and_exports_it(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", *GPT, "--hardware", "dgx-h100", "--gpus", "8", "--framework", "megatron-core",
                 *BF16_MOMENTS, "--recompute", "none", "--max-candidates", "40", "--top", "100",
                 "--json", str(out)]) == 0
    capsys.readouterr()
    data = json.loads(out.read_text())
    assert all(r["zero"] == 1 or r["dp"] == 1 for r in data["rows"])
    best = data["rows"][0]
    argv = shlex.split(data["winner"]["simulate_command"])
    assert (argv[argv.index("--exp-avg-dtype") + 1] == "bf16") == (best["dp"] > 1)
    assert main(argv[1:] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == best["step_time"]
    assert ("--use-precision-aware-optimizer" in data["winner"]["megatron_args"]) == (best["dp"] > 1)
