"""Delayed FP8 scaling's amax all-reduce (pipesim.cost.fp8_amax): once per forward and per backward of a stage's FP8
layers, over every rank of the stage, blocking; none under the other recipes."""

from __future__ import annotations

from dataclasses import replace

from pipesim.comm.collective_algos import collective_seconds
from pipesim.comm.tp_collective import TpCollective
from pipesim.cost.fp8_amax import amax_reductions
from pipesim.cost.model_costs import model_costs
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.schedule import Action, Kind
from pipesim.job import Job
from pipesim.model.fp8 import Fp8Options
from pipesim.model.hf_config import load_hf_config
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.program import _tp_time

DELAYED = Fp8Options(format="hybrid", recipe="delayed")


def test_one_all_reduce_per_forward_and_backward_of_the_stage():
    """4 bytes per amax: 3 per GEMM forward, 2 backward, four GEMMs a layer; the first stage's backward is its W."""
    f, b = (TpCollective("all_reduce", 4 * n * 4 * 5, axis="tp_dp_cp") for n in (3, 2))
    assert amax_reductions(DELAYED, 5, first_stage=False) == {"F": (f,), "I": (b,), "B": (b,)}
    assert amax_reductions(DELAYED, 5, first_stage=True) == {"F": (f,), "W": (b,), "B": (b,)}
    for other in ("tensorwise", "blockwise", "mxfp8"):
        assert amax_reductions(replace(DELAYED, recipe=other), 5, first_stage=False) == {}
    assert amax_reductions(None, 5, first_stage=False) == amax_reductions(DELAYED, 0, first_stage=False) == {}


def test_the_stage_group_is_every_rank_of_the_pipeline_stage():
    """Megatron-core's amax reduction group with context parallelism: tp x dp x cp, tp innermost."""
    par = ParallelDims(pp=2, dp=2, cp=2, tp=2)
    assert par.group("tp_dp_cp", 0) == list(range(8)) and par.group("tp_dp_cp", 13) == list(range(8, 16))
    assert sorted(map(tuple, par.groups("tp_dp_cp"))) == [tuple(range(8)), tuple(range(8, 16))]


def test_the_simulator_exposes_it_whole_even_without_tp():
    """At tp 1 and dp 4 a delayed-scaling stage's F carries one blocking all-reduce over its 4 ranks, of its FP8
    layers' amaxes; tensorwise scaling's none (no tp, nothing to gather)."""
    model = load_hf_config("llama3-8b", seq=2048, batch=32)
    model = replace(model, layers=4)
    hw = load_hardware("dgx-h100")
    par = ParallelDims(pp=2, dp=4)
    job = Job(attention="flash", dims=par, fp8=DELAYED)
    costs = model_costs(model, 2, 4, hw, job)
    assert costs.tp_collectives[(1, "F")] == (TpCollective("all_reduce", 4 * 3 * 4 * 2, axis="tp_dp_cp"),)
    assert costs.tp_collectives[(0, "W")] == (TpCollective("all_reduce", 4 * 2 * 4 * 2, axis="tp_dp_cp"),)
    seconds = _tp_time(1, Action(1, Kind.F, 0), hw, True, par, costs.tp_collectives)
    assert seconds == collective_seconds(hw, "all_reduce", par.group("tp_dp_cp", par.rank(pp=1)), 96) > 0
    tensorwise = model_costs(model, 2, 4, hw, replace(job, fp8=replace(DELAYED, recipe="tensorwise")))
    assert tensorwise.tp_collectives == {}
