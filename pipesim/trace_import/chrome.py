"""Reading PyTorch profiler (Kineto) Chrome traces: one file per rank, reduced to named time spans.

Only complete events ('X') matter here; times become seconds. Ranks come from the trace's
`distributedInfo` (torch.profiler writes it under a process group), else from a `rank<N>` file name.
"""

from __future__ import annotations

import gzip
import math
import re
from dataclasses import dataclass
from pathlib import Path

from pipesim.errors import PipesimError, parse_json

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Span:
    """One complete event of the trace: what ran (`name`, `cat`) and when (seconds, the trace's clock)."""

    name: str
    cat: str
    start: float  # seconds
    end: float  # seconds
    tid: int = 0  # thread id (Kineto's tid)


@dataclass
class RankTrace:
    """The spans of one rank's trace file, sorted by start."""

    path: Path
    rank: int | None  # None: the file does not say
    world: int | None  # world size the file records, if any
    host: str
    device: str  # "cuda" when the trace lists GPUs, else "cpu"
    spans: list[Span]


def trace_files(paths: list[str]) -> list[Path]:
    """The files named, folders expanded to their *.json / *.json.gz files (sorted)."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith((".json", ".json.gz")))
            if not found:
                raise PipesimError(f"{raw}: folder holds no *.json or *.json.gz trace files")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise PipesimError(f"trace file not found: {raw}")
    return files


def _load_json(path: Path) -> object:
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        return parse_json(text)
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as exc:  # ValueError: bad JSON, its parser's limits
        raise PipesimError(f"{path} is not a Chrome trace (cannot read JSON: {str(exc).splitlines()[0]})") from None


def read_rank_trace(path: Path) -> RankTrace:
    """One profiler trace file; PipesimError when it is not a Chrome trace."""
    data = _load_json(path)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise PipesimError(f"{path} is not a Chrome trace (no 'traceEvents' list)")
    spans = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        try:
            ts, dur = float(e["ts"]), float(e.get("dur", 0))  # microseconds
            name, tid = str(e["name"]), int(e.get("tid", 0)) if str(e.get("tid", "0")).lstrip("-").isdigit() else 0
        except (KeyError, TypeError, ValueError):
            raise PipesimError(f"{path} is not a Chrome trace (malformed event: {str(e)[:80]})") from None
        if not (math.isfinite(ts) and math.isfinite(dur) and dur >= 0):  # else NaN in the JSON, or end < start
            raise PipesimError(f"{path}: event {name!r} at ts {e['ts']} has dur {e.get('dur', 0)}: "
                               "expected a finite ts and a finite dur >= 0")
        start = ts * 1e-6  # microseconds -> seconds
        spans.append(Span(name, str(e.get("cat", "")), start, start + dur * 1e-6, tid))
    spans.sort(key=lambda s: (s.start, -s.end))
    info = data.get("distributedInfo") if isinstance(data, dict) else None
    rank = world = None
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        rank, world = info["rank"], info.get("world_size") if isinstance(info.get("world_size"), int) else None
    elif (m := _RANK_IN_NAME.search(path.name)) is not None:
        rank = int(m.group(1))
    host = str(data.get("host_name", "")) if isinstance(data, dict) else ""
    gpus = data.get("deviceProperties") if isinstance(data, dict) else None
    return RankTrace(path, rank, world, host, "cuda" if gpus else "cpu", spans)


def read_rank_traces(paths: list[str]) -> list[RankTrace]:
    """Every rank's trace, indexed by rank; PipesimError on duplicate or missing ranks."""
    traces = [read_rank_trace(f) for f in trace_files(paths)]
    if all(t.rank is None for t in traces):
        for i, t in enumerate(traces):
            t.rank = i  # files in sorted order are ranks 0, 1, ...
    elif any(t.rank is None for t in traces):
        unnamed = next(t for t in traces if t.rank is None)
        raise PipesimError(f"{unnamed.path}: cannot tell its rank (no distributedInfo, no rank<N> in the name)")
    by_rank: dict[int, RankTrace] = {}
    for t in traces:
        if t.rank in by_rank:
            raise PipesimError(f"rank {t.rank} appears twice: {by_rank[t.rank].path} and {t.path}")
        by_rank[t.rank] = t
    world = max([len(traces), *(t.world or 0 for t in traces), max(by_rank) + 1])
    missing = [r for r in range(world) if r not in by_rank]
    if missing:
        raise PipesimError(f"ranks missing: no trace for rank{'s' if len(missing) > 1 else ''} "
                           f"{', '.join(map(str, missing))} of {world} (give one trace file per rank)")
    return [by_rank[r] for r in range(world)]
