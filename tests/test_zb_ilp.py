"""The exact search (schedules/zb_ilp.py, HiGHS): its proven optimum equals a brute force over every order on
tiny cases, it beats the heuristic where the heuristic is not optimal, and `pipesim schedule --ilp` reports it."""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import permutations, product

import pytest

from pipesim.cli import main
from pipesim.ir.schedule import Action, Kind
from schedules.zb_auto import zb_auto_programs
from schedules.zb_ilp import measure, solve, work_bound
from schedules.zb_inputs import AutoCosts


def stage_orders(r: int, m: int, costs: AutoCosts):
    """Every order of stage r's 3m actions that keeps each kind in microbatch order, I after F, W after I, and
    the stash (F +M_B, I +M_W - M_B, W -M_W) within the limit."""
    seen = set()
    for kinds in set(permutations([Kind.F] * m + [Kind.I] * m + [Kind.W] * m)):
        count = {Kind.F: 0, Kind.I: 0, Kind.W: 0}
        prog, held, ok = [], 0.0, True
        for k in kinds:
            j = count[k]
            if (k == Kind.I and j >= count[Kind.F]) or (k == Kind.W and j >= count[Kind.I]):
                ok = False
                break
            held += {Kind.F: costs.activation[r], Kind.I: costs.weight_bytes(r) - costs.activation[r],
                     Kind.W: -costs.weight_bytes(r)}[k]
            if held > costs.limit[r]:
                ok = False
                break
            count[k] += 1
            prog.append(Action(r, k, j))
        if ok and tuple(prog) not in seen:
            seen.add(tuple(prog))
            yield tuple(prog)


def brute_force(p: int, m: int, costs: AutoCosts, objective: str) -> float:
    best = float("inf")
    for programs in product(*(list(stage_orders(r, m, costs)) for r in range(p))):
        try:
            best = min(best, measure(p, programs, costs, objective))
        except ValueError:  # these two orders wait on each other
            continue
    return best


CASES = [  # (forward, input grad, weight grad per stage, hop, limit in microbatches, M_W / M_B)
    ((1.0, 2.0), (2.0, 1.0), (1.0, 3.0), 0.5, 2.0, None),
    ((2.0, 1.0), (0.0, 2.0), (3.0, 1.0), 0.0, 3.0, 0.5),
    ((1.0, 1.0), (3.0, 1.0), (1.0, 1.0), 1.0, 1.0, 0.5),
]


def test_memory_limits_in_bytes_differ_per_stage():
    """The first stage stashes more per microbatch than the last (an embedding against a head, in bytes), each
    under its own byte limit: the ILP's optimum is the brute force's, and its order keeps every limit."""
    p, m = 2, 3
    costs = AutoCosts((1.0, 2.0), (1.0, 2.0), (2.0, 1.0), (0.5,), (3e9, 1e9), (6.5e9, 2.5e9), (1e9, 0.5e9))
    result = solve(p, m, costs, zb_auto_programs(p, m, costs), time_limit=20)
    assert result.optimal and result.objective == pytest.approx(brute_force(p, m, costs, "makespan"), abs=1e-9)
    for r, prog in enumerate(result.programs):
        held, peak = 0.0, 0.0
        for a in prog:
            held += {Kind.F: costs.activation[r], Kind.I: costs.weight_bytes(r) - costs.activation[r],
                     Kind.W: -costs.weight_bytes(r)}[a.kind]
            peak = max(peak, held)
        assert peak <= costs.limit[r]
    assert result.objective > brute_force(p, m, replace(costs, limit=(float("inf"),) * 2), "makespan")  # it binds


@pytest.mark.parametrize("objective", ["makespan", "span"])
@pytest.mark.parametrize(("f", "i", "w", "hop", "limit", "share"), CASES)
def test_proven_optimum_equals_brute_force(f, i, w, hop, limit, share, objective):
    p, m = 2, 3
    held = () if share is None else (share, share)
    costs = AutoCosts(f, i, w, (hop,), (1.0, 1.0), (limit, limit), held)
    start = zb_auto_programs(p, m, costs)
    result = solve(p, m, costs, start, time_limit=20, objective=objective)
    assert result.optimal
    assert result.objective == pytest.approx(brute_force(p, m, costs, objective), abs=1e-9)
    assert result.bound == result.objective and result.gap == 0.0
    assert measure(p, result.programs, costs, objective) == pytest.approx(result.objective, abs=1e-9)


def test_ilp_beats_the_heuristic_where_it_is_not_optimal():
    """Stages of unequal seconds, one unit of memory per microbatch, 6 at most: the heuristic's best order ends at
    38.5; the ILP proves 37.5."""
    costs = AutoCosts((3.0, 1.0, 2.0), (2.0, 3.0, 3.0), (1.0, 2.0, 1.0), (0.5, 0.5), (1.0,) * 3, (6.0,) * 3)
    start = zb_auto_programs(3, 5, costs)
    assert measure(3, start, costs, "makespan") == 38.5
    result = solve(3, 5, costs, start, time_limit=20)
    assert result.optimal and result.objective == 37.5 and result.warm_start == 38.5
    assert work_bound(3, 5, costs) <= result.objective


def test_schedule_command_reports_the_proven_optimum(capsys):
    assert main(["schedule", "zb-auto", "-p", "3", "-m", "5", "--cost", "F=1,I=2,W=1", "--ilp", "20",
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    search = data["search"]
    assert search["ilp"]["optimal"] and search["value"] == search["bound"] == 24.0 and search["gap"] == 0.0
    assert search["ilp"]["solve_seconds"] >= 0.0


def test_schedule_command_keeps_the_heuristic_with_its_gap_when_too_large(capsys):
    assert main(["schedule", "zb-2p", "-p", "16", "-m", "64", "--cost", "F=1,I=2,W=1", "--ilp"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line == "makespan: heuristic 271, lower bound 271, gap 0.00% (ILP not run: 96768 order binaries > 20000)"


def test_ilp_refuses_other_schedules(capsys):
    assert main(["schedule", "1f1b", "--ilp"]) == 2
    assert capsys.readouterr().err.strip() == "pipesim: error: --ilp searches zb-auto, zb-2p and zb-v, not 1f1b"


def test_simulate_runs_the_ilp_order_the_search_proved(capsys):
    """`pipesim simulate zb-auto --ilp S`: the simulator times the very order the ILP proved optimal."""
    argv = ["simulate", "zb-auto", "-p", "3", "-m", "5", "--cost", "F=1,I=2,W=1", "--ilp", "20", "--json", "-"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["makespan"] == 24.0  # the proven optimum of test_schedule_command_reports_the_proven_optimum


def test_simulate_refuses_a_non_positive_ilp_budget(capsys):
    assert main(["simulate", "zb-auto", "--cost", "F=1,B=2", "--ilp", "0"]) == 2
    assert capsys.readouterr().err.strip() == "pipesim: error: --ilp takes a positive number of seconds, got 0"
