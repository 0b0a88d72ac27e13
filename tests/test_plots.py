"""Figures and the `pipesim plot` command: exact bar geometry, units, errors, files written."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

import schedules
from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.ir.schedule import Kind
from pipesim.plots import compare_figure, export, sweep_figure, timeline_figure, write_html, write_png
from pipesim.plots.compare import first_replica, median_step, pick_step, prediction_error
from pipesim.plots.from_schedule import unit_timeline
from pipesim.plots.perfetto import write_trace
from pipesim.timeline import Event, Timeline

F, B = 1e-3, 2e-3  # seconds


def _no_comm(action) -> float:
    return {Kind.F: F, Kind.B: B}.get(action.kind, 0.0)


@pytest.fixture(scope="module")
def sim() -> Timeline:
    """1F1B, p=3, m=4, transfers free: makespan (m + p - 1)(F + B) = 18 ms, each rank busy 12 ms."""
    return unit_timeline(schedules.build("1f1b", 3, 4), _no_comm, transfer_bytes=lambda a: 3 << 20)


def _measured(sim: Timeline, factors: tuple[float, ...]) -> Timeline:
    """`sim` replayed for len(factors) steps, step k stretched by factors[k], back to back from t=5 s."""
    events, t0 = [], 5.0
    for step, f in enumerate(factors):
        events += [replace(e, start=t0 + e.start * f, end=t0 + e.end * f, step=step) for e in sim.events]
        t0 += sim.makespan * f
    return Timeline("measured", sim.schedule, sim.num_ranks, events, {})


def _bars(fig) -> int:
    return sum(len(t.x) for t in fig.data if t.type == "bar")


def test_closed_form_sanity(sim):
    assert sim.makespan == pytest.approx((4 + 3 - 1) * (F + B), rel=1e-12)


def test_timeline_bars_are_the_events_in_ms(sim):
    fig = timeline_figure(sim)
    assert _bars(fig) == len(sim.events)
    assert fig.layout.xaxis.title.text == "time (ms)"
    forward = next(t for t in fig.data if t.name == "F forward")
    assert len(forward.x) == 12  # 3 stages x 4 microbatches
    assert list(forward.x) == pytest.approx([1.0] * 12)  # 1 ms bars
    labels = list(forward.text)
    first = labels.index("0F0")
    assert forward.base[first] == 0.0 and forward.y[first] == "rank 0 · compute"
    rows = list(fig.layout.yaxis.categoryarray)
    assert rows == [f"rank {r} · {s}" for r in range(3) for s in ("compute", "send", "recv")]
    assert fig.layout.yaxis.autorange == "reversed"  # rank 0 on top
    idle = [a.text for a in fig.layout.annotations if a.text.startswith("idle")]
    assert idle == ["idle 33%"] * 3  # 1 - 12/18
    assert "makespan 18 ms" in fig.layout.title.text and "bubble 33.3%" in fig.layout.title.text
    backward = next(t for t in fig.data if t.name == "B backward")
    assert backward.marker.color != forward.marker.color


def test_hover_has_stage_microbatch_duration_bytes(sim):
    fig = timeline_figure(sim)
    send = next(t for t in fig.data if t.name == "send")
    row = list(send.customdata[0])
    assert row[1] in ("SEND_F", "SEND_B") and row[6] == "3 MiB" and row[7] in (0, 1, 2)
    assert "microbatch" in send.hovertemplate and "duration" in send.hovertemplate


def test_unit_switches_to_us_for_short_runs(sim):
    tiny = Timeline("simulated", "1f1b", 3, [replace(e, start=e.start * 1e-3, end=e.end * 1e-3) for e in sim.events])
    fig = timeline_figure(tiny)
    assert fig.layout.xaxis.title.text == "time (us)"
    forward = next(t for t in fig.data if t.name == "F forward")
    assert list(forward.x) == pytest.approx([1.0] * 12)  # 1 us bars
    assert timeline_figure(sim, unit="us").layout.xaxis.title.text == "time (us)"
    with pytest.raises(PipesimError, match="unknown time unit"):
        timeline_figure(sim, unit="h")


def test_compare_uses_median_step_and_reports_errors(sim):
    meas = _measured(sim, (1.5, 1.1, 1.25))  # median step by duration: step 2 (x1.25)
    assert median_step(meas) == 2
    err = prediction_error(sim, meas.only_step(2))
    assert err.makespan == pytest.approx(1 / 1.25 - 1)  # -20%
    assert err.busy_by_rank == pytest.approx((1 / 1.25 - 1,) * 3)
    fig = compare_figure(sim, meas)
    assert _bars(fig) == 2 * len(sim.events)
    assert "makespan error 20.0%" in fig.layout.title.text
    assert "rank 0 -20.0%" in fig.layout.title.text
    assert "measured 1f1b (step 3 of 3, first to last compute)" in fig.layout.annotations[1].text  # from 1
    assert {fig.layout.xaxis.matches, fig.layout.xaxis2.matches} == {"x2", None}  # one shared time axis
    assert fig.layout.meta["makespan_error"] == pytest.approx(-0.2)
    fig1 = compare_figure(meas, sim, step=2)  # argument order does not matter; --step picks the step (from 1)
    assert fig1.layout.meta["makespan_error"] == pytest.approx(1 / 1.1 - 1)


def test_default_step_is_never_a_warmup_step(sim):
    meas = _measured(sim, (1.2, 2.0, 1.0))  # by duration alone the median is step 1 (x1.2), the warm-up
    meas.meta = {"warmup": 1}
    assert median_step(meas) == 2  # of steps 2 and 3 (x2.0, x1.0) the lower median: x1.0
    assert pick_step(meas, None).meta["shown_step"] == 3  # numbered from 1, as `pipesim run` prints it
    assert median_step(_measured(sim, (1.2, 2.0, 1.0))) == 0  # no warm-up recorded: every step counts


def _shaped(tl: Timeline, **meta) -> Timeline:
    return Timeline(tl.source, tl.schedule, tl.num_ranks, tl.events, meta)


def test_compare_refuses_runs_of_different_shape(sim):
    meas = _measured(sim, (1.0,))
    good = {"stages": 3, "pp": 3, "microbatches": 4}
    simulated = _shaped(sim, p=3, m=4, v=1, hardware="local-cpu")
    compare_figure(simulated, _shaped(meas, **good))  # the same shape compares
    cases = [(_shaped(meas, **{**good, "microbatches": 8}), "microbatches 4 (simulated) vs 8 (measured)"),
             (_shaped(meas, **{**good, "stages": 6}), "stages 3 (simulated) vs 6 (measured)"),
             (Timeline("measured", "zb-h1", 3, meas.events, good), "schedule 1f1b (simulated) vs zb-h1 (measured)")]
    for other, message in cases:
        with pytest.raises(PipesimError, match=re.escape(message)):
            compare_figure(simulated, other)
        fig = compare_figure(simulated, other, force=True)
        assert f"{message}, compared with --force" in fig.layout.title.text
    interleaved = _shaped(sim, p=3, m=4, v=2)
    with pytest.raises(PipesimError, match=re.escape("virtual chunks 2 (simulated) vs 1 (measured)")):
        compare_figure(interleaved, _shaped(meas, stages=3, pp=3, microbatches=4))


def test_compare_says_when_model_or_hardware_differ(sim):
    model = {"kind": "gpt", "hidden": 256, "layers": 4, "seed": 0}
    simulated = _shaped(sim, p=3, m=4, v=1, hardware="dgx-h100", model=model)
    meas = _shaped(_measured(sim, (1.0,)), stages=3, pp=3, microbatches=4, device="cpu",
                   model={**model, "hidden": 512, "seed": 1})
    title = compare_figure(simulated, meas).layout.title.text
    assert "model differs (hidden)" in title
    assert "hardware differs (simulated on dgx-h100, measured on cpu)" in title
    same = _shaped(meas, stages=3, pp=3, microbatches=4, device="cpu", model=model)
    title = compare_figure(_shaped(simulated, p=3, m=4, v=1, hardware="local-cpu", model=model), same).layout.title
    assert "differs" not in title.text


def test_compare_counts_a_measured_step_from_its_first_compute(sim):
    step0 = [e for e in _measured(sim, (1.0,)).events]
    t0 = 5.0  # where _measured puts 0F0
    early = Event(1, "recv", "RECV_F", 1, 0, t0 - 3 * sim.makespan, t0 + 0.01 * sim.makespan, 8, 0, step=0)
    meas = Timeline("measured", sim.schedule, sim.num_ranks, [early, *step0], {})
    err = prediction_error(sim, pick_step(meas, None))
    assert err.makespan == pytest.approx(0.0)  # the wait before the first compute is not the pipeline's
    shown = pick_step(meas, None)
    assert min(e.start for e in shown.events) == 0.0 and shown.makespan == pytest.approx(sim.makespan)


def test_compare_rejects_wrong_step_and_rank_count(sim):
    meas = _measured(sim, (1.0, 1.2))
    with pytest.raises(PipesimError, match="no step 7"):
        compare_figure(sim, meas, step=7)
    two = unit_timeline(schedules.build("1f1b", 2, 4), _no_comm)
    with pytest.raises(PipesimError, match=re.escape("ranks 2 (simulated) vs 3 (measured)")):
        compare_figure(two, meas)


SWEEP_ROWS = [
    {"schedule": s, "stages": 4, "microbatches": m, "virtual": 1, "makespan": 1.0,
     "bubble_fraction": 3 / (m + 3) * (0.5 if s == "zb-h1" else 1.0), "peak_activation_bytes": (m if s == "gpipe"
     else 4) << 20, "peak_inflight": 4, "link_utilization": {"nvlink": 0.1 * m / 16, "pcie": 0.05}}
    for s in ("gpipe", "1f1b", "zb-h1") for m in (16, 4, 8)
]


def test_sweep_lines_and_bars():
    fig = sweep_figure(SWEEP_ROWS)
    lines = {t.name: t for t in fig.data if t.type == "scatter"}
    assert set(lines) == {"gpipe", "1f1b", "zb-h1"}
    assert list(lines["1f1b"].x) == [4, 8, 16]  # sorted by microbatches
    assert list(lines["1f1b"].y) == pytest.approx([3 / 7, 3 / 11, 3 / 19])
    memory = next(t for t in fig.data if t.type == "bar" and t.xaxis == "x2")
    assert dict(zip(memory.x, memory.y)) == {"1f1b": 4.0, "gpipe": 16.0, "zb-h1": 4.0}  # MiB at m=16
    links = [t for t in fig.data if t.type == "bar" and t.xaxis == "x3"]
    assert [t.name for t in links] == ["nvlink", "pcie"]
    assert all(list(t.x) == ["1f1b", "gpipe", "zb-h1"] for t in links)
    assert list(links[0].y) == pytest.approx([0.1] * 3) and list(links[1].y) == [0.05] * 3


def test_sweep_rejects_bad_rows():
    with pytest.raises(PipesimError, match="no rows"):
        sweep_figure([])
    with pytest.raises(PipesimError, match="row 0 lacks bubble_fraction"):
        sweep_figure([{"schedule": "x", "stages": 2, "microbatches": 2, "peak_activation_bytes": 1}])


def test_html_is_self_contained(sim, tmp_path):
    path = write_html(timeline_figure(sim), tmp_path / "t.html")
    text = path.read_text()
    assert "<script src=" not in text  # nothing fetched: plotly.js is inlined
    assert "Plotly.newPlot" in text and len(text) > 3_000_000  # plotly.js inlined (~4.6 MB)


def test_png_without_chromium_is_one_clear_error(sim, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setattr(export, "DEBIAN_CHROMIUM", str(tmp_path / "no-chromium"))
    with pytest.raises(PipesimError, match=r"needs Chromium \(apt-get install chromium\); HTML was written"):
        write_png(timeline_figure(sim), tmp_path / "t.png")


def test_png_with_chromium(sim, tmp_path):
    if export.find_chromium() is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium): PNG export not tested")
    fig = timeline_figure(sim)
    fig.update_layout(width=800)
    path = write_png(fig, tmp_path / "t.png")
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(head[16:20], "big") == 1600  # width 800 at scale 2


# -- the command -----------------------------------------------------------------------------------


@pytest.fixture()
def traces(sim, tmp_path):
    s, m = tmp_path / "simulated.json", tmp_path / "measured.json"
    write_trace(sim, s)
    _measured(sim, (1.5, 1.1, 1.25)).write(m)  # a bare timeline is accepted too
    return s, m


def test_cli_one_trace_and_compare(traces, tmp_path, capsys):
    s, m = traces
    assert main(["plot", str(s), "-o", str(tmp_path / "one.html")]) == 0
    assert main(["plot", str(m), str(s), "-o", str(tmp_path / "cmp.html"), "--unit", "us"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [f"wrote {tmp_path / 'one.html'}", f"wrote {tmp_path / 'cmp.html'}"]
    assert "makespan error 20.0%" in (tmp_path / "cmp.html").read_text()


def test_sweep_figure_names_its_setting_and_notes():
    fig = sweep_figure(SWEEP_ROWS, setting="on dgx-h100 (links modeled), model mlp (hidden 1024)",
                       notes=["1f1b's bubble is above gpipe's"])
    assert "on dgx-h100 (links modeled), model mlp (hidden 1024)" in fig.layout.title.text
    assert any(a.text == "note: 1f1b's bubble is above gpipe's" for a in fig.layout.annotations)


def test_cli_sweep(tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"schema": "pipesim.sweep/1", "hardware": "dgx-h100", "rows": SWEEP_ROWS}))
    assert main(["plot", str(path), "-o", str(tmp_path / "sweep.html")]) == 0
    assert (tmp_path / "sweep.html").stat().st_size > 3_000_000


@pytest.mark.parametrize(("argv", "message"), [
    (["missing.json", "-o", "x.html"], "file not found: missing.json"),
    (["bad.json", "-o", "x.html"], "cannot read bad.json"),
    (["other.json", "-o", "x.html"], "other.json is not a pipesim timeline"),
    (["simulated.json", "-o", "x.png"], "-o x.png: writes HTML; name the file *.html"),
    (["simulated.json", "-o", "x.html", "--png", "x.jpg"], "--png x.jpg: writes PNG; name the file *.png"),
    (["simulated.json", "-o", "."], "-o .: is a folder"),
    (["measured.json", "-o", "x.html", "--step", "9"], "has no step 9"),
    (["sweep.json", "simulated.json", "-o", "x.html"], "plot a sweep on its own"),
    (["simulated.json", "-o", "nodir/x.html"], "folder nodir does not exist"),
])
def test_cli_user_mistakes_are_one_line_exit_2(traces, tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"schema": "something/1"}')
    (tmp_path / "sweep.json").write_text(json.dumps({"schema": "pipesim.sweep/1", "rows": SWEEP_ROWS}))
    assert main(["plot", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "x.html").exists()


def test_a_data_parallel_measured_run_is_compared_through_its_first_replica():
    """dp 2 x pp 2 (ranks 0, 1 are pipeline rank 0's replicas; 2, 3 rank 1's): ranks 0 and 2 become 0 and 1, their
    peers renumbered, and the data-parallel all-reduce after each rank's last compute is left out (rank 0's too,
    which begins before rank 2's last compute ends and would otherwise stretch the pipeline span)."""
    events = [Event(r, "compute", "F", r // 2, 0, 0.0 + r // 2, 1.0 + r // 2) for r in range(4)]
    events += [Event(0, "send", "SEND_F", 0, 0, 1.0, 1.2, 64, peer=2),
               Event(2, "recv", "RECV_F", 1, 0, 0.5, 1.2, 64, peer=0),
               Event(0, "collective", "all_to_all", 0, 0, 0.2, 0.3, 8),
               Event(0, "collective", "all_reduce", -1, -1, 1.2, 2.5, 8),
               Event(2, "collective", "all_reduce", -1, -1, 2.0, 3.0, 8)]
    tl = Timeline("measured", "1f1b", 4, events, {"dp": 2, "pp": 2, "tp": 1})
    one = first_replica(tl)
    assert one.num_ranks == 2 and one.meta["replica"] == "data-parallel replica 1 of 2"
    assert sorted((e.rank, e.kind, e.peer) for e in one.events) == [
        (0, "F", -1), (0, "SEND_F", 1), (0, "all_to_all", -1), (1, "F", -1), (1, "RECV_F", 0)]
    assert first_replica(replace(tl, meta={"dp": 1, "pp": 4, "tp": 1})).num_ranks == 4  # nothing to pick
