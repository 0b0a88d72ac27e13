"""v-half and v-min (Qi et al. 2024): the paper's building blocks, its stated memory exactly, measured bubbles."""

from __future__ import annotations

import pytest

import schedules
from pipesim.cost.table import CostTable
from pipesim.ir.graph import critical_path
from pipesim.ir.inflight import inflight_by_rank
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule_check import fifo_mismatches, validate
from pipesim.sim.simulator import simulate
from schedules.v_memory import PERIOD, block_slots, v_half_offsets, v_min_offsets

UNIT = lambda a: 1 if a.is_compute else 0  # noqa: E731  every chunk action one unit (t_F = t_I = t_W)

# Paper (and the authors' playground table): peak activation memory in microbatches of one 1F1B stage, i.e.
# two chunk activations each: 1F1B p, V-Min (p + 4) // 3, V-Half (p + 2) // 2.
PAPER_CHUNKS = {"v-min": lambda p: 2 * ((p + 4) // 3), "v-half": lambda p: 2 * ((p + 2) // 2)}
# v-half's measured makespan - 6m under unit costs, constant for every m >= 2p (p = 2..10, m up to 4p checked)
V_HALF_EXTRA = {1: 0, 2: 1, 3: 5, 4: 6, 5: 12, 6: 11, 7: 17, 8: 17, 9: 24, 10: 24}


@pytest.mark.parametrize("offsets", [v_min_offsets, v_half_offsets])
@pytest.mark.parametrize("p", range(1, 17))
def test_block_offsets_do_not_collide_when_repeated_every_six_slots(offsets, p):
    """The paper's padding (2 slots for V-Min when 3 | p, 3 for V-Half when p is even) keeps a rank's four
    actions on distinct slots modulo 6, so the block repeats every microbatch; the other two slots are W's."""
    for block in offsets(p):
        assert len({t % PERIOD for t in block}) == 4


@pytest.mark.parametrize("name, offsets", [("v-min", v_min_offsets), ("v-half", v_half_offsets)])
@pytest.mark.parametrize("p", [3, 4, 5, 6])
def test_steady_state_is_the_building_block_repeated(name, offsets, p):
    """A microbatch in the middle of a long run keeps the block's slots shifted by 6 per microbatch."""
    m = 6 * p
    mid = m // 2
    for r, slots in enumerate(block_slots(offsets(p), m)):
        assert [slots[k][mid] for k in range(4)] == [t + PERIOD * mid for t in offsets(p)[r]]


@pytest.mark.parametrize("p", range(1, 11))
def test_peak_memory_is_the_papers(p):
    """At most the paper's (p+4)//3 (v-min) and (p+2)//2 (v-half) microbatches on every rank, reached once
    m >= 2p; 1F1B's rank 0 stashes p microbatches (2p chunks)."""
    for m in (1, 2, p, 2 * p, 3 * p):
        for name, chunks in PAPER_CHUNKS.items():
            sched = schedules.build(name, p, m)
            peaks = inflight_by_rank(sched)
            assert max(peaks) <= chunks(p)
            if m >= 2 * p:
                assert max(peaks) == chunks(p)
            validate(sched)
            assert fifo_mismatches(add_p2p(sched)) == []  # NCCL-safe: every link receives in send order


@pytest.mark.parametrize("p", range(2, 11))
def test_v_min_makespan_closed_form(p):
    """Unit chunk costs: 6m + 4p - 5, one less when 3 | p (the block's padding), for every m >= p (but p = 3,
    m = 3: 23). The paper's V-Min bubble ~2p/3m is 4p units of 6m; 1F1B's 6(m + p - 1) in the same units."""
    for m in range(p, 4 * p + 1):
        expected = 6 * m + 4 * p - 5 - (p % 3 == 0) - (p == m == 3)
        assert critical_path(schedules.build("v-min", p, m), UNIT).makespan == expected
        assert expected < 6 * (m + p - 1)


@pytest.mark.parametrize("p", range(1, 11))
def test_v_half_measured_makespan(p):
    """Unit chunk costs: 6m + V_HALF_EXTRA[p] for m >= 2p, about the paper's ~p/2m bubble (3p units of 6m);
    never slower than 1F1B and never faster than zb-v (6m + p - 1), which holds twice the memory."""
    for m in range(2 * p, 4 * p + 1, max(1, p // 2)):
        span = critical_path(schedules.build("v-half", p, m), UNIT).makespan
        assert span == 6 * m + V_HALF_EXTRA[p]
        assert 6 * m + p - 1 <= span <= 6 * (m + p - 1)
        assert span <= critical_path(schedules.build("v-min", p, m), UNIT).makespan


@pytest.mark.parametrize("name", ["v-half", "v-min"])
@pytest.mark.parametrize("p, m", [(2, 3), (4, 8), (5, 7)])
def test_simulates_like_the_critical_path_and_with_unequal_costs(name, p, m):
    """The simulator agrees with the unit critical path; the order, built for unit costs, still runs (no deadlock)
    with t_I = 2 t_F, every rank busy 2m (t_F + t_I + t_W) = 8m."""
    sched = schedules.build(name, p, m)
    unit = simulate(sched, CostTable.uniform(2 * p, 1.0, 1.0, 1.0), comm=False).makespan
    assert unit == critical_path(sched, UNIT).makespan
    assert simulate(sched, CostTable.uniform(2 * p, 1.0, 2.0, 1.0), comm=False).makespan >= 8 * m
