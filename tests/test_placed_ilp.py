"""The exact search over the V placement (schedules/placed_ilp.py, pipesim/cost/v_search.py): its proven optimum
equals an exhaustive search on tiny V cases, a tight memory limit changes the order and is kept, zb-v's own
order is never beaten from below, and the result is an ordinary Schedule the simulator times."""

from __future__ import annotations

import json

import pytest

from pipesim.cli import main
from pipesim.cost.table import CostTable, StageCosts
from pipesim.cost.v_search import handcrafted, search_v, serial
from pipesim.cost.v_search import v_costs as cost_v_costs
from pipesim.ir.schedule import Schedule, loop_placement, v_placement
from pipesim.ir.schedule_check import validate
from schedules.placed_graph import KINDS, delta, deps, peak_stash, placed_measure, seconds_of
from schedules.placed_ilp import solve_placed
from schedules.placed_list import list_orders
from schedules.zb_inputs import AutoCosts
from schedules.zero_bubble_v import zb_v


def v_costs(p: int, f, i, w, hop: float = 0.0, limit: float = float("inf"), share: float | None = None) -> AutoCosts:
    """Per-chunk seconds (a tuple per stage, or one number for all), unit activation per chunk, `limit` per rank."""
    s = 2 * p
    each = [x if isinstance(x, tuple) else (float(x),) * s for x in (f, i, w)]
    comm = tuple(0.0 if b == p - 1 else hop for b in range(s - 1))  # the V's turn is on one rank
    held = () if share is None else (share,) * s
    return AutoCosts(*each, comm, (1.0,) * s, (limit,) * p, held)


def exhaustive(p: int, m: int, costs: AutoCosts, placement: tuple[int, ...] | None = None) -> float:
    """The least makespan over every valid set of per-rank orders: every such order's timing, listed by (start time,
    position in `keys`), is one sequence of this search, which appends to any rank any action whose inputs and rank
    predecessor are placed, that starts after the previous one (or with it and later in `keys`: with positive
    seconds, actions starting together are on different ranks and independent) and keeps the rank's stash within
    its limit; pruned only by a valid bound (a rank's free time plus its remaining work)."""
    placement = placement or v_placement(p)
    keys = [(s, k, j) for s in range(len(placement)) for k in KINDS for j in range(m)]
    assert all(seconds_of(costs, key) > 0 for key in keys)
    left = [sum(seconds_of(costs, key) for key in keys if placement[key[0]] == r) for r in range(p)]
    best = [float("inf")]

    def dfs(end, free, held, last, left):
        if len(end) == len(keys):
            best[0] = min(best[0], max(free))
            return
        if max(f + rest for f, rest in zip(free, left)) >= best[0] - 1e-12:
            return
        for n, key in enumerate(keys):
            s, k, j = key
            if key in end or (j and (s, k, j - 1) not in end):
                continue
            need = deps(costs, key)
            if any(d not in end for d, _ in need):
                continue
            r = placement[s]
            if held[r] + delta(costs, key) > costs.limit[r] + 1e-12:
                continue
            start = max([free[r], *(end[d] + c for d, c in need)])
            if (start, n) <= last:
                continue
            t = seconds_of(costs, key)
            end[key] = start + t
            saved = free[r], held[r], left[r]
            free[r], held[r], left[r] = start + t, held[r] + delta(costs, key), left[r] - t
            dfs(end, free, held, (start, n), left)
            free[r], held[r], left[r] = saved
            del end[key]

    dfs({}, [0.0] * p, [0.0] * p, (0.0, -1), left)
    return best[0]


CASES = [  # (p, m, F, I, W per chunk, hop, limit in chunk stashes per rank, M_W / M_B)
    (2, 2, 1.0, 1.5, 0.7, 0.1, float("inf"), None),
    (2, 2, (1.0, 2.0, 1.0, 0.5), (2.0, 1.0, 1.0, 1.0), (1.0, 0.5, 2.0, 1.0), 0.25, 3.0, None),
    (2, 3, 1.0, 1.0, 1.0, 0.0, 3.0, 0.5),
]


@pytest.mark.parametrize(("p", "m", "f", "i", "w", "hop", "limit", "share"), CASES)
def test_proven_optimum_equals_exhaustive_search(p, m, f, i, w, hop, limit, share):
    costs = v_costs(p, f, i, w, hop, limit, share)
    name, start = handcrafted(p, m, costs)
    result = solve_placed(v_placement(p), m, costs, start, time_limit=20)
    assert result.optimal and result.gap == 0.0
    assert result.objective == pytest.approx(exhaustive(p, m, costs), abs=1e-9)
    assert all(peak <= limit for peak in peak_stash(v_placement(p), result.programs, costs))


def test_a_limit_below_zb_v_peak_forces_another_valid_order():
    """zb-v holds 4 chunk stashes on each rank at p=2, m=3; under 3 the search must return another order: within 3
    on every rank, valid, slower than the unlimited optimum and faster than one microbatch at a time."""
    p, m = 2, 3
    placement = v_placement(p)
    free = v_costs(p, 1.0, 1.5, 0.7, 0.1)
    assert max(peak_stash(placement, zb_v(p, m).programs, free)) == 4.0
    tight = v_costs(p, 1.0, 1.5, 0.7, 0.1, limit=3.0)
    found = search_v("zb-v", tight, p, m, time_limit=20)
    sched = found.schedule
    validate(sched)
    assert sched.programs != zb_v(p, m).programs and found.ilp.optimal
    assert max(peak_stash(placement, sched.programs, tight)) == 3.0
    unlimited = search_v("zb-v", free, p, m, time_limit=20).value
    assert unlimited < found.value < placed_measure(placement, serial(p, m), tight)


@pytest.mark.parametrize(("p", "m", "f", "i", "w", "hop"), [(2, 4, 1.0, 1.0, 1.0, 0.0), (3, 3, 1.0, 2.0, 0.5, 0.2),
                                                            (3, 6, 1.0, 1.5, 0.7, 0.05)])
def test_zb_v_is_never_beaten_from_below(p, m, f, i, w, hop):
    """Under zb-v's own memory (2p chunk stashes per rank) the search's order is never slower than zb-v's, and never
    under the bound it reports."""
    costs = v_costs(p, f, i, w, hop, limit=2.0 * p)
    found = search_v("zb-v", costs, p, m, time_limit=2)
    own = placed_measure(v_placement(p), zb_v(p, m).programs, costs)
    assert found.bound <= found.value <= own
    validate(found.schedule)


def test_schedule_and_simulate_agree_on_the_searched_v_order(capsys):
    """`pipesim schedule zb-v --ilp` proves an order; `pipesim simulate zb-v --ilp` times that very order."""
    argv = ["-p", "2", "-m", "3", "--cost", "F=2,I=3,W=1.4", "--memory-limit", "3", "--ilp", "20"]
    assert main(["schedule", "zb-v", *argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    search = data["search"]
    assert search["ilp"]["optimal"] and search["gap"] == 0.0
    expect = exhaustive(2, 3, v_costs(2, 1.0, 1.5, 0.7, limit=3.0))
    assert search["value"] == pytest.approx(expect, abs=1e-9)
    assert main(["simulate", "zb-v", *argv, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == pytest.approx(expect, abs=1e-9)


def test_v_search_refuses_a_limit_below_one_microbatch(capsys):
    assert main(["schedule", "zb-v", "-p", "2", "-m", "2", "--memory-limit", "1.5"]) == 2
    assert capsys.readouterr().err.strip() == ("pipesim: error: --memory-limit 1.5 B leaves a rank less than one "
                                               "microbatch of its two chunks (2 B): nothing can run")


def test_serial_order_is_valid():
    """The fallback start: one microbatch down the V and back, each W after its I."""
    validate(Schedule("serial", 2, v_placement(3), serial(3, 2)))
    assert [str(a) for a in serial(2, 1)[0]] == ["0F0", "3F0", "3I0", "3W0", "0I0", "0W0"]


def test_list_scheduler_starts_where_no_handcrafted_v_order_fits():
    """Under 3 chunk stashes per rank (zb-v, v-half and v-min all hold 4 at p = 2; v-min 4 at p = 4) the start is
    the list scheduler's order: valid, within the limit, well under one microbatch at a time."""
    for p, m, expect in ((2, 3, 28.4), (4, 8, 118.5)):
        costs = v_costs(p, 1.0, 1.5, 0.7, 0.1, limit=3.0)
        name, programs = handcrafted(p, m, costs)
        assert name == "list" and programs == list_orders(v_placement(p), m, costs)
        validate(Schedule("list", m, v_placement(p), programs))
        assert max(peak_stash(v_placement(p), programs, costs)) == 3.0
        assert placed_measure(v_placement(p), programs, costs) == pytest.approx(expect, abs=1e-9)
        assert expect < placed_measure(v_placement(p), serial(p, m), costs)


def test_the_same_ilp_searches_the_looped_placement():
    """Interleaved (looped) placement, p = 2 with 2 chunks each (rank 0: stages 0, 2): the ILP from the list
    scheduler's order proves the exhaustive search's optimum, under a limit and without."""
    placement = loop_placement(2, 2)
    for limit in (float("inf"), 3.0):
        costs = AutoCosts((1.0, 2.0, 1.0, 1.5), (1.5, 1.0, 2.0, 1.0), (0.5, 1.0, 0.7, 1.0), (0.2, 0.2, 0.2),
                          (1.0,) * 4, (limit,) * 2)
        start = list_orders(placement, 2, costs)
        result = solve_placed(placement, 2, costs, start, time_limit=20)
        assert result.optimal and result.objective == pytest.approx(exhaustive(2, 2, costs, placement), abs=1e-9)
        assert result.objective <= placed_measure(placement, start, costs)
        validate(Schedule("looped", 2, placement, result.programs))


def test_default_limit_is_what_zb_v_holds():
    """Without --memory-limit the V search keeps each rank within zb-v's own peak, in the table's bytes (the first and
    last chunks stash more: the embedding, the head)."""
    p, m = 3, 5
    table = CostTable(tuple(StageCosts(1.0, 1.5, 0.7, 0, act, 0) for act in (300, 100, 100, 100, 100, 500)))
    costs = cost_v_costs(table, p, m, None)
    assert costs.limit == tuple(peak_stash(v_placement(p), zb_v(p, m).programs, costs)) == (2200.0, 600.0, 600.0)
    # zb-v holds 2p = 6 chunk stashes per rank at its peak: on rank 0, four of chunk 0 (300 B) and two of chunk 5
    found = search_v("zb-v", costs, p, m, time_limit=2)
    assert all(a <= b for a, b in zip(peak_stash(v_placement(p), found.schedule.programs, costs), costs.limit))
