"""Sweeps: simulate every (schedule, p, m, v) combination and keep one row of headline numbers each.

The rows (schema `pipesim.sweep/1`) feed the `pipesim sweep` table and `pipesim.plots.sweep_figure`.
Combinations a schedule does not admit (interleaved with m not a multiple of p, too many devices,
a model that does not fit) are skipped with the reason, never silently.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator
from dataclasses import replace

from tqdm import tqdm

import schedules as registry
from pipesim.cost.v_search import SEARCHED
from pipesim.errors import PipesimError
from pipesim.sim.sim_setup import SimSetup
from pipesim.units import format_bytes

SCHEMA = "pipesim.sweep/1"


def combinations(schedules: list[str], stages: list[int], microbatches: list[int],
                 virtual: list[int] | None = None) -> Iterator[tuple[str, int, int, int]]:
    """(schedule, p, m, v) in a stable order; v only varies for schedules that take --virtual."""
    for name in schedules:
        spec = registry.spec(name)  # unknown name: PipesimError up front
        vs = sorted(set(virtual)) if (spec.virtual and virtual) else [spec.default_virtual]
        for p in stages:
            for m in microbatches:
                for v in vs:
                    yield name, p, m, v


def run_one(setup: SimSetup, name: str, p: int, m: int, v: int, samples: int = 8) -> dict:
    """One row: makespan (s), bubble fraction, peak activation bytes and in-flight, link utilization; with a
    what-if (`setup.perturb`) the row is the unperturbed step's, plus the perturbed one's (`what_if`)."""
    sched = registry.build(name, p, m, v)  # valid by construction; the simulator reports deadlocks
    pert = setup.perturb
    if pert:
        setup = replace(setup, perturb=None)
    result, memory = setup.evaluate(sched)
    extra = {"what_if": _what_if(setup, sched, pert, samples, result.makespan)} if pert else {}
    classes = result.link_class_stats()
    peaks = result.peak_activation_bytes()

    return {
        "schedule": name, "stages": p, "microbatches": m, "virtual": v,
        "makespan": result.makespan, "bubble_fraction": result.bubble_fraction,
        "peak_activation_bytes": max(peaks, default=0), "peak_inflight": max(result.peak_inflight, default=0),
        "link_utilization": {k: c["max_utilization"] for k, c in classes.items()},
        "actions": result.num_actions(),
        # the largest rank's peak: parameters + gradients + optimizer states + activations + buffers (None: --cost)
        "peak_memory_bytes": max(m.total for m in memory) if memory else None,
        **extra,
    }


def _what_if(setup: SimSetup, sched, pert, samples: int, ideal: float) -> dict:
    """The perturbed makespan: one run, or with jitter the mean of `samples` draws (seeds seed .. seed + samples - 1)
    and their standard deviation; `loss_fraction` against the unperturbed `ideal`."""
    costs = setup.costs(sched)
    tuned = setup.tuned(sched, costs)
    draws = samples if pert.jitter else 1
    spans = [replace(setup, perturb=replace(pert, seed=pert.seed + k)).simulate(tuned, costs).makespan
             for k in range(draws)]
    mean = statistics.fmean(spans)
    return {"perturbation": pert.describe(), "samples": draws, "makespan": mean,
            "makespan_std": statistics.pstdev(spans) if draws > 1 else 0.0,
            "loss_fraction": mean / ideal - 1 if ideal > 0 else 0.0}


def run_sweep(schedules: list[str], stages: list[int], microbatches: list[int], virtual: list[int] | None,
              setup: SimSetup, *, skipped: list[dict] | None = None, progress: bool = False,
              samples: int = 8) -> list[dict]:
    """Rows for every admitted combination; the others go to `skipped` (with a `reason`) when given."""
    combos = list(combinations(schedules, stages, microbatches, virtual))
    rows: list[dict] = []
    plain = replace(setup, ilp_time_limit=None, memory_limit=None)  # --ilp / --memory-limit order searched ones
    for name, p, m, v in _progress(combos, progress):
        try:
            rows.append(run_one(setup if name in SEARCHED else plain, name, p, m, v, samples))
        except PipesimError as exc:
            if skipped is not None:
                skipped.append({"schedule": name, "stages": p, "microbatches": m, "virtual": v, "reason": str(exc)})
    return rows


def _progress(items: list, show: bool) -> Iterable:
    if not show:
        return items
    return tqdm(items, desc="sweep", unit="run", disable=None, leave=False)


def to_dict(rows: list[dict], setup: SimSetup, skipped: list[dict] | None = None) -> dict:
    """The `pipesim.sweep/1` JSON object."""
    hw = setup.hardware
    return {
        "schema": SCHEMA,
        "hardware": hw.name if hw is not None else None,
        "comm": "links" if setup.comm and hw is not None else "none",
        "model": setup.model.to_dict() if setup.model is not None and setup.cost is None else None,
        "cost": setup.cost,
        "dp": setup.job.dp, "tp": setup.job.tp,
        "options": setup.options(),
        "rows": rows,
        "skipped": skipped or [],
    }


def format_table(rows: list[dict], skipped: list[dict] | None = None) -> str:
    """Plain-text table: makespan in ms (or the cost unit), bubble %, peak activation memory."""
    head = (f"{'schedule':<18} {'p':>3} {'m':>5} {'v':>2} {'makespan':>12} {'bubble':>7} {'peak act':>11} "
            f"{'in-flight':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['schedule']:<18} {r['stages']:>3} {r['microbatches']:>5} {r['virtual']:>2} "
                     f"{_time(r['makespan']):>12} {r['bubble_fraction'] * 100:6.1f}% "
                     f"{format_bytes(r['peak_activation_bytes']):>11} {r['peak_inflight']:>9}")
    for s in skipped or []:
        lines.append(f"{s['schedule']:<18} {s['stages']:>3} {s['microbatches']:>5} {s['virtual']:>2}  skipped: "
                     f"{s['reason']}")
    ranked = sorted((r for r in rows if "what_if" in r), key=lambda r: (r["what_if"]["makespan"], r["schedule"]))
    if ranked:
        w = ranked[0]["what_if"]
        draws = f", mean of {w['samples']} draws" if w["samples"] > 1 else ""
        lines += ["", f"ranked by the expected makespan under {w['perturbation']}{draws}:"]
        for n, r in enumerate(ranked, start=1):
            x = r["what_if"]
            spread = f" +- {_time(x['makespan_std'])}" if x["samples"] > 1 else ""
            lines.append(f"{n:>3}. {r['schedule']:<18} p {r['stages']} m {r['microbatches']} v {r['virtual']}: "
                         f"{_time(x['makespan'])}{spread} ({x['loss_fraction']:+.1%} over its ideal "
                         f"{_time(r['makespan'])})")
    return "\n".join(lines)


def _time(seconds: float) -> str:
    if seconds >= 1 or seconds == 0:
        return f"{seconds:.4g} s"
    return f"{seconds * 1e3:.4g} ms"

