"""A MoE layer's host: its launches and waits counted (pipesim.model.host_ops), timed (pipesim.cost.host_issue), and
the simulator's floor at the host's seconds, alone and in an overlapped pair (pipesim.sim.program)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import schedules
from pipesim.comm.comm_options import CommOptions
from pipesim.cost.host_issue import LAUNCH_SECONDS, NO_HOST_ISSUE, SYNC_GAP, SYNC_ROUND_TRIP, stage_host_issue
from pipesim.cost.model_costs import model_costs, uniform_costs
from pipesim.cost.table import CostTable
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Kind
from pipesim.job import Job
from pipesim.model.hf_config import load_hf_config
from pipesim.model.host_ops import HostOps, moe_layer_host_ops
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.plugins import plugins_for
from pipesim.sim.program import compile_programs
from pipesim.sim.simulator import simulate

QWEN3 = load_hf_config("qwen3-235b-a22b", seq=4096, batch=2048)
MS = 1e-3


def _job(dispatcher: str, **kw) -> Job:
    return Job(ParallelDims(dp=8, tp=4, ep=8), sp=True, comm=CommOptions(moe_dispatcher=dispatcher), **kw)


@pytest.mark.parametrize("dispatcher,forward,syncs", [("deepep", 98, (4, 1)), ("alltoall", 96, (1, 0)),
                                                     ("hybridep", 83, (1, 0))])
def test_a_qwen3_layer_launches_a_hand_count(dispatcher, forward, syncs):
    """16 local experts (128 / ep 8): forward 20 attention + 22 router + the dispatcher (23 DeepEP, 21 alltoall, 8
    Hybrid-EP: Megatron's float32 cast of the probabilities, Hybrid-EP's all-gather, metadata and permute-preprocessing
    kernels, dispatch, permute, unpermute, combine) + 2 grouped-GEMM launches per expert + 1 activation; backward 15
    router + 45 attention and dispatcher + 1 activation + 4 per expert = 125, of which W: 2 per expert + 5 = 37."""
    ops = moe_layer_host_ops(QWEN3, _job(dispatcher).layer_options(QWEN3))
    assert ops == HostOps(forward, 125 - 37, 37, *syncs)


def test_recomputation_repeats_the_forward_launches_and_waits_in_the_backward():
    opts = _job("deepep", recompute="selective", recompute_modules=("moe",)).layer_options(QWEN3)
    assert moe_layer_host_ops(QWEN3, opts) == HostOps(98, 88 + 78, 37, 4, 1 + 4)  # 78: the MoE block's forward
    full = moe_layer_host_ops(QWEN3, _job("deepep", recompute="full").layer_options(QWEN3))
    assert full == HostOps(98, 88 + 98, 37, 4, 5)
    act = moe_layer_host_ops(QWEN3, _job("deepep", recompute="selective", recompute_modules=("moe_act",))
                             .layer_options(QWEN3))
    assert act == HostOps(98, 89, 37, 4, 1)


def test_a_stage_issues_its_moe_layers_and_a_dense_stage_nothing():
    opts = _job("deepep").layer_options(QWEN3)
    got = stage_host_issue(QWEN3, opts, 3)
    assert got.issue == pytest.approx((3 * (98 * LAUNCH_SECONDS + 4 * SYNC_ROUND_TRIP),
                                       3 * (88 * LAUNCH_SECONDS + SYNC_ROUND_TRIP), 3 * 37 * LAUNCH_SECONDS), rel=1e-12)
    assert got.waits == pytest.approx((12 * SYNC_GAP, 3 * SYNC_GAP, 0.0), rel=1e-12)
    assert stage_host_issue(QWEN3, opts, 0) is NO_HOST_ISSUE


def test_a_grace_host_launches_at_its_measured_ratio_to_an_x86_one():
    """TE issue #2053: torch.nn.Linear's forward costs the host 37.08 us on a GB200 against 13.48 on an H100 DGX's
    Xeon; the GB200 and GB300 trays' `host_launch` is the x86 figure times that ratio, and a stage's issue and
    waits take it in place of LAUNCH_SECONDS."""
    gb200, gb300 = load_hardware("gb200-nvl72"), load_hardware("gb300-nvl72")
    assert gb200.host_launch == gb300.host_launch == round(LAUNCH_SECONDS * 37.08 / 13.48, 7) == 19.3e-6
    assert load_hardware("dgx-h100").host_launch is None and load_hardware("hgx-b300").host_launch is None
    opts = _job("hybridep").layer_options(QWEN3)
    grace = stage_host_issue(QWEN3, opts, 2, gb200.host_launch)
    assert grace.issue == pytest.approx((2 * (83 * 19.3e-6 + SYNC_ROUND_TRIP), 2 * 88 * 19.3e-6,
                                         2 * 37 * 19.3e-6), rel=1e-12)
    assert grace.waits == (2 * (SYNC_ROUND_TRIP + 19.3e-6), 0.0, 0.0)
    assert stage_host_issue(QWEN3, opts, 2, None) == stage_host_issue(QWEN3, opts, 2)


def test_the_cost_table_carries_the_issue_and_the_first_stage_folds_i_into_w():
    """Qwen3 in 4 stages of 24 (23 on the last): each stage's host seconds are its MoE layers'; the first stage's
    backward runs whole in W, so its I's host seconds join W's; a dense model's are zero."""
    hw = load_hardware("dgx-h100").with_nodes(32)
    job = replace(_job("deepep"), dims=ParallelDims(pp=4, dp=8, tp=4, ep=8))
    costs = model_costs(QWEN3, 4, 64, hw, job)
    opts = job.layer_options(QWEN3)
    for s, c in enumerate(costs.table.stages):
        f, i, w = stage_host_issue(QWEN3, opts, QWEN3.moe.moe_layers(sum(costs.layers_per_stage[:s]),
                                                                     costs.layers_per_stage[s])).issue
        assert c.host_seconds == ((f, 0.0, i + w) if s == 0 else (f, i, w))
    dense = model_costs(replace(QWEN3, moe=None), 4, 64, hw, Job(ParallelDims(pp=4, dp=8, tp=4), sp=True))
    assert all(c.host_seconds == (0.0, 0.0, 0.0) for c in dense.table.stages)


def _ops(sched, table: CostTable):
    base = uniform_costs(sched.num_stages, {"F": MS, "I": MS, "W": MS})
    costs = replace(base, table=table)
    return compile_programs(sched, plugins_for(table, None, False).compute, None, False, base.job, costs)


def test_an_action_lasts_as_long_as_its_host_takes_to_launch_it():
    """F 1 ms, I = W = 1 ms on the GPU; the host takes 3 ms to launch F and 0.5 + 0.5 ms for the backward: every F
    lasts 3 ms, every B keeps its 2 ms; in the simulated 1F1B the F bars are 3 ms long."""
    sched = add_p2p(schedules.build("1f1b", 2, 4))
    table = CostTable(tuple(replace(c, host_seconds=(3 * MS, 0.5 * MS, 0.5 * MS))
                            for c in CostTable.uniform(2, MS, MS, MS).stages))
    ops = _ops(sched, table)
    for rank, prog in enumerate(sched.programs):
        for a, op in zip(prog, ops[rank], strict=True):
            if a.kind == Kind.F:
                assert op.seconds == pytest.approx(3 * MS, rel=1e-12)
            elif a.kind == Kind.B:
                assert op.seconds == pytest.approx(2 * MS, rel=1e-12)
        # one record per (stage, kind), floored once: every microbatch's forward shares it
        assert len({id(op) for a, op in zip(prog, ops[rank], strict=True) if a.kind == Kind.F}) == 1
    base = uniform_costs(2, {"F": MS, "I": MS, "W": MS})
    result = simulate(schedules.build("1f1b", 2, 4), replace(base, table=table), None, comm=False)
    bars = [e.end - e.start for e in result.timeline().events if e.stream == "compute" and e.kind == "F"]
    assert len(bars) == 8 and all(b == pytest.approx(3 * MS, rel=1e-12) for b in bars)


def test_an_overlapped_pair_lasts_as_long_as_its_host_takes_to_launch_both_halves():
    """Combined 1F1B's pairs hide one half under the other on the GPU (max(F, B) = 2 ms with full overlap), but one
    host launches both: F's 1.5 ms then B's 1.5 ms, so each pair lasts 3 ms, the excess on its backward half; an
    unpaired F (warmup) lasts its host's 1.5 ms."""
    sched = add_p2p(schedules.build("combined-1f1b", 2, 4, 2))
    uniform = CostTable.uniform(sched.num_stages, MS, MS, MS)
    table = replace(uniform, stages=tuple(replace(c, host_seconds=(1.5 * MS, 0.75 * MS, 0.75 * MS))
                                          for c in uniform.stages), overlap_share=0.0)
    ops = _ops(sched, table)
    pairs = singles = 0
    for rank, prog in enumerate(sched.programs):
        i = 0
        while i < len(prog):
            if i + 1 < len(prog) and (prog[i], prog[i + 1]) in sched.overlaps:
                fwd, bwd = ops[rank][i], ops[rank][i + 1]
                assert fwd.seconds == pytest.approx(0.0, abs=1e-15)  # the forward hides under the backward
                assert fwd.seconds + bwd.seconds == pytest.approx(3 * MS, rel=1e-12)
                pairs, i = pairs + 1, i + 2
                continue
            if prog[i].kind == Kind.F:
                assert ops[rank][i].seconds == pytest.approx(1.5 * MS, rel=1e-12)
                singles += 1
            i += 1
    assert pairs and singles


def test_a_host_bound_moe_stage_is_timed_by_its_host_through_the_whole_path():
    """Qwen3 at 256 tokens per microbatch (tp 4, ep 8, DeepEP, micro-batch 1): each layer's GPU work, its all-to-alls
    and tp collectives included, is shorter than its host's 98 launches and 4 waits, so every forward, from its
    compute's start to its last collective's end, lasts its host's seconds exactly; at 4,096 tokens the GPU bounds
    it."""
    hw = load_hardware("dgx-h100").with_nodes(32)
    job = replace(_job("deepep"), dims=ParallelDims(pp=4, dp=8, tp=4, ep=8))
    for seq, host_bound in ((256, True), (4096, False)):
        model = load_hf_config("qwen3-235b-a22b", seq=seq, batch=512)
        costs = model_costs(model, 4, 64, hw, job)
        events = simulate(schedules.build("1f1b", 4, 64), costs, hw).timeline().events
        host = costs.table.stages[1].host(Kind.F)
        for mb in range(64):
            backward = next(e.start for e in events if e.rank == 1 and e.stage == 1 and e.microbatch == mb
                            and e.kind == "B")
            mine = [e for e in events if e.rank == 1 and e.stage == 1 and e.microbatch == mb
                    and e.kind in ("F", "ep", "tp") and e.start < backward]
            span = max(e.end for e in mine) - min(e.start for e in mine)
            if host_bound:
                assert span == pytest.approx(host, rel=1e-9)
            else:
                assert span > 2 * host


def test_the_planners_estimate_sees_the_host_floor_and_a_dense_stage_is_unchanged():
    """StageCosts.microbatch_seconds (the planner's ordering estimate): each of F and B at least its host's seconds;
    without host seconds exactly F + I + W, as before."""
    plain = CostTable.uniform(1, MS, MS, MS).stages[0]
    assert plain.microbatch_seconds == plain.forward + plain.backward_input + plain.backward_weight
    floored = replace(plain, host_seconds=(3 * MS, 0.5 * MS, 0.5 * MS))
    assert floored.microbatch_seconds == pytest.approx(3 * MS + 2 * MS, rel=1e-12)
    assert floored.host(Kind.B) == pytest.approx(MS, rel=1e-12) and floored.host(Kind.SEND_F) == 0.0
