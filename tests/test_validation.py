"""Validation campaign: metrics, ranking check and report on exact synthetic numbers; the --quick run for real."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

import schedules
from pipesim.calibration.measured import measured_metrics, trimmed_step
from pipesim.calibration.plots import scatter_figure
from pipesim.calibration.report import Report, render
from pipesim.calibration.validation import Row, predict, ranking_check, summarize, validation_plan
from pipesim.hardware.toml_io import load_hardware
from pipesim.timeline import Event, Timeline


def _row(rid: str, schedule: str, measured: float, predicted: float, role: str = "held-out", p: int = 2) -> Row:
    return Row(rid, "mlp", schedule, p, 8, 1, role, measured, predicted, 0.25, 0.5)


def test_summarize_exact_errors():
    rows = [_row("a", "gpipe", 0.100, 0.105), _row("b", "1f1b", 0.200, 0.180), _row("c", "zb-h1", 0.400, 0.400)]
    s = summarize(rows)
    assert s.count == 3
    assert s.mean_error == pytest.approx((0.05 + 0.10 + 0.0) / 3)
    assert s.max_error == pytest.approx(0.10)
    assert s.mean_bubble_error == pytest.approx(0.25)
    assert summarize([]).count == 0


def test_ranking_check_counts_only_gaps_above_threshold():
    rows = [_row("a", "gpipe", 1.00, 1.20), _row("b", "1f1b", 1.05, 1.00),  # gap 5 %: not checked
            _row("c", "naive", 2.00, 2.10), _row("d", "zb-h1", 0.80, 1.10),
            _row("e", "naive", 1.0, 1.0, p=4)]  # alone in its group
    r = ranking_check(rows, threshold=0.10)
    # checked pairs (gap > 10 %): 1f1b-naive, 1f1b-zb-h1, gpipe-naive, gpipe-zb-h1, naive-zb-h1
    assert r.pairs_checked == 5
    assert r.violations == ["mlp p=2 m=8: 1f1b vs zb-h1 (measured gap 31.2%)"]
    assert r.pairs_preserved == 4


def _timeline() -> Timeline:
    """Two ranks, three steps (step 0 is warmup). Rank 1 waits in a RECV before the step's first compute."""
    ev = []
    for step, (span_f, span_b) in enumerate([(1.0, 2.0), (1.0, 2.0), (2.0, 4.0), (1.0, 3.0)]):
        t = 100.0 * step
        ev += [Event(1, "recv", "RECV_F", 1, 0, t - 5.0, t + span_f, step=step),
               Event(0, "compute", "F", 0, 0, t, t + span_f, step=step),
               Event(1, "compute", "F", 1, 0, t + span_f, t + 2 * span_f, step=step),
               Event(1, "compute", "B", 1, 0, t + 2 * span_f, t + 2 * span_f + span_b, step=step),
               Event(0, "compute", "B", 0, 0, t + 2 * span_f + span_b, t + 2 * span_f + 2 * span_b, step=step)]
    return Timeline("measured", "naive", 2, ev, {"warmup": 1})


def test_measured_metrics_median_step_from_first_compute():
    span, bubble, step = measured_metrics(_timeline())
    # steps 1..3 spans: 6, 12, 8 -> median 8 (step 3); each rank computes 1 + 3 = 4 of 8
    assert (span, step) == (8.0, 3)
    assert bubble == pytest.approx(0.5)


def test_trimmed_step_clips_early_waits():
    tl = trimmed_step(_timeline(), 3)
    assert min(e.start for e in tl.events) == 0.0
    assert tl.makespan == 8.0
    recv = next(e for e in tl.events if e.stream == "recv")
    assert (recv.start, recv.end) == (0.0, 1.0)


def test_plan_splits_fit_and_held_out_and_every_run_builds():
    plan = validation_plan()
    fit = [r for r in plan if r["role"] == "fit"]
    held = [r for r in plan if r["role"] == "held-out"]
    assert {r["p"] for r in fit} == {2, 4} and sum(r["p"] == 4 for r in fit) == 1  # one oversubscribed fit run
    assert {r["p"] for r in held} == {2, 3, 4} and {r["model"]["kind"] for r in held} == {"mlp", "gpt"}
    assert {r["schedule"] for r in held} == {"naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1"}
    key = lambda r: (r["schedule"], r["p"], r["microbatches"], tuple(sorted(r["model"].items())))  # noqa: E731
    assert not {key(r) for r in fit} & {key(r) for r in held}
    assert len({r["id"] for r in plan}) == len(plan)
    for r in plan:
        sched = schedules.build(r["schedule"], r["p"], r["microbatches"], r.get("virtual"))
        assert r["model"]["batch"] % r["microbatches"] == 0 and r["model"]["layers"] >= sched.num_stages


def test_predict_is_the_simulate_command():
    run = {"schedule": "1f1b", "p": 2, "microbatches": 4, "virtual": None,
           "model": {"kind": "mlp", "hidden": 256, "layers": 4, "batch": 16}}
    hw = load_hardware("local-cpu")
    a, b = predict(hw, run), predict(hw, run)
    assert a.makespan == b.makespan > 0
    out = subprocess.run([sys.executable, "-m", "pipesim", "simulate", "1f1b", "-p", "2", "-m", "4", "--model", "mlp",
                          "--hidden", "256", "--layers", "4", "--batch", "16", "--hardware", "local-cpu", "--json"],
                         capture_output=True, text=True, timeout=120)
    import json

    assert json.loads(out.stdout)["makespan"] == a.makespan


def test_scatter_figure_points():
    rows = [_row("a", "gpipe", 0.100, 0.105, role="fit"), _row("b", "1f1b", 0.200, 0.180)]
    fig = scatter_figure(rows)
    pts = {t.name: (list(t.x), list(t.y)) for t in fig.data if t.mode == "markers"}
    assert pts["fit"] == ([100.0], [105.0]) and pts["held-out"] == ([200.0], [180.0])


def _report(rows: list[Row]) -> Report:
    held = summarize([r for r in rows if r.role == "held-out"])
    return Report("pipesim validate", rows, summarize([r for r in rows if r.role == "fit"]), held, 0.1, "figures",
                  "name = \"x\"\n", [("naive", 0.05), ("full", 0.1)], 0.1, "run-x", [("scatter", "img/s.png")],
                  "load 1", "load 2", 12.0)


def test_render_table_and_verdict():
    rows = [_row("a", "gpipe", 0.100, 0.103, role="fit"), _row("b", "1f1b", 0.200, 0.192)]
    text = render(_report(rows))
    assert "| b | held-out | mlp | 1f1b | 2 | 8 | 1 | 200.0 | 192.0 | -4.0 % | 25.0 % | 50.0 % |" in text
    assert "| held-out | 1 | 4.0 % | 4.0 % | 25.0 |" in text
    assert "**met**" in text and "| naive | 50.0 | -50.0 % |" in text and "![scatter](img/s.png)" in text
    worse = render(_report([_row("b", "1f1b", 0.200, 0.250)]))
    assert "**NOT met**" in worse
    assert "here its late RECVs averaged" not in text  # no interleaved run: no sentence
    late = replace(_report(rows), late_recv=0.8e-3, interleaved_late=[("i2", 1.25e-3, 0.031), ("j2", 0.9e-3, -0.004)])
    assert ("here its late RECVs averaged 1.25 ms (`i2`), 0.90 ms (`j2`) against 0.80 ms in the fit runs"
            in render(late)) and "its predicted step moves by +3.1 %, -0.4 %." in render(late)


def test_report_prose_cites_no_campaign_but_its_own():
    """Figures of other campaigns live in docs/validation-notes.md: the only date generated is today's."""
    rows = [_row("a", "gpipe", 0.100, 0.103, role="fit"), _row("b", "1f1b", 0.200, 0.192)]
    text = render(replace(_report(rows), late_recv=0.8e-3, interleaved_late=[("i2", 1.25e-3, 0.031)]))
    dated = [line for line in text.splitlines() if re.search(r"20\d\d-\d\d|\d\d:\d\d UTC", line)]
    assert len(dated) == 1 and dated[0].startswith("Generated by")
    assert "docs/validation-notes.md" in text


def test_report_counts_the_crowded_gpt_runs_predicted_short():
    gpt = [replace(_row(f"g{i}", name, 0.100, pred, p=4), model="gpt")
           for i, (name, pred) in enumerate([("naive", 0.090), ("1f1b", 0.095), ("zb-h1", 0.104)])]
    text = render(_report([_row("a", "gpipe", 0.100, 0.103, role="fit"), *gpt]))
    assert "the GPT on 4 ranks is predicted short for 2 of its 3 schedules, naive included (mean error -3.7 %)" in text
    over = render(_report([_row("a", "gpipe", 0.100, 0.103, role="fit"), gpt[2]]))
    assert "predicted short for 0 of its 1 schedules (mean error +4.0 %)" in over and "naive included" not in over
    assert "is predicted short" not in render(_report([_row("a", "gpipe", 0.100, 0.103)]))  # no crowded GPT: none


def test_provenance_of_a_reused_directory(tmp_path):
    from pipesim.calibration.campaign import CAMPAIGN_FILE
    from pipesim.calibration.campaign import provenance as _provenance

    assert _provenance(tmp_path) == f"`{tmp_path}`"  # nothing measured there
    run = tmp_path / "round0" / "p2" / "fit-a.json"
    run.parent.mkdir(parents=True)
    run.write_text("{}")
    os.utime(run, (0, 86400 + 3600))  # without campaign.json: the timelines' file times
    assert _provenance(tmp_path) == f"`{tmp_path}` timelines written 1970-01-02 01:00 UTC to 1970-01-02 01:00 UTC"
    (tmp_path / CAMPAIGN_FILE).write_text(json.dumps({"command": "pipesim validate --keep d", "started": 86400.0,
                                                      "seconds": 61.4, "load_before": "a", "load_after": "b"}))
    assert _provenance(tmp_path) == (f"`{tmp_path}` measured by `pipesim validate --keep d` from 1970-01-02 00:00 UTC "
                                     "for 61 s (load before `a`, after `b`)")


def _configs(text: str) -> str:
    return text[text.index("## All configurations"):]


def test_validate_quick_end_to_end_and_reuse(tmp_path):
    out, again, kept = tmp_path / "v.md", tmp_path / "again.md", tmp_path / "runs"
    cmd = [sys.executable, "-m", "pipesim", "validate", "--quick", "--no-png"]
    proc = subprocess.run([*cmd, "--out", str(out), "--keep", str(kept)], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.count("| held-out | mlp |") == 2 and text.count("| fit | mlp |") == 2
    assert "load average" in text and "[intra]" in text
    assert "held-out: 2 configurations" in proc.stdout
    # the same measurements, refitted: the fit is deterministic, so the table is identical
    proc = subprocess.run([*cmd, "--out", str(again), "--reuse", str(kept)], capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stderr
    assert _configs(again.read_text()) == _configs(text)
    missing = subprocess.run([*cmd, "--out", str(again), "--reuse", str(tmp_path / "none")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 2 and "no such directory" in missing.stderr
    # several kept campaigns pool: every configuration then has the runs of all of them
    pooled = tmp_path / "pooled.md"
    proc = subprocess.run([*cmd, "--out", str(pooled), "--reuse", str(kept), str(kept)], capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr
    pooled_text = pooled.read_text()
    assert "each configuration ran 2 times" in pooled_text
    # each reused directory is named with the command that measured it (kept in its campaign.json)
    meta = json.loads((kept / "campaign.json").read_text())
    assert "--keep" in meta["command"] and meta["seconds"] > 0 and "load average" in meta["load_after"]
    assert pooled_text.count(f"`{kept}` measured by `{meta['command']}`") == 2
    assert "refitted here" not in text  # a measuring run names no sources
    assert "each configuration ran" not in text  # one run each: "measured once"
    for bad, why in ((["--rounds", "0"], "--rounds 0: must be between 1 and 100"),
                     (["--rounds", "2", "--reuse", str(kept)], "give one of them")):
        proc = subprocess.run([*cmd, "--out", str(again), *bad], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and why in proc.stderr and "Traceback" not in proc.stderr
    # a kept folder is the user's: a file that is not what the worker wrote stops the refit in one line naming it
    runs = kept / "round0" / "p2"
    timeline = sorted(p for p in runs.glob("*.json") if p.name != "comm.json" and ".cycle" not in p.name)[0]
    for name, edit, why in (
            ("meta", lambda d: d["meta"].update(m=d["meta"]["m"] + 1), "not the executor's timeline of run"),
            ("steps", lambda d: d.update(events=[]), "holds 0 steps, none after the"),
            ("instant", lambda d: next(e for e in d["events"] if e["stream"] == "compute").update(end=0.0, start=0.0),
             "takes no time (start = end 0.0)"),
            ("comm", None, "its 'pingpong' must be [bytes, seconds] pairs of positive numbers")):
        broken = tmp_path / f"broken-{name}"
        shutil.copytree(kept, broken)
        target = broken / "round0" / "p2" / (timeline.name if edit else "comm.json")
        data = json.loads(target.read_text())
        edit(data) if edit else data.update(pingpong=[[1024, "fast"]])
        target.write_text(json.dumps(data))
        proc = subprocess.run([*cmd, "--out", str(again), "--reuse", str(broken)], capture_output=True, text=True,
                              timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and lines[-1].startswith(f"pipesim: error: {target}: ") and why in lines[-1]
        assert "Traceback" not in proc.stderr
