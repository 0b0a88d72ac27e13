"""What-if perturbations (pipesim.sim.perturb) and the blame of waits (pipesim.sim.blame): exact closed forms on
uniform costs, determinism of the jitter, and the CLI's report."""

from __future__ import annotations

import json

import pytest

import schedules
from pipesim.cli import main
from pipesim.cost.model_costs import uniform_costs
from pipesim.cost.table import parse_cost_spec
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.sim.blame import blame_table, waits, what_if
from pipesim.sim.perturb import Perturbation, parse_slow, parse_slow_link
from pipesim.sim.simulator import simulate

F, B = 1.0, 2.0  # seconds


def _table(p: int, spec: str = "F=1,B=2", boundary_bytes: int = 0):
    return uniform_costs(p, parse_cost_spec(spec), boundary_bytes=boundary_bytes).table


@pytest.mark.parametrize(("p", "m"), [(4, 8), (3, 5), (5, 12)])
def test_1f1b_one_slow_rank_closed_form(p, m):
    """Rank k slowed by f is the bottleneck: it waits once, for its first backward (mb 0's round trip below it), and
    then never: makespan = (p-1)(F+B) + m(F'+B') - (p-1-k) F' with F' = fF, B' = fB."""
    sched = schedules.build("1f1b", p, m)
    base = simulate(sched, _table(p))
    assert base.makespan == (m + p - 1) * (F + B)
    for k in range(p):
        f = 1.5
        got = simulate(sched, _table(p), perturb=Perturbation(slow=((k, f),))).makespan
        assert got == pytest.approx((p - 1) * (F + B) + m * f * (F + B) - (p - 1 - k) * f * F, abs=1e-9)


def test_gpipe_one_slow_rank_is_a_flow_shop():
    """GPipe is two flow shops (forwards, then backwards): sum of the stages' times + (m-1) x the slowest's, each."""
    p, m, f = 4, 8, 2.0
    got = simulate(schedules.build("gpipe", p, m), _table(p), perturb=Perturbation(slow=((2, f),))).makespan
    assert got == pytest.approx((p - 1 + f) * (F + B) + (m - 1) * f * (F + B))


def test_slow_factor_one_changes_nothing_and_the_base_ops_are_untouched():
    sched, table = schedules.build("zb-h1", 4, 8), _table(4, "F=1,I=1,W=1")
    base = simulate(sched, table)
    same = simulate(sched, table, perturb=Perturbation(slow=((1, 1.0),)))
    assert same.starts == base.starts and same.ends == base.ends
    simulate(sched, table, perturb=Perturbation(slow=((1, 3.0),)))
    assert simulate(sched, table).ends == base.ends  # shared op records were not modified


def test_slow_link_stretches_only_that_pairs_messages():
    hw = load_hardware("local-cpu")
    sched = schedules.build("1f1b", 4, 4)
    costs = _table(4, "F=0.001,B=0.002", 1 << 20)
    base = simulate(sched, costs, hw)
    slow = simulate(sched, costs, hw, perturb=Perturbation(slow_links=((2, 1, 3.0),)))
    for t0, t1 in zip(base.transfers, slow.transfers, strict=True):
        own0, own1 = t0.end - t0.start, t1.end - t1.start
        if {t1.src, t1.dst} == {1, 2}:
            assert own1 == pytest.approx(3 * own0)
        else:
            assert own1 == pytest.approx(own0)
    assert slow.makespan > base.makespan
    links = {w.culprit for w in waits(slow) if w.culprit_rank < 0}
    assert "link 1-2" in links


def test_jitter_is_seeded_and_lognormal_median_one():
    sched, table = schedules.build("1f1b", 4, 16), _table(4)
    a = simulate(sched, table, perturb=Perturbation(jitter=0.2, seed=7))
    b = simulate(sched, table, perturb=Perturbation(jitter=0.2, seed=7))
    c = simulate(sched, table, perturb=Perturbation(jitter=0.2, seed=8))
    assert a.starts == b.starts and a.ends == b.ends
    assert a.ends != c.ends
    ratios = sorted((e - s) / {"F": F, "B": B}[x.kind.value]
                    for r, prog in enumerate(a.schedule.programs)
                    for x, s, e in zip(prog, a.starts[r], a.ends[r], strict=True) if x.kind.value in "FB")
    assert len(ratios) == 2 * 4 * 16 and ratios[0] < 1 < ratios[-1]


def test_blame_puts_the_pipelines_waits_on_the_slow_rank():
    p, m = 4, 8
    sched = schedules.build("1f1b", p, m)
    base = simulate(sched, _table(p))
    slow = simulate(sched, _table(p), perturb=Perturbation(slow=((1, 1.5),)))
    report = what_if(base, slow)
    assert report["loss"] == pytest.approx(slow.makespan - base.makespan)
    top = next(iter(report["extra_wait_by_culprit"]))
    assert top == "rank 1"
    extra = {(w["rank"], w["waited_on"]): w["extra"] for w in report["waits"]}
    for r in (0, 2, 3):  # every other rank waits longer on rank 1: rank 3 through rank 2, followed to its root
        assert extra[(r, "rank 1")] > 0
    # no links, no in-flight time: every wait is a late sender's, and they add up to the ranks' RECV time
    assert all(w.culprit_rank >= 0 for w in waits(slow))
    assert sum(blame_table(slow).values()) == pytest.approx(sum(slow.waiting_comm(r) for r in range(p)))


def test_parse_and_check_refuse_bad_values():
    assert parse_slow("3=1.5") == (3, 1.5)
    assert parse_slow_link("0-1=2") == (0, 1, 2.0)
    for bad in ("3", "x=2", "1=0", "1=-2", "1=nan"):
        with pytest.raises(PipesimError):
            parse_slow(bad)
    for bad in ("0=2", "0-1", "a-b=2", "1-1=2", "0-1=0"):
        with pytest.raises(PipesimError):
            parse_slow_link(bad)
    with pytest.raises(PipesimError, match="rank 4 does not exist"):
        Perturbation(slow=((4, 2.0),)).check(4)


def test_simulate_cli_reports_the_loss_and_the_blame_as_json(capsys):
    code = main(["simulate", "1f1b", "-p", "4", "-m", "8", "--cost", "F=1,B=2", "--slow", "3=1.5", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    w = data["what_if"]
    assert w["slow"] == [{"rank": 3, "factor": 1.5}]
    assert w["baseline_step_time"] == pytest.approx(33.0) and w["step_time"] == pytest.approx(45.0)
    assert w["loss"] == pytest.approx(12.0) and w["loss_fraction"] == pytest.approx(12 / 33)
    assert next(iter(w["extra_wait_by_culprit"])) == "rank 3"


def test_the_trace_draws_the_blame_in_perfetto_and_the_figure(tmp_path, capsys):
    from pipesim.plots.perfetto import BLAME_TID
    from pipesim.plots.timeline_figure import timeline_figure
    from pipesim.timeline import Timeline

    path = tmp_path / "t.json"
    assert main(["simulate", "1f1b", "-p", "4", "-m", "8", "--cost", "F=1,B=2", "--slow", "1=1.5",
                 "--trace", str(path)]) == 0
    capsys.readouterr()
    trace = json.loads(path.read_text())
    slices = [e for e in trace["traceEvents"] if e.get("cat") == "blame"]
    tl = Timeline.read(path)
    rows = tl.meta["blame"]
    assert len(slices) == len(rows) > 0 and all(e["tid"] == BLAME_TID for e in slices)
    sched = schedules.build("1f1b", 4, 8)
    slow = simulate(sched, _table(4), perturb=Perturbation(slow=((1, 1.5),)))
    assert rows == [[w.rank, w.start, w.end, w.culprit] for w in waits(slow)]
    assert {e["name"] for e in slices} >= {"waits on rank 1"}
    names = {t.name for t in timeline_figure(tl).data}
    assert "waits on a rank (blame)" in names
