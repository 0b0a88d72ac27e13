"""The step's end: ZeRO's collectives, the optimizer and ring attention, in closed form and exact simulated times.

The toy machine has dyadic figures (link 2^30 bytes/s, no latency, HBM 2^30 bytes/s), so every time
below is an exact float: a reduce_scatter or all_gather of S bytes over 2 ranks takes S / 2^31 s.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import schedules
from pipesim.comm.collective_costs import group_collective_time
from pipesim.cost.device_profiles import profile_of
from pipesim.cost.model_costs import ParallelCosts, model_costs
from pipesim.cost.step_costs import (
    RingExchange,
    StepCollective,
    StepCosts,
    exposed_seconds,
    optimizer_bytes_and_seconds,
    optimizer_seconds,
    ring_exchanges,
    stage_step_collectives,
    step_costs,
)
from pipesim.cost.table import CostTable
from pipesim.device.kernels import memory_bound_time
from pipesim.errors import PipesimError
from pipesim.hardware.machine import DeviceSpec, Hardware, LinkClass
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.memory import PRECISIONS, optimizer_step_bytes
from pipesim.model.optimizer_step import optimizer_passes, pass_bytes
from pipesim.model.options import LayerOptions
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.simulator import simulate

GB = 2**30  # bytes


def toy(devices: int = 4) -> Hardware:
    device = DeviceSpec("toy", {"float32": 1e12}, float(GB), 2**36, 1.0)  # HBM 2^30 bytes/s
    return Hardware("toy", device, devices, 1, LinkClass("toylink", float(GB), float(GB), 0.0, False), None)


def costs(stages: int, f: float, b: float, *, dp: int = 1, step: StepCosts | None = None, cp: int = 1,
          cp_exchanges: dict | None = None) -> ParallelCosts:
    return ParallelCosts(CostTable.uniform(stages, f, b / 2, b / 2), Job(ParallelDims(dp=dp, cp=cp)),
                         tp_collectives={}, dp_grad_bytes=(0,) * stages, layers_per_stage=(0,) * stages, step=step,
                         cp_exchanges=cp_exchanges or {})


def zero1_step(stages: int, grads: int, params: int, opt: tuple[float, ...]) -> StepCosts:
    per_stage = (StepCollective("reduce_scatter", grads, "grads"), StepCollective("all_gather", params, "params"))
    return StepCosts((per_stage,) * stages, opt, (0,) * stages, zero=1)


# -- what each ZeRO stage adds (closed forms from the model layer) ---------------------------------------------


def test_step_collectives_per_zero_stage():
    p = 1000
    assert stage_step_collectives(p, dp=1, zero=1) == ()
    assert stage_step_collectives(p, dp=4, zero=0) == (StepCollective("all_reduce", 2 * p, "grads"),)
    one = (StepCollective("reduce_scatter", 2 * p, "grads"), StepCollective("all_gather", 2 * p, "params"))
    assert stage_step_collectives(p, dp=4, zero=1) == one
    # ZeRO 2 keeps only its gradient shard (the memory model's 2/dp bytes): a reduce_scatter per microbatch
    assert stage_step_collectives(p, dp=4, zero=2) == (StepCollective("reduce_scatter", 2 * p, "microbatch"),
                                                       StepCollective("all_gather", 2 * p, "params"))
    # FSDP2 with PP: a chunk is gathered once per step, before its first forward, and stays gathered
    assert stage_step_collectives(p, dp=4, zero=3) == (
        StepCollective("all_gather", 2 * p, "forward"), StepCollective("reduce_scatter", 2 * p, "grads"))
    # megatron precision: float32 main gradients are reduced (4 bytes), 16-bit parameters gathered (2)
    assert stage_step_collectives(p, dp=4, zero=1, precision="megatron") == (
        StepCollective("reduce_scatter", 4 * p, "grads"), StepCollective("all_gather", 2 * p, "params"))
    with pytest.raises(PipesimError):
        StepCollective("all_gather", 1, "later")
    with pytest.raises(PipesimError):
        stage_step_collectives(p, dp=2, zero=1, precision="fp8")


def test_optimizer_is_its_bytes_at_hbm_bandwidth_on_the_owned_shard():
    hw = toy()
    # mixed precision Adam: 28 bytes per owned parameter (ZeRO 0 owns all, ZeRO 1-3 ceil(P / dp))
    assert optimizer_seconds(2**20, dp=4, zero=0, hw=hw) == 28 * 2**20 / GB
    assert optimizer_seconds(2**20, dp=4, zero=1, hw=hw) == 28 * 2**18 / GB
    assert optimizer_seconds(2**20 + 1, dp=4, zero=3, hw=hw) == 28 * (2**18 + 1) / GB
    sc = step_costs([2**20, 2**21], Job(ParallelDims(dp=2), zero=1), hw=hw, precision=PRECISIONS["fp32"])
    assert sc.optimizer_bytes == tuple(optimizer_step_bytes(p, dp=2, zero=1, precision=PRECISIONS["fp32"])
                                       for p in (2**20, 2**21))
    assert sc.optimizer_seconds == (28 * 2**19 / GB, 28 * 2**20 / GB)
    assert sc.collectives[1] == (StepCollective("reduce_scatter", 4 * 2**21, "grads"),
                                 StepCollective("all_gather", 4 * 2**21, "params"))


def test_megatron_optimizer_passes_in_closed_form():
    """Megatron's mixed-precision step, bytes per parameter pass by pass (megatron/optimizer/optimizer.py):
    fp16 (16-bit grads, loss scale) 6 + 8 + 4 + 28 + 6 + 2 = 54; bf16 with float32 main grads 4 + 28 + 6 + 4 = 42;
    float32 training one Adam pass of 28, as the roofline path's optimizer_step_bytes."""
    fp16 = optimizer_passes(PRECISIONS["mixed"], loss_scaling=True)
    assert [(p.name, p.read, p.write, p.owned) for p in fp16] == [
        ("copy gradients to main gradients", 2, 4, True), ("unscale and check for inf/nan", 4, 4, True),
        ("gradient norm", 4, 0, True), ("Adam", 16, 12, True),
        ("copy main parameters to model parameters", 4, 2, True), ("zero the gradient buffer", 0, 2, False)]
    bf16 = optimizer_passes(PRECISIONS["megatron"], loss_scaling=False)
    assert [p.name for p in bf16] == ["gradient norm", "Adam", "copy main parameters to model parameters",
                                      "zero the gradient buffer"]
    assert sum(p.bytes_per_param for p in bf16) == 42
    fp32 = optimizer_passes(PRECISIONS["fp32"], loss_scaling=False)
    assert [(p.name, p.bytes_per_param) for p in fp32] == [("Adam", 28)]
    assert pass_bytes(fp32, 1000, dp=4, zero=1) == (optimizer_step_bytes(1000, dp=4, zero=1,
                                                                         precision=PRECISIONS["fp32"]),)
    # ZeRO 1 updates ceil(P / dp) but zeroes the whole gradient buffer; ZeRO 2 shards the buffer too
    assert pass_bytes(fp16, 1001, dp=4, zero=1) == (6 * 251, 8 * 251, 4 * 251, 28 * 251, 6 * 251, 2 * 1001)
    assert pass_bytes(fp16, 1001, dp=4, zero=2)[-1] == 2 * 251
    assert pass_bytes(fp16, 1001, dp=4, zero=0) == tuple(p.bytes_per_param * 1001 for p in fp16)
    with pytest.raises(PipesimError):
        pass_bytes(fp16, 1000, dp=4, zero=4)


def test_optimizer_on_a_device_family_is_its_passes_as_memory_bound_kernels():
    hw = load_hardware("dgx-a100")
    profile = profile_of(hw.device.family, hw.device.kernels)
    params = 2_750_000_000  # one tp rank of a 22B model at tp 8
    nbytes, seconds = optimizer_bytes_and_seconds(params, dp=1, zero=0, hw=hw, precision="mixed", loss_scaling=True)
    assert nbytes == 54 * params
    each = [p.bytes_per_param * params for p in optimizer_passes(PRECISIONS["mixed"], loss_scaling=True)]
    assert seconds == sum(memory_bound_time(b, profile).seconds for b in each)
    assert seconds == pytest.approx(54 * params / (hw.device.hbm_bandwidth * profile.memory_bound_efficiency)
                                    + 6 * profile.kernel_overhead)
    sc = step_costs([params, params // 2], Job(), hw=hw, precision="mixed", loss_scaling=True)
    assert sc.optimizer_bytes == (54 * params, 54 * (params // 2))
    assert sc.optimizer_seconds[0] == seconds
    # bf16 (no loss scale, float32 main grads): 42 bytes per parameter
    assert optimizer_bytes_and_seconds(params, dp=1, zero=0, hw=hw, precision="megatron")[0] == 42 * params
    # without a device family (the model before issue 15): one Adam pass at the raw HBM bandwidth
    plain = replace(hw, device=replace(hw.device, family=""))
    assert optimizer_bytes_and_seconds(params, dp=1, zero=0, hw=plain, precision="mixed", loss_scaling=True) == (
        28 * params, 28 * params / hw.device.hbm_bandwidth)


# -- where they fall in the simulated step -------------------------------------------------------------------


def test_zero1_two_stage_1f1b_exact_step_end():
    """Pipeline (F = B = 1 s, free messages): rank 1's last B ends at 5, rank 0's at 6. Each reduce_scatter
    (2^30 bytes over 2 ranks: 0.5 s) starts there; the optimizer starts when it has ended, the all_gather
    (2^29 bytes: 0.25 s) follows the optimizer."""
    hw = toy()
    sched = schedules.build("1f1b", 2, 2)
    result = simulate(sched, costs(2, 1.0, 1.0, dp=2, step=zero1_step(2, GB, GB // 2, (0.25, 0.5))), hw)
    rows = [(c.rank, c.kind, c.phase, c.start, c.end) for c in result.collectives]
    assert rows == [(1, "reduce_scatter", "grads", 5.0, 5.5), (0, "reduce_scatter", "grads", 6.0, 6.5),
                    (0, "all_gather", "params", 6.75, 7.0), (1, "all_gather", "params", 6.0, 6.25)]
    r0, r1 = result.step_ends
    assert (r0.finish, r0.optimizer_start, r0.optimizer_end, r0.step_end) == (6.0, 6.5, 6.75, 7.0)
    assert (r1.finish, r1.optimizer_start, r1.optimizer_end, r1.step_end) == (5.0, 5.5, 6.0, 6.25)
    assert result.makespan == 6.5  # the pipeline and its gradient reduction, as before
    assert result.step_time == 7.0
    d = result.to_dict()
    assert d["step_time"] == 7.0 and d["makespan"] == 6.5
    assert [(r["optimizer"], r["dp_exposed"], r["step_end"]) for r in d["ranks"]] == [(0.25, 0.75, 7.0),
                                                                                   (0.5, 0.75, 6.25)]
    assert [c["phase"] for c in d["collectives"]] == ["grads", "grads", "params", "params"]
    assert result.timeline().meta["step_time"] == 7.0
    path = result.critical_path()
    assert path[-1]["end"] == result.makespan


def test_zero2_reduces_after_every_microbatch_and_the_optimizer_waits_for_the_last():
    """The same pipeline as above with ZeRO 2: a reduce_scatter (0.5 s) after each B, so rank 1 reduces at
    3 and 5, rank 0 at 4 and 6; each optimizer starts when its last one has ended."""
    hw = toy()
    sched = schedules.build("1f1b", 2, 2)
    per_stage = (StepCollective("reduce_scatter", GB, "microbatch"), StepCollective("all_gather", GB // 2, "params"))
    step = StepCosts((per_stage,) * 2, (0.25, 0.5), (0, 0), zero=2)
    result = simulate(sched, costs(2, 1.0, 1.0, dp=2, step=step), hw)
    rows = [(c.rank, c.kind, c.phase, c.start, c.end) for c in result.collectives]
    assert rows == [(1, "reduce_scatter", "microbatch", 3.0, 3.5), (0, "reduce_scatter", "microbatch", 4.0, 4.5),
                    (1, "reduce_scatter", "microbatch", 5.0, 5.5), (0, "reduce_scatter", "microbatch", 6.0, 6.5),
                    (0, "all_gather", "params", 6.75, 7.0), (1, "all_gather", "params", 6.0, 6.25)]
    r0, r1 = result.step_ends
    assert (r0.optimizer_start, r0.step_end, r1.optimizer_start, r1.step_end) == (6.5, 7.0, 5.5, 6.25)
    assert result.step_time == 7.0
    zero2 = model_costs(ModelConfig(hidden=256, layers=4, batch=16), 2, 4, load_hardware("2x-dgx-h100"),
                        Job(ParallelDims(dp=2), zero=2))
    assert [c.phase for c in zero2.step.collectives[0]] == ["microbatch", "params"]
    kinds = [c.phase for c in simulate(schedules.build("1f1b", 2, 4), zero2, load_hardware("2x-dgx-h100")).collectives]
    assert kinds.count("microbatch") == 2 * 4  # 2 stages x 4 microbatches


def test_optimizer_waits_for_the_reduction_only_when_it_is_not_done():
    """A short reduce_scatter (2^26 bytes: 1/32 s) starts at the stage's last B's end, which is its rank's
    program's end, so the optimizer starts 1/32 s later; with no data parallelism it starts at the program's end."""
    hw = toy()
    sched = schedules.build("1f1b", 2, 2)
    short = simulate(sched, costs(2, 1.0, 1.0, dp=2, step=zero1_step(2, 2**26, 2**26, (0.25, 0.25))), hw)
    assert [(e.finish, e.optimizer_start) for e in short.step_ends] == [(6.0, 6.0 + 1 / 32), (5.0, 5.0 + 1 / 32)]
    alone = StepCosts(((), ()), (0.25, 0.5), (0, 0))
    result = simulate(sched, costs(2, 1.0, 1.0, step=alone), hw)
    assert result.collectives == []
    assert [(e.optimizer_start, e.step_end) for e in result.step_ends] == [(6.0, 6.25), (5.0, 5.5)]
    assert result.makespan == 6.0 and result.step_time == 6.25
    assert [r["dp_exposed"] for r in result.to_dict()["ranks"]] == [0.0, 0.0]


def test_zero3_prefetched_gathers_gate_the_first_forward_and_backward():
    """One stage, m = 2, F = 0.25 s, B = 1 s; each all_gather (2^30 bytes over 2 ranks) takes 0.5 s and both
    are issued at the step's start. F0 waits for the first (0.5 s), B0 for the second (ready at 1.0, F0
    ended at 0.75: 0.25 s more); the gradients' reduce_scatter follows the last B."""
    hw = toy()
    sched = schedules.build("1f1b", 1, 2)
    z3 = (StepCollective("all_gather", GB, "forward"), StepCollective("all_gather", GB, "backward"),
          StepCollective("reduce_scatter", GB, "grads"))
    result = simulate(sched, costs(1, 0.25, 1.0, dp=2, step=StepCosts((z3,), (0.125,), (0,), zero=3)), hw)
    computes = [(str(a), s, e) for a, s, e in zip(result.schedule.programs[0], result.starts[0], result.ends[0])]
    assert [(s, e) for _, s, e in computes] == [(0.5, 0.75), (1.0, 2.0), (2.0, 2.25), (2.25, 3.25)]
    assert [(c.kind, c.phase, c.start, c.end) for c in result.collectives] == [
        ("all_gather", "forward", 0.0, 0.5), ("all_gather", "backward", 0.5, 1.0),
        ("reduce_scatter", "grads", 3.25, 3.75)]
    (end,) = result.step_ends
    assert (end.gate_wait, end.optimizer_start, end.step_end) == (0.75, 3.75, 3.875)
    assert end.exposed == 0.75 + 0.5
    assert result.step_time == 3.875 and result.makespan == 3.75
    assert result.to_dict()["ranks"][0]["zero3_gather_wait"] == 0.75
    path = result.critical_path()  # B0 waited for the second gather, which queued behind the first
    assert [(e["name"], e["start"], e["end"]) for e in path[:4]] == [
        ("all_gather(stage 0)", 0.0, 0.5), ("all_gather(stage 0)", 0.5, 1.0), ("0B0", 1.0, 2.0), ("0F1", 2.0, 2.25)]
    assert path[-1]["end"] == result.makespan


def test_zero3_gathers_are_hidden_when_the_stream_is_ahead():
    """Interleaved: the second chunk's gathers are prefetched while the first chunk computes."""
    hw = toy(8)
    sched = schedules.build("interleaved-1f1b", 2, 4, 2)
    z3 = (StepCollective("all_gather", 2**26, "forward"), StepCollective("all_gather", 2**26, "backward"),
          StepCollective("reduce_scatter", 2**26, "grads"))
    result = simulate(sched, costs(4, 1.0, 2.0, dp=2, step=StepCosts((z3,) * 4, (0.0,) * 4, (0,) * 4, zero=3)), hw)
    # only the very first forward on each rank waits (for its own gather: 2^26 / 2^31 = 1/32 s)
    assert [e.gate_wait for e in result.step_ends] == [1 / 32, 0.0]
    # issued in the order the program needs them: forwards by chunk, backwards from the last chunk down
    order = [[(c.phase, c.stage) for c in result.collectives if c.rank == r and c.phase != "grads"] for r in (0, 1)]
    assert order == [[("forward", 0), ("forward", 2), ("backward", 2), ("backward", 0)],
                     [("forward", 1), ("forward", 3), ("backward", 3), ("backward", 1)]]


def test_no_step_costs_is_todays_step():
    """Without ParallelCosts.step: today's DDP all_reduce, no optimizer, no new JSON keys."""
    hw = toy()
    sched = schedules.build("1f1b", 2, 2)
    base = ParallelCosts(CostTable.uniform(2, 1.0, 0.5, 0.5), Job(ParallelDims(dp=2)), tp_collectives={},
                         dp_grad_bytes=(GB, GB), layers_per_stage=(0, 0))
    result = simulate(sched, base, hw)
    assert [(c.kind, c.start, c.end) for c in result.collectives] == [("all_reduce", 5.0, 6.0),
                                                                       ("all_reduce", 6.0, 7.0)]
    assert result.step_ends == [] and result.step_time == result.makespan == 7.0
    d = result.to_dict()
    assert "step_time" not in d and "phase" not in d["collectives"][0]
    assert not {"optimizer", "dp_exposed", "cp_exposed"} & set(d["ranks"][0])


@pytest.mark.parametrize("hardware,dp", [("local-cpu", 1), ("2x-dgx-h100", 2)])
def test_the_step_end_leaves_the_pipeline_untouched(hardware, dp):
    """Model costs with and without their step costs: the same actions at the same times, bit for bit
    (the CPU preset included); the optimizer only adds its tail after the pipeline."""
    hw = load_hardware(hardware)
    sched = schedules.build("1f1b", 2, 4)
    model = ModelConfig(hidden=256, layers=4, batch=16)
    if hw.host is not None:  # a calibrated CPU host predicts the pipeline span alone, unless ZeRO is asked for
        assert model_costs(model, 2, 4, hw, Job(ParallelDims(dp=dp))).step is None
    with_step = model_costs(model, 2, 4, hw, Job(ParallelDims(dp=dp), zero=1 if hw.host is not None else 0))
    assert with_step.step is not None
    a, b = simulate(sched, with_step, hw), simulate(sched, replace(with_step, step=None), hw)
    assert (a.starts, a.ends, a.makespan) == (b.starts, b.ends, b.makespan)
    assert [(c.start, c.end) for c in a.collectives if c.phase == "grads"] == [(c.start, c.end) for c in b.collectives]
    assert a.step_time == max(e.step_end for e in a.step_ends) > a.makespan
    assert all(e.optimizer > 0 for e in a.step_ends)


def test_same_step_same_json_bit_for_bit():
    hw = toy(8)
    sched = schedules.build("interleaved-1f1b", 2, 4, 2)
    c = costs(4, 1.0, 2.0, dp=2, step=step_costs([3 * 2**20] * 4, Job(ParallelDims(dp=2), zero=3), hw=hw))
    texts = {json.dumps(simulate(sched, c, hw).to_dict()) for _ in range(2)}
    assert len(texts) == 1


# -- context parallelism: ring attention inside the compute -----------------------------------------------------


def test_ring_exchanges_from_the_model_layer():
    model = ModelConfig(kind="gpt", hidden=256, heads=8, seq=512, layers=4, batch=8)
    opts = LayerOptions(cp=4, attention="flash")
    kv = 2 * (512 // 4) * 2 * 256 * 4  # 2 x (s / cp) x b x h_kv x 4 bytes (float32), b = 2
    x = ring_exchanges(model, 2, opts, layers=3, attention_forward=0.4, attention_backward=0.8)
    assert x == {"F": (RingExchange(kv, 3 * 3, 0.1),),
                 "I": (RingExchange(2 * kv, 3 * 3, 0.2), RingExchange(kv, 3, 0.0))}
    full = ring_exchanges(model, 2, LayerOptions(cp=4, attention="flash", recompute="full"), layers=1,
                          attention_forward=0.4, attention_backward=0.8)
    assert full["I"][0] == RingExchange(kv, 3, 0.1)  # the re-run forward's hops hide behind forward blocks
    assert ring_exchanges(model, 2, LayerOptions(), layers=3, attention_forward=1.0, attention_backward=1.0) == {}
    assert exposed_seconds(x["I"], lambda n: n / 2**20) == 9 * (2 * kv / 2**20 - 0.2) + 3 * kv / 2**20


def test_cp_exposed_hops_lengthen_the_compute():
    """cp = 2: one hop of 2^30 bytes takes 1 s; 3 hops each hiding behind 0.25 s of attention expose 2.25 s in F."""
    hw = toy()
    sched = schedules.build("gpipe", 1, 1)
    exchanges = {(0, "F"): (RingExchange(GB, 3, 0.25),), (0, "B"): (RingExchange(GB // 2, 2, 1.0),)}
    result = simulate(sched, costs(1, 1.0, 1.0, cp=2, cp_exchanges=exchanges), hw)
    assert group_collective_time(hw, "send_recv", [0, 1], GB) == 1.0
    assert result.makespan == (1.0 + 2.25) + 1.0  # the backward's half-second hops hide entirely
    assert result.to_dict()["ranks"][0]["cp_exposed"] == 2.25
    with pytest.raises(PipesimError, match="cp 2"):
        simulate(schedules.build("gpipe", 3, 1), costs(3, 1.0, 1.0, cp=2, cp_exchanges=exchanges), hw)
