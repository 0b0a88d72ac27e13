"""Profiler traces of real pipeline runs -> pipesim timelines (`pipesim import-trace`).

`chrome` reads Kineto Chrome traces (one file per rank), `actions` finds torch.distributed.pipelining's
actions and P2P in them, `build` (here) lays them out as a measured `Timeline` whose metadata carries
the schedule, ranks, stages and microbatches, so `pipesim plot` compares it with a simulation.
"""

from __future__ import annotations

import statistics

import schedules as registry
from pipesim.errors import PipesimError
from pipesim.timeline import Event, Timeline
from pipesim.trace_import.actions import COMPUTE_KINDS, Found, find_actions, spelling
from pipesim.trace_import.chrome import RankTrace, read_rank_traces

NOT_FOUND = ("no pipeline actions found in {files} (expected torch.distributed.pipelining's record_function "
             "ranges 'PP:<action>' or 'Forward i'/'Backward i', or its stage.py frames in a with_stack trace)")


def compute_orders(per_rank: list[list[Found]], step: int = 0) -> list[list[tuple[int, str, int]]]:
    """Each rank's (stage, kind, microbatch) compute actions of one step, in the order they ran."""
    return [[(f.stage, f.kind, f.microbatch) for f in found if f.kind in COMPUTE_KINDS and f.step == step]
            for found in per_rank]


def infer_schedule(orders: list[list[tuple[int, str, int]]], stages: int, microbatches: int) -> str | None:
    """The first registered schedule whose per-rank compute order equals `orders` (None: none does)."""
    ranks = len(orders)
    if ranks < 1 or stages % ranks:
        return None
    for name in registry.names():
        try:
            sched = registry.build(name, ranks, microbatches, stages // ranks)
        except (PipesimError, ValueError):
            continue
        ours = [[(a.stage, a.kind.value, a.microbatch) for a in prog if a.is_compute] for prog in sched.programs]
        if ours == orders:
            return name
    return None


def _check_complete(per_rank: list[list[Found]], traces: list[RankTrace]) -> tuple[int, int, int]:
    """(stages, microbatches, steps); PipesimError when a rank shows no action or steps are partial."""
    computes = [f for found in per_rank for f in found if f.kind in COMPUTE_KINDS]
    idle = [t.rank for t, found in zip(traces, per_rank) if not any(f.kind in COMPUTE_KINDS for f in found)]
    if idle:
        raise PipesimError(f"rank {idle[0]} shows no pipeline action in {traces[idle[0]].path} "
                           f"(a trace of another run, or the profiler did not cover the schedule's steps)")
    stages = max(f.stage for f in computes) + 1
    micro = max(f.microbatch for f in computes) + 1
    steps = max(f.step for f in computes) + 1
    forwards = sum(1 for f in computes if f.kind == "F")
    if forwards != stages * micro * steps:
        raise PipesimError(f"the traces hold {forwards} forwards, not {stages} stages x {micro} microbatches x "
                           f"{steps} steps: a step is cut off (profile whole steps) or ranks come from different runs")
    return stages, micro, steps


def import_traces(paths: list[str], schedule: str | None = None) -> Timeline:
    """A measured timeline from one profiler trace per rank (files or folders); `schedule` names it,
    else it is inferred from the compute order (or left 'unknown' when no registered schedule matches)."""
    traces = read_rank_traces(paths)
    how = spelling(traces)
    if how is None:
        raise PipesimError(NOT_FOUND.format(files=", ".join(str(t.path) for t in traces)))
    per_rank = find_actions(traces, how)
    stages, micro, steps = _check_complete(per_rank, traces)
    if schedule is not None:
        registry.spec(schedule)  # a registered name, so that a simulation of it can be compared
    name = schedule or infer_schedule(compute_orders(per_rank), stages, micro) or "unknown"
    origin = min(f.start for found in per_rank for f in found)
    events = [Event(t.rank, f.stream, f.kind, f.stage, f.microbatch, f.start - origin, f.end - origin,
                    peer=f.peer, step=f.step) for t, found in zip(traces, per_rank) for f in found]
    step_times = []
    for k in range(steps):
        comp = [e for e in events if e.step == k and e.stream == "compute"]
        step_times.append(max(e.end for e in comp) - min(e.start for e in comp))
    warmup = 1 if steps > 1 else 0  # torch infers shapes (and exchanges them) during the first step
    meta = {
        "imported_from": [str(t.path) for t in traces], "recognized": how, "world_size": len(traces),
        "dp": 1, "pp": len(traces), "tp": 1, "stages": stages, "microbatches": micro, "steps": steps,
        "p": len(traces), "v": stages // len(traces), "m": micro,  # the simulator's names, for calibration
        "warmup": warmup, "device": traces[0].device, "hosts": sorted({t.host for t in traces}),
        "step_times": step_times, "step_time": statistics.median(step_times[warmup:]),
    }
    return Timeline("measured", name, len(traces), events, meta)
