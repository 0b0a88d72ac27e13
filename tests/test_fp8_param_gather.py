"""--fp8-param-gather (Megatron-core's flag; NeMo's fp8_params, Megatron-Bridge's FP8 current-scaling default): the
FP8 linears' parameters kept as their FP8 copies and all-gathered by the distributed optimizer one byte each."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

import schedules
from pipesim.cost.fp8_costs import stage_fp8_expert_params, stage_fp8_weights
from pipesim.cost.model_costs import model_costs
from pipesim.cost.rank_memory import rank_memory
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig, split_layers
from pipesim.model.fp8 import Fp8Options
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.moe import MoeConfig
from pipesim.parallel_dims import ParallelDims

LLAMA = ModelConfig(kind="gpt", hidden=1024, layers=4, heads=16, kv_heads=4, ffn_hidden=3584, seq=1024, vocab=32000,
                    batch=16, dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                    positions="rope")
HW = load_hardware("2x-dgx-h100")
FP8 = Fp8Options("hybrid", "delayed")


def _costs(gather: bool, zero: int = 1):
    job = Job(ParallelDims(pp=2, dp=4), zero=zero, fp8=FP8, attention="flash", fp8_param_gather=gather)
    return model_costs(LLAMA, 2, 4, HW, job)


def test_parameters_live_in_the_fp8_copies_and_gather_one_byte_each():
    plain, fp8 = _costs(False), _costs(True)
    opts = plain.job.layer_options(LLAMA)
    fp8_params = [stage_fp8_weights(LLAMA, 1, opts, "H100", StageLayers.uniform(n))[0]
               for n in split_layers(LLAMA.layers, 2)]
    assert fp8.fp8_param_counts == tuple(fp8_params) and plain.fp8_param_counts == ()
    for s in range(2):  # the parameters' all-gather: 2 bytes each, the FP8 linears' 1
        gather = {c.kind: c.nbytes for c in plain.step.collectives[s]}["all_gather"]
        assert {c.kind: c.nbytes for c in fp8.step.collectives[s]}["all_gather"] == gather - fp8_params[s]
        assert gather == 2 * plain.param_counts[s]
    sched = schedules.build("1f1b", 2, 4)
    for r, (a, b) in enumerate(zip(rank_memory(sched, plain), rank_memory(sched, fp8), strict=True)):
        assert a.parameters - b.parameters == 2 * fp8_params[r]  # the 16-bit copy is gone
        assert (a.fp8_weights, a.gradients, a.optimizer_states) == (b.fp8_weights, b.gradients, b.optimizer_states)


@pytest.mark.parametrize("kw,message", [
    ({"zero": 1, "fp8": None}, "--fp8-param-gather keeps the FP8 linears' parameters in FP8: it needs --fp8-format"),
    ({"zero": 0}, "--fp8-param-gather needs the distributed optimizer (--zero 1 or 2), got --zero 0"),
    ({"zero": 3}, "--fp8-param-gather needs the distributed optimizer (--zero 1 or 2), got --zero 3 (Megatron-core "
                  "turns it off under torch FSDP2 with Transformer Engine 2; torchao's float8 gathers under FSDP2: "
                  "--fp8-impl torchao)"),
    ({"zero": 1, "fp8": Fp8Options("hybrid", "tensorwise", "torchao")},
     "--fp8-param-gather with --fp8-impl torchao is FSDP2's float8 all-gather (enable_fsdp_float8_all_gather): it "
     "needs --zero 3, got --zero 1"),
])
def test_refused_where_megatron_does_not_run_it(kw, message):
    with pytest.raises(PipesimError) as err:
        Job(ParallelDims(dp=2), **{"fp8": FP8, **kw}, fp8_param_gather=True)
    assert str(err.value) == message


def test_the_flag_on_the_command_line():
    base = [sys.executable, "-m", "pipesim", "simulate", "1f1b", "--stages", "1", "--microbatches", "2",
            "--model", "gpt", "--hidden", "512", "--layers", "2", "--heads", "8", "--seq", "256", "--batch", "8",
            "--dp", "4", "--dtype", "bfloat16", "--hardware", "dgx-h100", "--fp8-format", "hybrid",
            "--fp8-param-gather", "--json"]
    ok = subprocess.run(base + ["--zero", "1"], capture_output=True, text=True, check=True)
    assert json.loads(ok.stdout)["options"]["fp8_param_gather"] is True
    bad = subprocess.run(base, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "pipesim: error: --fp8-param-gather needs the distributed optimizer (--zero 1 or 2), got --zero 0"]


MOE = replace(LLAMA, moe=MoeConfig(experts=8, top_k=2, expert_ffn=512))
MOE_HW = load_hardware("hgx-b200")
MXFP8 = Fp8Options("e4m3", "mxfp8")


def _moe_costs(gather: bool, fp8: Fp8Options = MXFP8, zero: int = 1):
    job = Job(ParallelDims(pp=2, dp=4, ep=2), zero=zero, fp8=fp8, attention="flash", fp8_param_gather=gather)
    return model_costs(MOE, 2, 4, MOE_HW, job)


def test_a_mixture_of_experts_gathers_its_experts_fp8_parameters_over_their_own_group():
    plain, fp8 = _moe_costs(False), _moe_costs(True)
    opts = plain.job.layer_options(MOE)
    split = split_layers(MOE.layers, 2)
    totals = [stage_fp8_weights(MOE, 1, opts, "B200", StageLayers.uniform(n, n))[0] for n in split]
    experts = [stage_fp8_expert_params(MOE, 1, opts, "B200", StageLayers.uniform(n, n)) for n in split]
    # four local experts (8 over ep 2) per layer, FC1 (gate and up: 2 x 512 out of 1024) and FC2 (512 -> 1024)
    assert experts == [n * 4 * (1024 * 2 * 512 + 512 * 1024) for n in split]
    assert fp8.fp8_param_counts == tuple(totals) and all(0 < e < t for e, t in zip(experts, totals, strict=True))
    for s in range(2):  # each group's all-gather drops a byte for each of its FP8 parameters
        before = {c.group: c.nbytes for c in plain.step.collectives[s] if c.kind == "all_gather"}
        after = {c.group: c.nbytes for c in fp8.step.collectives[s] if c.kind == "all_gather"}
        assert set(before) == {"dp", "edp"}  # edp = dp / ep = 2
        assert after["dp"] == before["dp"] - (totals[s] - experts[s])
        assert after["edp"] == before["edp"] - experts[s]
    sched = schedules.build("1f1b", 2, 4)
    for r, (a, b) in enumerate(zip(rank_memory(sched, plain), rank_memory(sched, fp8), strict=True)):
        assert a.parameters - b.parameters == 2 * totals[r]


def test_torchaos_fsdp2_float8_gather_of_experts_is_refused():
    with pytest.raises(PipesimError, match="--fp8-impl torchao and a mixture of experts is not modelled"):
        _moe_costs(True, Fp8Options("hybrid", "tensorwise", "torchao"), zero=3)
