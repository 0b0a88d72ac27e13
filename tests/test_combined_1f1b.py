"""Megatron-core's combined 1F1B (--overlap-moe-expert-parallel-comm): interleaved 1F1B with one more warmup
forward per rank and every steady-state forward overlapped with the backward after it; what it buys an MoE model
(its all-to-alls hide under the other half's computation) and not a dense one."""

from __future__ import annotations

from dataclasses import replace

import pytest

import schedules
from pipesim.cost.model_costs import model_costs
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.schedule import Kind
from pipesim.job import Job
from pipesim.model.hf_config import load_hf_config
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.simulator import simulate
from schedules.interleaved import virtual_action


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 3), (8, 16, 4)])
def test_order_is_interleaved_with_one_more_warmup_and_each_steady_pair_overlapped(p, m, v):
    """Rank r: w = min(m v, 2 (p - r - 1) + (v - 1) p + 1) forwards (Megatron's num_warmup_microbatches + 1), then
    (F_{w+i}, B_i) pairs in Megatron's virtual-microbatch order, then the remaining backwards."""
    sched = schedules.build("combined-1f1b", p, m, v)
    total = m * v
    pairs = 0
    for r, prog in enumerate(sched.programs):
        w = min(total, 2 * (p - r - 1) + (v - 1) * p + 1)
        expected = [virtual_action(k, p, v, r, True) for k in range(w)]
        for i in range(total - w):
            expected += [virtual_action(w + i, p, v, r, True), virtual_action(i, p, v, r, False)]
            assert (expected[-2], expected[-1]) in sched.overlaps
        expected += [virtual_action(k, p, v, r, False) for k in range(total - w, total)]
        assert list(prog) == expected
        pairs += total - w
    assert len(sched.overlaps) == pairs
    # "to ensure the forward and backward computations are independent in all 1f1b steps": never one microbatch
    assert all(f.kind == Kind.F and b.kind == Kind.B and f.microbatch != b.microbatch for f, b in sched.overlaps)


def test_refused_where_megatron_refuses():
    with pytest.raises(PipesimError, match="needs --virtual >= 2"):
        schedules.build("combined-1f1b", 4, 8, 1)
    with pytest.raises(PipesimError, match="multiple of stages"):
        schedules.build("combined-1f1b", 4, 6, 2)


def test_combined_1f1b_hides_the_all_to_alls_of_a_moe_model_not_of_a_dense_one():
    """Mixtral 8x7B on 64 H100s (tp 2, sp, ep 8, pp 4, v 2): the overlapped pairs cut the exposed all-to-all seconds
    and the step against interleaved 1F1B; on the dense twin (no all-to-all) they buy nothing and the one more warmup
    forward costs a little."""
    hw = load_hardware("dgx-h100").with_nodes(8)
    mixtral = load_hf_config("mixtral-8x7b", seq=4096, batch=256)
    job = Job(ParallelDims(dp=8, tp=2, ep=8), sp=True, zero=1, attention="flash")
    dense_job = replace(job, dims=replace(job.dims, ep=1))
    gain, exposed = {}, {}
    for name, model, j in (("moe", mixtral, job), ("dense", replace(mixtral, moe=None), dense_job)):
        costs = model_costs(model, 8, 16, hw, j)
        plain = simulate(schedules.build("interleaved-1f1b", 4, 16, 2), costs, hw)
        combined = simulate(schedules.build("combined-1f1b", 4, 16, 2), costs, hw)
        gain[name] = plain.step_time / combined.step_time
        exposed[name] = [sum(r.get("ep_all_to_all", 0.0) for r in res.to_dict()["ranks"]) for res in (plain, combined)]
    assert exposed["moe"][1] < 0.6 * exposed["moe"][0] and exposed["dense"] == [0.0, 0.0]
    assert gain["moe"] > 1.05 and 0.97 < gain["dense"] <= 1.0
