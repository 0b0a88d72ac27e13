"""Checks on what `--reuse` reads back: a kept folder is the user's, so each timeline must be the executor's measurement
of the planned run it stands for, and comm.json the worker's figures, or the command stops in one line naming the
file (the fit would otherwise fail far away with a KeyError or a division by zero)."""

from __future__ import annotations

import math
from pathlib import Path

from pipesim.errors import PipesimError
from pipesim.timeline import Timeline


def _bad(path: Path, what: str) -> PipesimError:
    return PipesimError(f"{path}: {what}; measure again without --reuse")


def checked_timeline(tl: Timeline, run: dict, path: Path) -> Timeline:
    """`tl` when it is run `run`'s measured timeline (pipesim.calibration.runs writes its meta): the same id,
    schedule, ranks, microbatches, chunks per rank and model, and events of every timed step."""
    meta = tl.meta
    want = {"id": run["id"], "schedule": run["schedule"], "p": run["p"], "m": run["microbatches"],
            "v": run.get("virtual") or 1, "model": run["model"]}
    for key, value in want.items():
        if meta.get(key) != value:
            raise _bad(path, f"not the executor's timeline of run {run['id']} (its meta {key!r} is "
                             f"{meta.get(key)!r}, the run's {value!r})")
    if tl.schedule != run["schedule"] or tl.num_ranks != run["p"]:
        raise _bad(path, f"not the executor's timeline of run {run['id']} ({tl.schedule} on {tl.num_ranks} ranks)")
    warmup = meta.get("warmup")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise _bad(path, f"its meta 'warmup' must be a whole number of steps, got {warmup!r}")
    if len(tl.steps()) <= warmup:
        raise _bad(path, f"holds {len(tl.steps())} steps, none after the {warmup} warm-up steps")
    instant = next((e for e in tl.events if e.stream == "compute" and e.end <= e.start), None)
    if instant is not None:  # the fit divides by each action's measured seconds
        raise _bad(path, f"its {instant.kind} of stage {instant.stage}, microbatch {instant.microbatch} on rank "
                         f"{instant.rank} takes no time (start = end {instant.start!r}); a measured action takes some")
    probe = meta.get("probe")
    if probe is not None and (isinstance(probe, bool) or not isinstance(probe, (int, float))
                              or not math.isfinite(probe)):
        raise _bad(path, f"its meta 'probe' must be a number of seconds, got {probe!r}")
    return tl


def _pairs(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(x, list) and len(x) == 2 and all(_number(v) for v in x) for x in value)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def checked_comm(data: object, path: Path) -> dict:
    """comm.json's figures as the worker writes them: 'pingpong' [bytes, seconds] pairs, a positive
    'memory_bandwidth', and 'all_reduce' / 'all_to_all' records with bytes, time and busbw."""
    if not isinstance(data, dict):
        raise _bad(path, f"not the worker's comm figures (a JSON object), got {type(data).__name__}")
    if not _pairs(data.get("pingpong")):
        raise _bad(path, "its 'pingpong' must be [bytes, seconds] pairs of positive numbers")
    if "memory_bandwidth" in data and not _number(data["memory_bandwidth"]):
        raise _bad(path, f"its 'memory_bandwidth' must be a positive number, got {data['memory_bandwidth']!r}")
    for kind in ("all_reduce", "all_to_all"):
        records = data.get(kind, [])
        if not isinstance(records, list) or not all(
                isinstance(r, dict) and all(_number(r.get(k)) for k in ("bytes", "time", "busbw")) for r in records):
            raise _bad(path, f"its {kind!r} must be records of positive bytes, time and busbw")
    return data


__all__ = ["checked_comm", "checked_timeline"]
