"""The validation campaign: predicted against measured step time and bubble, fitted on some runs, judged on the rest.

Practice from published simulators (Calculon, Proteus, SimAI): sweep configurations, fit the
machine's figures on part of them (the runs `pipesim calibrate` makes), and report the mean and max
absolute percentage error on the held-out ones, plus whether the ranking of schedules survives
wherever the measured gap is larger than twice the error.

Step time here is the pipeline's makespan: first compute start to last compute end of a step (the
first action is always 0F0 on rank 0, so ranks that started the step early and wait in a RECV do
not count, exactly as in the simulator). The optimizer step, which the simulator does not model,
is left out of both.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from itertools import combinations

from pipesim.calibration.measured import typical_metrics
from pipesim.calibration.plan import LECTURE_MLP, QUICK_MLP, SMALL_GPT, calibration_plan, run_spec, simulate_run
from pipesim.timeline import Timeline

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1")


def _group(tag: str, model: dict, p: int, m: int, names=SCHEDULES, **steps) -> list[dict]:
    return [run_spec(f"{tag}-p{p}-m{m}-{name}", name, m, model, p=p, v=2 if name == "interleaved-1f1b" else None,
                     **steps) for name in names]


def validation_plan(quick: bool = False) -> list[dict]:
    """All runs: the calibration runs (role 'fit') and the held-out grid (role 'held-out'), no run in both."""
    fit = [{**r, "role": "fit"} for r in calibration_plan(quick)]
    if quick:
        held = _group("mlp", QUICK_MLP, 2, 4, ("gpipe", "1f1b"), steps=3, warmup=1)
    else:
        held = (_group("mlp", LECTURE_MLP, 2, 8) + _group("mlp", LECTURE_MLP, 2, 4, ("naive", "1f1b", "zb-h1"))
                + _group("mlp", LECTURE_MLP, 3, 8, ("naive", "gpipe", "1f1b", "zb-h1"))
                + _group("mlp", LECTURE_MLP, 4, 8) + _group("gpt", SMALL_GPT, 2, 4) + _group("gpt", SMALL_GPT, 4, 4))
    def key(r: dict) -> tuple:
        return r["schedule"], r["p"], r["microbatches"], tuple(sorted(r["model"].items()))

    fit_keys = {key(r) for r in fit}
    held = [{**r, "role": "held-out"} for r in held if key(r) not in fit_keys]
    return fit + held


@dataclass(frozen=True)
class Row:
    """One configuration: measured and predicted step time (seconds) and bubble (fraction)."""

    id: str
    model: str  # "mlp" | "gpt"
    schedule: str
    p: int
    m: int
    v: int
    role: str  # "fit" | "held-out"
    measured: float  # seconds
    predicted: float  # seconds
    measured_bubble: float
    predicted_bubble: float

    @property
    def error(self) -> float:
        """Absolute percentage error of the step time, as a fraction."""
        return abs(self.predicted / self.measured - 1.0)


@dataclass(frozen=True)
class Summary:
    """Errors over a set of rows (fractions) and the ranking check."""

    count: int
    mean_error: float
    max_error: float
    mean_bubble_error: float  # mean |predicted - measured| bubble, fraction of the step
    pairs_checked: int = 0
    pairs_preserved: int = 0
    violations: list[str] = field(default_factory=list)


def summarize(rows: list[Row]) -> Summary:
    if not rows:
        return Summary(0, 0.0, 0.0, 0.0)
    errs = [r.error for r in rows]
    bub = [abs(r.predicted_bubble - r.measured_bubble) for r in rows]
    return Summary(len(rows), statistics.fmean(errs), max(errs), statistics.fmean(bub))


def ranking_check(rows: list[Row], threshold: float) -> Summary:
    """Schedules compared within each (model, p, m): where the measured gap exceeds `threshold`, is the order kept?"""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.model, r.p, r.m), []).append(r)
    checked = kept = 0
    bad = []
    for key in sorted(groups):
        for a, b in combinations(sorted(groups[key], key=lambda r: r.schedule), 2):
            gap = abs(a.measured - b.measured) / min(a.measured, b.measured)
            if gap <= threshold:
                continue
            checked += 1
            if (a.measured < b.measured) == (a.predicted < b.predicted):
                kept += 1
            else:
                bad.append(f"{key[0]} p={key[1]} m={key[2]}: {a.schedule} vs {b.schedule} (measured gap {gap:.1%})")
    s = summarize(rows)
    return replace(s, pairs_checked=checked, pairs_preserved=kept, violations=bad)


def predict(hw, run: dict):
    """Simulate one planned run on `hw` as `pipesim simulate --hardware` would; returns the SimResult."""
    return simulate_run(hw, run)


def make_row(run: dict, measured: list[Timeline], result) -> Row:
    """The row of one configuration: its repeats' typical step and bubble (`typical_metrics`) against `result`."""
    span, bubble = typical_metrics(measured)
    return Row(run["id"], run["model"]["kind"], run["schedule"], run["p"], run["microbatches"],
               run.get("virtual") or 1, run["role"], span, result.makespan, bubble, result.bubble_fraction)


__all__ = ["Row", "Summary", "make_row", "predict", "ranking_check", "summarize", "validation_plan"]
