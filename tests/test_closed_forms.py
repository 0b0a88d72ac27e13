"""Closed forms of formulas.md through the contention-free critical path (uniform costs, no comm)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from pipesim.ir.graph import critical_path
from pipesim.ir.inflight import inflight_by_rank, inflight_by_stage
from pipesim.ir.schedule import Kind


def costs(f, b=None, i=None, w=None):
    table = {Kind.F: f, Kind.B: b, Kind.I: i, Kind.W: w}
    return lambda a: table.get(a.kind) or 0


def bubble(sched, duration):
    """Idle time over makespan, averaged over ranks."""
    cp = critical_path(sched, duration)
    busy = [sum(duration(a) for a in prog) for prog in sched.programs]
    return cp.makespan, sum(Fraction(cp.makespan - b) / cp.makespan for b in busy) / sched.num_ranks


sizes = st.integers(min_value=1, max_value=12), st.integers(min_value=1, max_value=40)
ratios = st.sampled_from([(1, 1), (1, 2), (2, 3), (1, 3)])


@settings(max_examples=40, deadline=None)
@given(*sizes, ratios)
def test_gpipe_and_1f1b(p, m, ratio):
    tf, tb = ratio
    for name in ("gpipe", "1f1b"):
        makespan, bub = bubble(schedules.build(name, p, m), costs(tf, tb))
        assert makespan == (m + p - 1) * (tf + tb)
        assert bub == Fraction(p - 1, m + p - 1)


@settings(max_examples=30, deadline=None)
@given(*sizes)
def test_naive(p, m):
    makespan, bub = bubble(schedules.build("naive", p, m), costs(1, 2))
    assert makespan == m * p * 3
    assert bub == Fraction(p - 1, p)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 6), st.integers(2, 4), ratios)
def test_interleaved(p, groups, v, ratio):
    m = p * groups
    tf, tb = Fraction(ratio[0], v), Fraction(ratio[1], v)  # per-chunk costs: a rank's work is t_F + t_B
    makespan, bub = bubble(schedules.build("interleaved-1f1b", p, m, v), costs(tf, tb))
    assert makespan == (m + Fraction(p - 1, v)) * (tf + tb) * v
    assert bub == Fraction(p - 1, v) / (m + Fraction(p - 1, v))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(0, 30))
def test_zb_h1_unit_costs(p, extra):
    m = p + extra  # the order reaches the closed form for m >= p
    makespan, bub = bubble(schedules.build("zb-h1", p, m), costs(1, i=1, w=1))
    assert makespan == 3 * m + (p - 1)
    assert bub == Fraction(p - 1, 3 * m + p - 1)


@pytest.mark.parametrize("tf, ti, tw", [(2, 2, 1), (3, 2, 1), (2, 3, 1)])
def test_zb_h1_general_costs(tf, ti, tw):
    # m(tF + tI + tW) + (p - 1)(tF + tI - tW), valid when tW <= tF, tI
    for p in range(1, 7):
        for m in range(p, 3 * p + 2):
            makespan = critical_path(schedules.build("zb-h1", p, m), costs(tf, i=ti, w=tw)).makespan
            assert makespan == m * (tf + ti + tw) + (p - 1) * (tf + ti - tw), (p, m)


@settings(max_examples=30, deadline=None)
@given(*sizes)
def test_peak_inflight(p, m):
    assert inflight_by_stage(schedules.build("gpipe", p, m)) == [m] * p
    assert inflight_by_stage(schedules.build("1f1b", p, m)) == [min(p - s, m) for s in range(p)]
    assert inflight_by_stage(schedules.build("naive", p, m)) == [1] * p
    if m >= p:
        assert inflight_by_rank(schedules.build("zb-h1", p, m)) == [p] * p


def test_critical_path_chain_is_connected():
    sched = schedules.build("1f1b", 4, 8)
    cp = critical_path(sched, costs(1, 2))
    assert cp.path[0] == sched.programs[0][0]
    for a, b in zip(cp.path, cp.path[1:]):
        assert cp.end[a] == cp.start[b]
    assert cp.end[cp.path[-1]] == cp.makespan
