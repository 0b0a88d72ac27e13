"""looped-bfs, zb-v and zb-h2: exact orders, closed forms via the critical path, memory, torch parity."""

from __future__ import annotations

import pytest
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

import schedules
from pipesim.errors import PipesimError
from pipesim.ir.graph import critical_path
from pipesim.ir.inflight import inflight_by_rank
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Action, Kind
from pipesim.ir.schedule_check import fifo_mismatches
from pipesim.ir.torch_csv import parse_rows
from schedules.unit_time import merge_unit_time


def costs(f, b=0, i=0, w=0):
    table = {Kind.F: f, Kind.B: b, Kind.I: i, Kind.W: w}
    return lambda a: table.get(a.kind, 0)


UNIT_SPLIT = costs(1, i=1, w=1)


def torch_schedule(name, p, m, v=None):
    ops = get_schedule_ops(name, p, m, num_stages_per_rank=v)
    return parse_rows([["" if a is None else str(a) for a in row] for row in ops], name)


def orders(sched):
    return [" ".join(map(str, prog)) for prog in sched.programs]


# --- looped-bfs -------------------------------------------------------------------------------


def test_exact_looped_bfs_order():
    assert orders(schedules.build("looped-bfs", 2, 3, 2)) == [
        "0F0 0F1 0F2 2F0 2F1 2F2 2B2 2B1 2B0 0B2 0B1 0B0",
        "1F0 1F1 1F2 3F0 3F1 3F2 3B2 3B1 3B0 1B2 1B1 1B0",
    ]


@pytest.mark.parametrize("tf, tb", [(1, 1), (1, 2), (2, 3), (3, 1)])
def test_looped_bfs_closed_form(tf, tb):
    # per-chunk costs: (v * max(m, p) + min(m, p) - 1)(t_F + t_B); a wrap from rank p-1 to rank 0
    # waits when m < p, so each chunk round then takes p steps instead of m
    for p in range(1, 9):
        for v in (2, 3):
            for m in range(1, 13):
                makespan = critical_path(schedules.build("looped-bfs", p, m, v), costs(tf, tb)).makespan
                assert makespan == (v * max(m, p) + min(m, p) - 1) * (tf + tb), (p, v, m)


@pytest.mark.parametrize("p, v", [(2, 2), (3, 2), (4, 2), (4, 3), (8, 2)])
def test_looped_bfs_is_torchs_order(p, v):
    for m in (1, p, 2 * p + 1):
        ours = schedules.build("looped-bfs", p, m, v)
        theirs = torch_schedule("LoopedBFS", p, m, v)
        assert theirs.placement == ours.placement
        assert theirs.programs == ours.programs


def test_looped_bfs_memory_and_admission():
    assert inflight_by_rank(schedules.build("looped-bfs", 4, 6, 3)) == [18] * 4  # v * m on every rank
    with pytest.raises(PipesimError, match="--virtual >= 2"):
        schedules.build("looped-bfs", 4, 6, 1)


# --- zb-v ---------------------------------------------------------------------------------------


def test_exact_zb_v_order():
    assert orders(schedules.build("zb-v", 2, 3)) == [
        "0F0 0F1 3F0 3I0 3F1 3W0 0F2 0I0 0W0 3I1 3F2 3W1 3I2 0I1 3W2 0I2 0W1 0W2",
        "1F0 2F0 1F1 2F1 2I0 2W0 1I0 1F2 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2",
    ]


def test_zb_v_reaches_the_lower_bound():
    # rank p-1 cannot start before p-1 and owns 6m unit actions, so 6m + p - 1 is a lower bound
    sizes = [(p, m) for p in range(1, 9) for m in range(p, 3 * p + 1)] + [(12, 12), (12, 13), (12, 30)]
    for p, m in sizes:
        sched = schedules.build("zb-v", p, m)
        assert sched.placement == tuple([*range(p), *reversed(range(p))])
        assert critical_path(sched, UNIT_SPLIT).makespan == 6 * m + p - 1, (p, m)


def test_zb_v_matches_or_beats_torch():
    strictly_better = []
    for p in range(2, 9):
        for m in range(p, 3 * p + 1):
            ours = critical_path(schedules.build("zb-v", p, m), UNIT_SPLIT).makespan
            theirs = critical_path(torch_schedule("ZBVZeroBubble", p, m), UNIT_SPLIT).makespan
            assert ours <= theirs, (p, m)
            # torch 2.13 pads to 2p - 1 microbatches: bubble max(p - 1, 2(2p - 1 - m)) in our units
            assert theirs - 6 * m == max(p - 1, 2 * (2 * p - 1 - m)), (p, m)
            if ours < theirs:
                strictly_better.append((p, m))
    assert (4, 4) in strictly_better and (8, 11) in strictly_better and (8, 12) not in strictly_better


def test_zb_v_memory_is_one_f_one_b():
    for p in range(1, 9):
        for m in range(1, 17):
            # chunk activations: 2p = p full stages, 1F1B's peak on rank 0, reached on every rank
            assert inflight_by_rank(schedules.build("zb-v", p, m)) == [min(2 * m, 2 * p)] * p, (p, m)


def test_zb_v_send_order_equals_recv_order_unlike_torch_order():
    """Each link carries two message kinds; torch's order interleaves them differently per rank."""
    assert fifo_mismatches(add_p2p(schedules.build("zb-v", 4, 8))) == []
    assert fifo_mismatches(add_p2p(torch_schedule("ZBVZeroBubble", 4, 8))) == [(0, 1), (1, 2), (2, 3)]


def test_zb_v_admits_only_two_chunks():
    with pytest.raises(PipesimError, match="exactly --virtual 2"):
        schedules.build("zb-v", 4, 8, 3)


# --- zb-h2 --------------------------------------------------------------------------------------


def test_exact_zb_h2_order():
    assert orders(schedules.build("zb-h2", 3, 5)) == [
        "0F0 0F1 0F2 0F3 0F4 0I0 0W0 0I1 0W1 0I2 0W2 0I3 0W3 0I4 0W4",
        "1F0 1F1 1F2 1I0 1F3 1I1 1F4 1I2 1W0 1I3 1W1 1I4 1W2 1W3 1W4",
        "2F0 2I0 2F1 2I1 2F2 2I2 2F3 2I3 2F4 2I4 2W0 2W1 2W2 2W3 2W4",
    ]


@pytest.mark.parametrize("tf, ti, tw", [(1, 1, 1), (2, 2, 1), (3, 2, 1), (1, 2, 1), (3, 3, 2), (2, 3, 2)])
def test_zb_h2_closed_form(tf, ti, tw):
    # valid for t_W <= t_I <= 2 t_W; the first two terms are the last rank's lower bound
    for p in range(1, 9):
        for m in range(1, 3 * p + 3):
            makespan = critical_path(schedules.build("zb-h2", p, m), costs(tf, i=ti, w=tw)).makespan
            expected = m * (tf + ti + tw) + (p - 1) * tf + max(0, (p - 1) * ti - (m - 1) * tw)
            assert makespan == expected, (p, m)


def test_zb_h2_beats_zb_h1_when_weight_grads_are_cheaper():
    duration = costs(2, i=2, w=1)
    for p in range(2, 9):
        for m in range(2 * p - 1, 3 * p + 1):
            h1 = critical_path(schedules.build("zb-h1", p, m), duration).makespan
            h2 = critical_path(schedules.build("zb-h2", p, m), duration).makespan
            assert h1 - h2 == p - 1  # (p - 1)(t_I - t_W)
        # equal costs: both reach the last rank's bound 3m + p - 1
        assert critical_path(schedules.build("zb-h2", p, 2 * p), UNIT_SPLIT).makespan == 3 * 2 * p + p - 1


def test_zb_h2_memory_is_twice_one_f_one_b():
    for p in range(1, 9):
        for m in range(1, 17):
            assert inflight_by_rank(schedules.build("zb-h2", p, m)) == [min(m, 2 * p)] * p, (p, m)


def test_unit_time_merge_reports_inconsistent_queues():
    # rank 1's only queue asks for I before the F it needs: nothing can ever run there
    queues = [([Action(0, Kind.F, 0), Action(0, Kind.I, 0)],), ([Action(1, Kind.I, 0), Action(1, Kind.F, 0)],)]
    with pytest.raises(RuntimeError, match="deadlocked"):
        merge_unit_time(queues, 2, cap=2)
