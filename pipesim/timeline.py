"""Timelines: timed events of a run, one schema for simulated and measured runs.

The simulator and the executor both write this; the plots and the Perfetto exporter read it, so
predicted and measured runs overlay with no conversion. Times are seconds from the run's origin.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipesim.errors import PipesimError, parse_json, refuse_special_file

SCHEMA = "pipesim.timeline/1"
STREAMS = ("compute", "send", "recv", "collective")


@dataclass(frozen=True)
class Event:
    """One action (or collective) on one rank, with its start and end."""

    rank: int
    stream: str  # one of STREAMS: where it ran (compute, send, recv, collective)
    kind: str  # F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, or a collective (all_reduce, ...)
    stage: int  # -1 for collectives that are not tied to a stage
    microbatch: int  # -1 when not tied to a microbatch
    start: float  # seconds
    end: float  # seconds
    bytes: int = 0  # bytes moved (P2P and collectives)
    peer: int = -1  # rank on the other end of a P2P transfer
    step: int = 0  # training step the event belongs to

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def label(self) -> str:
        if self.stage < 0:
            return self.kind
        return f"{self.stage}{self.kind}{self.microbatch}"


@dataclass
class Timeline:
    """A run's events plus what produced them (`source`: 'simulated' or 'measured')."""

    source: str
    schedule: str  # schedule name
    num_ranks: int
    events: list[Event] = field(default_factory=list)
    meta: dict = field(default_factory=dict)  # free-form: hardware, model, p, m, v, step_time, ...

    @property
    def makespan(self) -> float:
        """Seconds from the first start to the last end."""
        if not self.events:
            return 0.0
        return max(e.end for e in self.events) - min(e.start for e in self.events)

    def steps(self) -> list[int]:
        return sorted({e.step for e in self.events})

    def only_step(self, step: int, rebase: bool = True) -> Timeline:
        """The events of one step, shifted so that step starts at 0 when `rebase`."""
        events = [e for e in self.events if e.step == step]
        t0 = min((e.start for e in events), default=0.0) if rebase else 0.0
        shifted = [Event(**{**asdict(e), "start": e.start - t0, "end": e.end - t0}) for e in events]
        return Timeline(self.source, self.schedule, self.num_ranks, shifted, dict(self.meta))

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "source": self.source,
            "schedule": self.schedule,
            "num_ranks": self.num_ranks,
            "meta": self.meta,
            "events": [asdict(e) for e in self.events],
        }

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=None, separators=(",", ":")))

    @staticmethod
    def from_dict(data: dict, origin: str = "timeline") -> Timeline:
        """Accepts a timeline, or a Perfetto trace written by pipesim (timeline under "pipesim")."""
        if isinstance(data, dict) and "traceEvents" in data and "pipesim" in data:
            data = data["pipesim"]
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise PipesimError(f"{origin} is not a pipesim timeline (expected schema {SCHEMA!r})")
        num_ranks = data.get("num_ranks")
        if not _is_int(num_ranks) or num_ranks < 1:
            raise PipesimError(f"{origin} is a malformed timeline: num_ranks must be a positive integer, "
                               f"got {num_ranks!r}")
        meta = data.get("meta", {})
        if not isinstance(meta, dict):
            raise PipesimError(f"{origin} is a malformed timeline: meta must be an object, got {type(meta).__name__}")
        try:
            events = [Event(**e) for e in data["events"]]
            timeline = Timeline(data["source"], data["schedule"], num_ranks, events, meta)
        except (KeyError, TypeError) as exc:
            raise PipesimError(f"{origin} is a malformed timeline: {exc}") from None
        for i, e in enumerate(events):  # the plots and the replay index ranks and subtract times unchecked
            _check_event(e, i, num_ranks, origin)
        return timeline

    @staticmethod
    def read(path: str | Path) -> Timeline:
        return Timeline.from_dict(read_json(path), str(path))


def read_json(path: str | Path) -> object:
    """The JSON in the file a user named (a timeline, a trace, a sweep); PipesimError in one line if unreadable."""
    refuse_special_file(path, str(path))
    try:
        return parse_json(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PipesimError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise PipesimError(f"{path} is a folder, not a trace file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: bad JSON, its parser's limits
        raise PipesimError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_event(e: Event, i: int, num_ranks: int, origin: str) -> None:
    """Refuse event `i` (its index in "events") when its rank or times cannot be placed on the time axis."""
    where = f"{origin} is a malformed timeline: event {i}"
    if not _is_int(e.rank) or not 0 <= e.rank < num_ranks:
        raise PipesimError(f"{where} has rank {e.rank!r}; expected an integer in [0, {num_ranks})")
    for name in ("start", "end"):
        if not _is_time(getattr(e, name)):
            raise PipesimError(f"{where} has {name} {getattr(e, name)!r}; expected a finite number of seconds")
    if e.end < e.start:
        raise PipesimError(f"{where} ends before it starts (start {e.start!r}, end {e.end!r})")


def pipeline_span(tl: Timeline, step: int) -> tuple[float, float, list[float]]:
    """(first compute start, last compute end, compute seconds per rank) of one step of a measured run.

    A measured step starts when its first compute starts (always 0F0 on rank 0): ranks that began the
    step early sit in a RECV, which the simulator, starting every rank at 0, does not see either.
    """
    comp = [e for e in tl.events if e.step == step and e.stream == "compute"]
    busy = [0.0] * tl.num_ranks
    for e in comp:
        busy[e.rank] += e.duration
    return min(e.start for e in comp), max(e.end for e in comp), busy


def trimmed_step(tl: Timeline, step: int) -> Timeline:
    """One step from its first compute start (earlier RECV waits clipped), rebased to 0, for the plots."""
    t0, _, _ = pipeline_span(tl, step)
    events = [Event(**{**e.__dict__, "start": max(e.start, t0) - t0, "end": max(e.end, t0) - t0, "step": 0})
              for e in tl.events if e.step == step and e.end > t0]
    return Timeline(tl.source, tl.schedule, tl.num_ranks, events, {**tl.meta, "shown_step": step})
