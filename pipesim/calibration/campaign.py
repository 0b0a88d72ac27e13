"""The validation campaign behind `pipesim validate`: measure (or reload) the grid, calibrate on its fit runs,
predict every run, gather what the report shows.

The last step of the calibration flow: it drives `launch`, `calibrate`, `validation`, `isolated` and
`plots` and returns a `report.Report`; the command only parses flags and writes the markdown.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from pipesim.calibration.calibrate import calibrate
from pipesim.calibration.isolated import explain_gap
from pipesim.calibration.launcher import CYCLES, measure_rounds
from pipesim.calibration.measured import late_recv_delay, measured_metrics, trimmed_step, typical_run, typical_step
from pipesim.calibration.report import Report, load_line
from pipesim.calibration.validation import Row, make_row, predict, ranking_check, summarize, validation_plan
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.hardware.toml_io import hardware_to_toml
from pipesim.sim.result import SimResult
from pipesim.timeline import Timeline

CAMPAIGN_FILE = "campaign.json"  # in a --keep directory: how and when its timelines were measured
PLOTTED = ("fit-mlp-1f1b-m8", "mlp-p4-m8-zb-h1", "mlp-p4-m8-interleaved-1f1b", "gpt-p4-m4-zb-h1")


@dataclass(frozen=True)
class CampaignConfig:
    """What one `pipesim validate` asked for."""

    quick: bool  # the few small 2-rank runs of validation_plan(quick=True), one pass each
    workdirs: tuple[Path, ...]  # measure into the one directory, or (reuse) pool every directory's runs
    img: Path  # directory of the PNG plots
    out: Path  # the report file; plot paths are written relative to its directory
    png: bool  # write the PNG plots (they need Chromium)
    command: str  # the command line, as the report and campaign.json cite it
    rounds: int  # torchrun launches per world size; with reuse, the count when a directory holds no round*
    reuse: bool = False  # refit the kept timelines instead of measuring
    hardware: Hardware | None = None  # predict with this hardware file instead of fitting one to the fit runs
    hardware_source: str = ""  # where `hardware` came from, as the report names it


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_campaign(cfg: CampaignConfig) -> Report:
    """Measure (into the one workdir) or reload (every workdir's runs pooled), calibrate, predict, plot."""
    start, load_before = time.perf_counter(), load_line()
    plan = validation_plan(cfg.quick)
    cycles = 1 if cfg.quick else CYCLES
    rounds = cfg.rounds
    timelines: dict[str, list[Timeline]] = {}
    comm, sources = None, []
    for workdir in cfg.workdirs:
        if cfg.reuse:  # refit whatever the directory holds (cycles are found per run; rounds here)
            rounds = len([d for d in workdir.glob("round*") if d.is_dir()]) or rounds
        measuring = time.perf_counter(), time.time()
        got, c = measure_rounds(plan, workdir, rounds, cycles=cycles, reuse=cfg.reuse,
                                say=lambda t: _say(f"validate: {t}"))
        if cfg.reuse:
            sources.append(provenance(workdir))
        else:  # what a later --reuse of this directory reports as the timelines' origin
            (workdir / CAMPAIGN_FILE).write_text(json.dumps({
                "command": cfg.command, "started": measuring[1], "seconds": time.perf_counter() - measuring[0],
                "load_before": load_before, "load_after": load_line()}))
        comm = comm or c
        for key, tls in got.items():
            timelines.setdefault(key, []).extend(tls)
    if cfg.hardware is not None:  # validate the given file as it is: nothing refitted
        hw, summary = cfg.hardware, f"hardware file {cfg.hardware_source} ({cfg.hardware.name}), as given: not refitted"
    else:
        cal, _ = calibrate(quick=cfg.quick,
                           timelines={r["id"]: timelines[r["id"]] for r in plan if r["role"] == "fit"}, comm=comm)
        hw, summary = cal.hardware, cal.summary()
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
    explain = explain_gap(hw, explain_run, hw.host.cores if hw.host else 1)
    explain_measured = typical_step(timelines[explain_run["id"]])
    plots = _plots(plan, rows, typical, results, cfg)
    return Report(cfg.command, rows, fit, held, 2 * held0.mean_error, summary, hardware_to_toml(hw), explain,
                  explain_measured, _describe(explain_run), plots, load_before,
                  load_line(), time.perf_counter() - start, _spread(timelines),
                  max(len(tls) for tls in timelines.values()), _probes(timelines), sources,
                  hw.host.late_recv_delay if hw.host else 0.0, _interleaved_late_recvs(plan, timelines, hw, results))


def _interleaved_late_recvs(plan: list[dict], timelines: dict[str, list[Timeline]], hw: Hardware,
                            results: dict[str, SimResult]) -> list[tuple[str, float, float]]:
    """Interleaved runs with a core per rank: (id, their late RECVs' mean seconds, how much the predicted
    step moves when charged that mean instead of the fit runs')."""
    out = []
    if hw.host is None:  # a hardware file without a [host] profile has no late-RECV figure to vary
        return out
    for r in plan:
        if r["schedule"] == "interleaved-1f1b" and r["p"] <= hw.host.cores:
            own = late_recv_delay(timelines[r["id"]])
            moved = predict(hw.with_host(late_recv_delay=own), r).makespan / results[r["id"]].makespan - 1
            out.append((r["id"], own, moved))
    return out


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def provenance(workdir: Path) -> str:
    """Where a reused directory's timelines come from: its campaign.json, else the files' times."""
    meta = workdir / CAMPAIGN_FILE
    if meta.is_file():
        try:  # written by pipesim itself, but a reused folder is the user's: a broken one is said in one line
            c = json.loads(meta.read_text(encoding="utf-8"))
            return (f"`{workdir}` measured by `{c['command']}` from {_utc(c['started'])} for {c['seconds']:.0f} s "
                    f"(load before `{c['load_before']}`, after `{c['load_after']}`)")
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise PipesimError(f"{meta} is not a campaign record pipesim wrote ({type(exc).__name__}: {exc})") from None
    stamps = [f.stat().st_mtime for f in workdir.glob("round*/p*/*.json")]
    if not stamps:
        return f"`{workdir}`"
    return f"`{workdir}` timelines written {_utc(min(stamps))} to {_utc(max(stamps))}"


def _spread(timelines: dict[str, list[Timeline]]) -> list[tuple[float, float]]:
    """Per configuration with repeats: (slowest run's median step / fastest's - 1, median |run / median - 1|)."""
    out = []
    for tls in timelines.values():
        steps = [measured_metrics(tl)[0] for tl in tls]
        if len(steps) > 1:
            mid = statistics.median(steps)
            out.append((max(steps) / min(steps) - 1, statistics.median(abs(t / mid - 1) for t in steps)))
    return out


def _probes(timelines: dict[str, list[Timeline]]) -> list[float]:
    """Every run's speed probe (seconds), the witness of the machine's own speed."""
    return [float(tl.meta["probe"]) for tls in timelines.values() for tl in tls if tl.meta.get("probe")]


def _describe(run: dict) -> str:
    """`fit-mlp-1f1b-m8 (1f1b, mlp hidden 1024, 8 layers, batch 64, p 2, m 8)`."""
    m = run["model"]
    return (f"`{run['id']}` ({run['schedule']}, {m['kind']} hidden {m['hidden']}, {m['layers']} layers, "
            f"batch {m['batch']}, p {run['p']}, m {run['microbatches']})")


def _plots(plan: list[dict], rows: list[Row], typical: dict[str, Timeline], results: dict[str, SimResult],
           cfg: CampaignConfig) -> list[tuple[str, str]]:
    """Compare plots of a few runs and predicted-vs-measured scatter, as PNG next to the report."""
    if not cfg.png:
        return []
    from pipesim.calibration.plots import scatter_figure  # local import: plotly only when PNGs are asked for
    from pipesim.plots import compare_figure, write_png  # local import: plotly only when PNGs are asked for

    cfg.img.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(cfg.img, cfg.out.parent))
    made = []
    path = cfg.img / "validation-scatter.png"
    write_png(scatter_figure(rows), path)
    made.append(("Predicted vs measured step time, every configuration", str(rel / path.name)))
    wanted = [i for i in PLOTTED if i in results] or [plan[-1]["id"]]
    for run_id in wanted[: 2 if cfg.quick else len(wanted)]:
        measured = trimmed_step(typical[run_id], measured_metrics(typical[run_id])[2])
        fig = compare_figure(results[run_id].timeline(), measured)
        path = cfg.img / f"validation-{run_id}.png"
        write_png(fig, path)
        made.append((f"{run_id}: simulated (top) and measured (bottom)", str(rel / path.name)))
    return made
