"""What one kernel figure would explain: the residual of `pipesim bench published`, diagnosed and never applied.

For each `[[diagnosis]]` of bench/published_rows.toml: the value of one figure of the device's kernel profile
(`matmul_efficiency`, `memory_bound_efficiency`, ...: a `[device.kernels]` override on the row's hardware) at which the
simulator reproduces one anchor row exactly (bisection over `range`), then every goal row (shared/reference/
published.md's) of the anchor's device family simulated with that value, and the other sources' rows of that family
out of sample; an anchor on a family published.md has no row of (H100) is judged on those other rows alone. If one
figure solved on one row brings the other rows to their published values, the residual is that figure's; if it does
not, it lies in the mechanisms. The value is fitted to a row, so it is a diagnosis: no preset takes it, and every
prediction in the tables above uses the sourced figures.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from pipesim.device.profile import device_profile
from pipesim.hardware.toml_io import load_hardware

STEPS = 16  # bisection steps: the range / 2^16, finer than the figures' three significant digits


@dataclass(frozen=True)
class Diagnosis:
    """One figure solved on the anchor row, and the goal rows' results with it (bench Result objects)."""

    field: str
    shipped: float  # the family profile's figure (sourced)
    solved: float  # the value at which the anchor row is reproduced
    anchor: str  # row id
    results: list  # [Result] of the goal rows of the family (without any: the other sources' rows), with `solved`
    outside: list = dataclasses.field(default_factory=list)  # [Result] of other sources' rows on the same family
    family: str = ""  # the anchor's device family
    in_goal: bool = True  # `results` are published.md's rows (False: the family has none; the other rows instead)


def variant(bench: ModuleType, spec: str, field: str, value: float, directory: Path) -> Path:
    """Hardware `spec` with `[device.kernels] field = value` (a what-if file in `directory`, bench.hardware_variant)."""
    return bench.hardware_variant(spec, ((f"device.kernels.{field}", value), (
        "device.kernels.source", f"what-if diagnosis: {field} = {value:.6g} (not a measurement)")), directory)


def _on(argv: list[str], path: Path) -> list[str]:
    out = list(argv)
    out[out.index("--hardware") + 1] = str(path)
    return out


def solve(bench: ModuleType, row, field: str, lo: float, hi: float, directory: Path) -> float:
    """The figure in [lo, hi] at which `row` is predicted at its published value (its speed ratio 1): a lower figure
    is a slower kernel, so an optimistic prediction (ratio > 1) moves the upper end down."""
    argv, args = bench.parse_command(row.command)
    spec = argv[argv.index("--hardware") + 1]
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        sim = bench.run_argv(_on(argv, variant(bench, spec, field, mid, directory)), bench.needs_actions(row))
        ratio = bench.result(row, sim, args).speed_ratio
        if ratio is None:
            raise ValueError(f"diagnosis: row {row.id} failed at {field} = {mid}")
        lo, hi = (lo, mid) if ratio > 1 else (mid, hi)
    return (lo + hi) / 2


@lru_cache(maxsize=64)
def _spec_family(spec: str) -> str:
    """The device family of a hardware preset or file (read once: every diagnosis asks it of every row)."""
    return load_hardware(spec).device.family


def _family(bench: ModuleType, row) -> str:
    argv, _ = bench.parse_command(row.command)
    return _spec_family(argv[argv.index("--hardware") + 1])


def diagnose(data: dict, bench: ModuleType, goal: list, jobs: int, directory: Path,
             others: list | None = None) -> list[Diagnosis]:
    """Every [[diagnosis]] of the rows file: solve on its anchor, then run the `goal` rows with the value, and
    the `others` (rows outside the goal) whose hardware has the anchor's device family: an out-of-sample check."""
    by_id = {r.id: r for r in data["rows"]}
    out = []
    for d in data.get("diagnosis", []):
        anchor = by_id.get(d["anchor"])
        if anchor is None or anchor.published is None:
            continue  # a restricted run (--only) without the anchor row
        lo, hi = d["range"]
        value = round(solve(bench, anchor, d["field"], lo, hi, directory), 4)
        family = _family(bench, anchor)
        outside = [r for r in others or [] if r.published is not None and _family(bench, r) == family]
        own = [r for r in goal if _family(bench, r) == family]  # the solved figure is one family's
        in_goal = bool(own)
        if not in_goal:
            own, outside = outside, []
        runs = {}
        for r in [*own, *outside]:  # each row on its own hardware, with the solved figure over it
            argv = bench.parse_command(r.command)[0]
            spec_r = argv[argv.index("--hardware") + 1]
            runs[r.id] = _on(argv, variant(bench, spec_r, d["field"], value, directory))
        label = f"diagnosis {d['field']} = {value}"
        actions = {tuple(runs[r.id]) for r in [*own, *outside] if bench.needs_actions(r)}
        sims = bench.run_all(list(runs.values()), jobs, lambda _argv, label=label: label, actions)
        results = [bench.result(r, sims[tuple(runs[r.id])], bench.parse_command(r.command)[1])
                   for r in [*own, *outside]]
        out.append(Diagnosis(d["field"], getattr(device_profile(family), d["field"]), value, anchor.id,
                             results[:len(own)], results[len(own):], family, in_goal))
    return out


def lines(diagnoses: list[Diagnosis], stats, pct) -> list[str]:
    """The report's section: one table row per figure, then each source's signed errors with it."""
    if not diagnoses:
        return []
    out = ["", "## What one kernel figure would explain (a diagnosis, never applied)", "",
           "One figure of the anchor's device kernel profile, changed alone, solved so that the anchor row is "
           "reproduced exactly, then every goal row of that device family simulated with it (published.md's; for a "
           "family it has no row of, the other sources' rows of the family: 'rows' says which; "
           "bench/published_diagnosis.py). The value is fitted to a published row, so no preset takes it and "
           "nothing above uses it; it says where the residual lies: a figure that, solved on one row, brings every "
           "other row near its published value is the residual's cause, one that does not is not.", "",
           "| figure | family | shipped (sourced) | solved on | value | rows | median \\|error\\| | max \\|error\\| | "
           "signed mean (speed) | speed factor |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for d in diagnoses:
        s = stats(d.results)
        rows = f"{s.rows}" if d.in_goal else f"{s.rows} (other sources')"
        out.append(f"| `{d.field}` | {d.family} | {d.shipped:.3f} | {d.anchor} | {d.solved:.3f} | {rows} | "
                   f"{s.median_abs * 100:.1f} % | {s.max_abs * 100:.1f} % | {pct(s.signed_mean)} | "
                   f"{s.speed_factor:.3f} |")
    out.append("")
    for d in diagnoses:
        by_source: dict[str, list[str]] = {}
        for r in d.results:
            if r.error is not None:
                by_source.setdefault(r.row.source, []).append(f"{r.row.configuration} {pct(r.error)}")
        out.append(f"- `{d.field}` = {d.solved:.3f} ({d.family}): " + "; ".join(
            f"{src}: " + ", ".join(items) for src, items in by_source.items()) + ".")
    outside = [d for d in diagnoses if d.outside]
    if outside:
        out += ["", "Out of sample: the same value on the rows of other sources with the anchor's device family "
                "(not in published.md; not counted in the table above):", ""]
        out += [f"- `{d.field}` = {d.solved:.3f} ({d.family}): " + ", ".join(
            f"{r.row.source} {r.row.configuration} {pct(r.error)}" for r in d.outside if r.error is not None) + "."
            for d in outside]
    return out


__all__ = ["Diagnosis", "diagnose", "lines", "solve", "variant"]
