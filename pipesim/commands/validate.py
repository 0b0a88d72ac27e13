"""`pipesim validate`: measure the validation grid, calibrate on its 2-rank part, predict the rest, write the report."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from pipesim.calibrate_launch import CYCLES
from pipesim.errors import PipesimError

EXAMPLES = """examples:
  pipesim validate                              # the full grid, 48 runs each (~35 min on 2 cores) -> docs/validation.md
  pipesim validate --rounds 3 --out /tmp/v.md   # a quarter of the runs (~9 min): noisier, see docs/validation.md
  pipesim validate --quick --out /tmp/v.md --img-dir /tmp/img   # 4 small 2-rank runs (the test uses this)
  pipesim validate --keep runs/                 # keep the measured timelines for pipesim plot
  pipesim validate --reuse runs/                # refit and rewrite the report from kept timelines
  pipesim validate --reuse a/ b/ c/             # pool kept campaigns: every configuration's runs from all
"""

VALIDATE_ROUNDS = 12  # torchrun launches per world size (x CYCLES passes: 48 runs per configuration; fewer: noisier)
PLOTTED = ("fit-mlp-1f1b-m8", "mlp-p4-m8-zb-h1", "mlp-p4-m8-interleaved-1f1b", "gpt-p4-m4-zb-h1")


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="simulated vs measured step time and bubble -> docs/validation.md",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few small 2-rank runs (seconds; for tests)")
    p.add_argument("--out", default="docs/validation.md", metavar="FILE.md", help="report (default docs/validation.md)")
    p.add_argument("--img-dir", default=None, metavar="DIR", help="plots (default docs/img next to the report)")
    p.add_argument("--no-png", action="store_true", help="skip the PNG plots (they need Chromium)")
    p.add_argument("--keep", metavar="DIR", help="keep the measured timelines in DIR")
    p.add_argument("--reuse", metavar="DIR", nargs="+",
                   help="do not measure: refit and report the timelines kept in DIR (several: pooled)")
    p.add_argument("--rounds", type=int, default=None, metavar="N",
                   help=f"torchrun launches per world size, each {CYCLES} passes over the plan (default "
                        f"{VALIDATE_ROUNDS}: {CYCLES * VALIDATE_ROUNDS} runs per configuration, ~35 min on 2 cores; "
                        "calibrate's default is fewer); fewer are quicker, noisier")
    p.set_defaults(func=run)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if not out.parent.is_dir():
        raise PipesimError(f"cannot write {out}: directory {out.parent} does not exist")
    img = Path(args.img_dir) if args.img_dir else out.parent / "img"
    if args.rounds is not None and not 1 <= args.rounds <= 100:
        raise PipesimError(f"--rounds {args.rounds}: must be between 1 and 100")
    if args.reuse and args.rounds is not None:
        raise PipesimError("--rounds measures; --reuse refits kept timelines: give one of them")
    for d in args.reuse or []:
        if not Path(d).is_dir():
            raise PipesimError(f"--reuse {d}: no such directory")
    with tempfile.TemporaryDirectory(prefix="pipesim-validate-") as tmp:
        workdirs = [Path(d) for d in args.reuse] if args.reuse else [Path(args.keep or tmp)]
        report = campaign(args.quick, workdirs, img, out, not args.no_png,
                          " ".join(["pipesim", "validate", *sys.argv[2:]]) if sys.argv[1:2] == ["validate"]
                          else "pipesim validate", reuse=bool(args.reuse), rounds=args.rounds)
    from pipesim.validation_report import render

    out.write_text(render(report))
    h = report.held
    print(f"held-out: {h.count} configurations, mean error {h.mean_error:.1%}, max {h.max_error:.1%}; "
          f"fit: mean {report.fit.mean_error:.1%}; ranking {h.pairs_preserved}/{h.pairs_checked} pairs kept")
    print(f"wrote {out}")
    return 0


def campaign(quick: bool, workdirs: list[Path], img: Path, out: Path, png: bool, command: str,
             reuse: bool = False, rounds: int | None = None):
    """Measure (into the one workdir) or reload (every workdir's runs pooled), calibrate, predict, plot;
    returns a validation_report.Report."""
    from pipesim.calibrate import calibrate
    from pipesim.calibrate_launch import measure_rounds
    from pipesim.hardware_toml import hardware_to_toml
    from pipesim.measured import typical_run, typical_step
    from pipesim.validation import make_row, predict, ranking_check, summarize, validation_plan
    from pipesim.validation_report import Report, load_line

    start, load_before = time.perf_counter(), load_line()
    plan = validation_plan(quick)
    cycles = 1 if quick else CYCLES
    rounds = rounds or (1 if quick else VALIDATE_ROUNDS)
    timelines: dict = {}
    comm, sources = None, []
    for workdir in workdirs:
        if reuse:  # refit whatever the directory holds (cycles are found per run; rounds here)
            rounds = len([d for d in workdir.glob("round*") if d.is_dir()]) or rounds
        measuring = time.perf_counter(), time.time()
        got, c = measure_rounds(plan, workdir, rounds, cycles=cycles, reuse=reuse,
                                say=lambda t: _say(f"validate: {t}"))
        if reuse:
            sources.append(_provenance(workdir))
        else:  # what a later --reuse of this directory reports as the timelines' origin
            (workdir / CAMPAIGN_FILE).write_text(json.dumps({
                "command": command, "started": measuring[1], "seconds": time.perf_counter() - measuring[0],
                "load_before": load_before, "load_after": load_line()}))
        comm = comm or c
        for key, tls in got.items():
            timelines.setdefault(key, []).extend(tls)
    cal, _ = calibrate(quick=quick, timelines={r["id"]: timelines[r["id"]] for r in plan if r["role"] == "fit"},
                       comm=comm)
    hw = cal.hardware
    rows, results, typical = [], {}, {}
    for r in plan:
        results[r["id"]] = predict(hw, r)
        typical[r["id"]] = typical_run(timelines[r["id"]])
        rows.append(make_row(r, timelines[r["id"]], results[r["id"]]))
    fit = summarize([r for r in rows if r.role == "fit"])
    held0 = summarize([r for r in rows if r.role == "held-out"])
    rank = ranking_check(rows, 2 * held0.mean_error)
    held = replace(held0, pairs_checked=rank.pairs_checked, pairs_preserved=rank.pairs_preserved,
                   violations=rank.violations)
    explain_run = next((r for r in plan if r["id"] == "fit-mlp-1f1b-m8"), None) or next(
        r for r in plan if r["schedule"] == "1f1b")
    _say("validate: isolated single-process stage times (issue 6, item 4) ...")
    from pipesim.calibrate_isolated import explain_gap

    explain = explain_gap(hw, explain_run, cal.hardware.host_cores or 1)
    explain_measured = typical_step(timelines[explain_run["id"]])
    plots = _plots(plan, rows, typical, results, img, out, png, quick)
    return Report(command, rows, fit, held, 2 * held0.mean_error, cal.summary(), hardware_to_toml(hw), explain,
                  explain_measured, _describe(explain_run), plots, load_before,
                  load_line(), time.perf_counter() - start, _spread(timelines),
                  max(len(tls) for tls in timelines.values()), _probes(timelines), sources,
                  hw.late_recv_delay, _interleaved_late_recvs(plan, timelines, hw, results))


def _interleaved_late_recvs(plan: list[dict], timelines: dict, hw, results: dict) -> list[tuple[str, float, float]]:
    """Interleaved runs with a core per rank: (id, their late RECVs' mean seconds, how much the predicted
    step moves when charged that mean instead of the fit runs')."""
    from pipesim.measured import late_recv_delay
    from pipesim.validation import predict

    out = []
    for r in plan:
        if r["schedule"] == "interleaved-1f1b" and r["p"] <= (hw.host_cores or r["p"]):
            own = late_recv_delay(timelines[r["id"]])
            moved = predict(replace(hw, late_recv_delay=own), r).makespan / results[r["id"]].makespan - 1
            out.append((r["id"], own, moved))
    return out


CAMPAIGN_FILE = "campaign.json"  # in a --keep directory: how and when its timelines were measured


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def _provenance(workdir: Path) -> str:
    """Where a reused directory's timelines come from: its campaign.json, else the files' times."""
    meta = workdir / CAMPAIGN_FILE
    if meta.is_file():
        c = json.loads(meta.read_text())
        return (f"`{workdir}` measured by `{c['command']}` from {_utc(c['started'])} for {c['seconds']:.0f} s "
                f"(load before `{c['load_before']}`, after `{c['load_after']}`)")
    stamps = [f.stat().st_mtime for f in workdir.glob("round*/p*/*.json")]
    if not stamps:
        return f"`{workdir}`"
    return f"`{workdir}` timelines written {_utc(min(stamps))} to {_utc(max(stamps))}"


def _spread(timelines: dict) -> list[tuple[float, float]]:
    """Per configuration with repeats: (slowest run's median step / fastest's - 1, median |run / median - 1|)."""
    import statistics

    from pipesim.measured import measured_metrics

    out = []
    for tls in timelines.values():
        steps = [measured_metrics(tl)[0] for tl in tls]
        if len(steps) > 1:
            mid = statistics.median(steps)
            out.append((max(steps) / min(steps) - 1, statistics.median(abs(t / mid - 1) for t in steps)))
    return out


def _probes(timelines: dict) -> list[float]:
    """Every run's speed probe (seconds), the witness of the machine's own speed."""
    return [float(tl.meta["probe"]) for tls in timelines.values() for tl in tls if tl.meta.get("probe")]


def _describe(run: dict) -> str:
    """`fit-mlp-1f1b-m8 (1f1b, mlp hidden 1024, 8 layers, batch 64, p 2, m 8)`."""
    m = run["model"]
    return (f"`{run['id']}` ({run['schedule']}, {m['kind']} hidden {m['hidden']}, {m['layers']} layers, "
            f"batch {m['batch']}, p {run['p']}, m {run['microbatches']})")


def _plots(plan, rows, typical, results, img: Path, out: Path, png: bool, quick: bool) -> list[tuple[str, str]]:
    """Compare plots of a few runs and predicted-vs-measured scatter, as PNG next to the report."""
    if not png:
        return []
    import os

    from pipesim.measured import measured_metrics, trimmed_step
    from pipesim.plots import compare_figure, write_png
    from pipesim.validation_plots import scatter_figure

    img.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(img, out.parent))
    made = []
    path = img / "validation-scatter.png"
    write_png(scatter_figure(rows), path)
    made.append(("Predicted vs measured step time, every configuration", str(rel / path.name)))
    wanted = [i for i in PLOTTED if i in results] or [plan[-1]["id"]]
    for run_id in wanted[: 2 if quick else len(wanted)]:
        measured = trimmed_step(typical[run_id], measured_metrics(typical[run_id])[2])
        fig = compare_figure(results[run_id].timeline(), measured)
        path = img / f"validation-{run_id}.png"
        write_png(fig, path)
        made.append((f"{run_id}: simulated (top) and measured (bottom)", str(rel / path.name)))
    return made
