"""Overlapped forward + backward (torch's OVERLAP_F_B) in the IR, and DualPipeV built on it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

import schedules
from pipesim.cost.table import CostTable, parse_cost_spec
from pipesim.errors import PipesimError, ScheduleError
from pipesim.ir import torch_csv
from pipesim.ir.graph import critical_path, overlap_durations
from pipesim.ir.inflight import inflight_by_rank
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Action, overlapped
from pipesim.ir.schedule_check import render_grid, validate
from pipesim.plots.timeline_figure import merge_overlaps, timeline_figure
from pipesim.sim.simulator import simulate


def torch_rows(p, m, with_comms=False):
    ops = get_schedule_ops("DualPipeV", p, m, with_comms=with_comms)
    return "\n".join(",".join("" if a is None else str(a) for a in row) for row in ops)


def pair_timed(sched, table):
    """Critical-path durations with each overlapped pair taking the table's F&B rule."""
    return overlap_durations(sched, table.duration, table.overlap_forward_seconds)


@pytest.mark.parametrize("p, m", [(2, 4), (2, 7), (3, 6), (4, 8), (4, 13), (5, 10)])
def test_dualpipev_is_torchs_order_action_for_action(p, m):
    ours = schedules.build("dualpipev", p, m)
    theirs = torch_csv.loads(torch_rows(p, m), "DualPipeV")
    assert theirs.programs == ours.programs and theirs.overlaps == ours.overlaps and ours.overlaps
    assert theirs.placement == ours.placement


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 11)])
def test_torchs_dualpipev_csv_simulates_to_our_makespan(p, m):
    """torch's order from its CSV: the same contention-free makespan as pipesim's own, in the task graph
    and in the simulator. torch's lowered CSV (with_comms) validates with its overlaps; it posts RECVs
    early, which pipesim's blocking RECVs turn into waits, so it is only checked to be no faster."""
    table = replace(CostTable.uniform(2 * p, 1.0, 1.0, 1.0), overlap_given=2.5)
    ours = schedules.build("dualpipev", p, m)
    theirs = torch_csv.loads(torch_rows(p, m), "DualPipeV")
    a, b = critical_path(ours, pair_timed(ours, table)), critical_path(theirs, pair_timed(theirs, table))
    assert a.makespan == b.makespan
    assert simulate(theirs, table, comm=False).makespan == b.makespan == simulate(ours, table, comm=False).makespan
    lowered = torch_csv.loads(torch_rows(p, m, with_comms=True), "DualPipeV")
    validate(lowered)
    assert lowered.overlaps == ours.overlaps
    assert simulate(lowered, table, comm=False).makespan >= a.makespan


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("extra", [0, 1, 5])
def test_dualpipev_closed_form_without_overlap_gain(p, extra):
    """F = I = W = 1 per chunk and F&B = F + B: every rank works 6m and idles (p-1)(F&B + B - 3W) = 2(p-1),
    the DualPipe README's bubble with p/2 replaced by the V's p (two chunks per rank)."""
    m = 2 * p + extra
    sched = schedules.build("dualpipev", p, m)
    table = replace(CostTable.uniform(2 * p, 1.0, 1.0, 1.0), overlap_given=3.0)
    timed = pair_timed(sched, table)
    cp = critical_path(sched, timed)
    assert [sum(timed(a) for a in prog) for prog in sched.programs] == [6 * m] * p
    assert cp.makespan == 6 * m + (p - 1) * (3 + 2 - 3 * 1)
    assert simulate(sched, table, comm=False).makespan == cp.makespan


def test_overlap_rule_max_plus_share():
    table = CostTable.uniform(2, 1.0, 1.0, 1.0)
    assert table.overlap_seconds(1.0, 2.0) == 3.0  # share 1: back to back (CPU)
    assert replace(table, overlap_share=0.25).overlap_seconds(1.0, 2.0) == 2.25
    assert replace(table, overlap_given=2.5).overlap_seconds(1.0, 2.0) == 2.5
    assert table.overlap_forward_seconds(0.1, 0.5) == 0.1  # share 1: the forward half exactly as alone
    assert replace(table, overlap_share=0.25).overlap_forward_seconds(1.0, 2.0) == 0.25
    assert replace(table, overlap_given=2.5).overlap_forward_seconds(1.0, 2.0) == 0.5
    assert parse_cost_spec("F=1,B=2,FB=2.5") == {"F": 1.0, "I": 1.0, "W": 1.0, "FB": 2.5}
    with pytest.raises(PipesimError, match="shorter than its longer half"):
        parse_cost_spec("F=1,B=2,FB=1.5")


def test_overlap_shortens_the_simulated_step():
    sched = schedules.build("dualpipev", 4, 8)
    plain = replace(CostTable.uniform(8, 1.0, 1.0, 1.0), overlap_given=3.0)
    hidden = replace(plain, overlap_given=2.0)
    assert simulate(sched, hidden, comm=False).makespan < simulate(sched, plain, comm=False).makespan


def test_csv_round_trip_keeps_overlap_cells():
    sched = schedules.build("dualpipev", 2, 4)
    text = torch_csv.dumps(sched)
    assert "(0F3;3B1)OVERLAP_F_B" in text.splitlines()[0].split(",")
    for form in (sched, add_p2p(sched)):
        back = torch_csv.loads(torch_csv.dumps(form))
        assert back.programs == form.programs and back.overlaps == form.overlaps
    assert add_p2p(sched).to_dict()["programs"][0].count("(0F3;3B1)OVERLAP_F_B") == 1


def test_lowering_keeps_an_overlapped_pair_adjacent():
    lowered = add_p2p(schedules.build("dualpipev", 3, 6))
    for fwd, bwd in lowered.overlaps:
        prog = lowered.programs[lowered.rank_of(fwd.stage)]
        assert prog.index(bwd) == prog.index(fwd) + 1


def test_malformed_overlaps_are_named():
    with pytest.raises(PipesimError, match="one forward then one backward"):
        torch_csv.parse_cell("(0B1;1F0)OVERLAP_F_B")
    gpipe = schedules.build("gpipe", 2, 2)
    same = overlapped(gpipe, {(Action.parse("0F1"), Action.parse("0B1"))})
    with pytest.raises(ScheduleError, match="must be two adjacent actions"):
        validate(same)
    onef = schedules.build("1f1b", 1, 2)  # 0F0 0B0 0F1 0B1: B0 needs its own F0
    with pytest.raises(ScheduleError, match="cannot overlap"):
        validate(overlapped(onef, {(Action.parse("0F0"), Action.parse("0B0"))}))
    fine = overlapped(onef, {(Action.parse("0F1"), Action.parse("0B0"))})
    with pytest.raises(ScheduleError, match="adjacent"):
        validate(fine)  # order is F0 B0 F1 B1: F1 and B0 are adjacent but B0 comes first


def test_timeline_draws_an_overlapped_pair_as_one_bar_with_both_labels():
    sched = schedules.build("dualpipev", 2, 4)
    table = replace(CostTable.uniform(4, 1.0, 1.0, 1.0), overlap_given=2.5)
    timeline = simulate(sched, table, comm=False).timeline()
    assert ["0F3", "3B1"] in timeline.meta["overlaps"]
    events, texts = merge_overlaps(timeline)
    bar = next(e for e, text in texts.items() if text == "0F3;3B1")
    assert bar.duration == 2.5 and bar.rank == 0
    assert len(events) == len(timeline.events) - len(sched.overlaps)
    drawn = [t for trace in timeline_figure(timeline).data for t in trace.text]
    assert "0F3;3B1" in drawn and "0F3" not in drawn


@pytest.mark.parametrize("p", range(1, 9))
def test_dualpipev_holds_2p_plus_1_chunk_activations_on_every_rank(p):
    """The DualPipe README's activation memory, PP + 1 (here in chunks: 2p + 1 half-stages), whatever m."""
    for m in (2 * p, 2 * p + 1, 4 * p):
        assert inflight_by_rank(schedules.build("dualpipev", p, m)) == [2 * p + 1] * p


def test_grid_shows_an_overlapped_pair_in_one_step():
    grid = render_grid(schedules.build("dualpipev", 2, 4), frozenset({Action.parse("3B1")})).splitlines()
    assert grid[1].split()[3:11] == ["0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1", "0F3;[3B1]"]
