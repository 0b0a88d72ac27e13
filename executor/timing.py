"""Timeline capture: every action's start and end on every rank, gathered to rank 0.

Times are `perf_counter_ns` (CLOCK_MONOTONIC on Linux), comparable across processes on one host;
the hot loop only appends integer tuples. Rank 0 converts them to the simulator's schema
(`pipesim.timeline.Timeline`, source "measured"), relative to the earliest start of step 0.
With `--trace`, TP collectives (timed inside actions), expert all-to-alls (labelled with the action that issued
them, which an overlapped F's exchange outlives) and send completions (send_watch) join them.
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from dataclasses import dataclass, field

import torch.distributed as dist

from pipesim.ir.schedule import Kind
from pipesim.plots.perfetto import write_trace as perfetto_write
from pipesim.timeline import Event, Timeline

STREAM = {Kind.F: "compute", Kind.B: "compute", Kind.I: "compute", Kind.W: "compute",
          Kind.SEND_F: "send", Kind.SEND_B: "send", Kind.RECV_F: "recv", Kind.RECV_B: "recv"}


@dataclass
class RankLog:
    """What one rank recorded: actions (step, index, t0, t1), collectives, step bounds (all ns)."""

    rank: int
    actions: list[tuple[int, int, int, int]] = field(default_factory=list)
    collectives: list[tuple[int, str, int, int, int]] = field(default_factory=list)  # step, kind, t0, t1, bytes
    tp_collectives: list[tuple[int, str, int, int, int]] = field(default_factory=list)  # the same, inside actions
    sends_done: list[tuple[int, int, int]] = field(default_factory=list)  # (step, index, ns) isend completed
    steps: list[tuple[int, int]] = field(default_factory=list)  # (start, end) per step
    losses: list[float] = field(default_factory=list)  # per step, on the rank holding the last stage
    param_elements: int = 0  # parameters this rank holds (TP shards count their local size)
    events: list[tuple] = field(default_factory=list)  # filled by `resolve`


def resolve(log: RankLog, program, peer_of, nbytes) -> None:
    """Turn indices into event tuples (done once, after the run, off the hot loop).

    A SEND spans its post to its completion when that was stamped (`--trace` on gloo), else the post.
    `nbytes`: bytes of every message, or a function of the P2P action (boundaries of different sizes).
    """
    size = nbytes if callable(nbytes) else (lambda _a: nbytes)
    done = {(step, idx): t for step, idx, t in log.sends_done}
    for step, idx, t0, t1 in log.actions:
        a = program[idx]
        comm = a.is_comm
        t1 = max(t1, done.get((step, idx), t1))
        peer = peer_of(a) if comm else -1
        log.events.append((STREAM[a.kind], a.kind.value, a.stage, a.microbatch, t0, t1, size(a) if comm else 0,
                           peer, step))
    for step, kind, t0, t1, nb in log.collectives:
        log.events.append(("collective", kind, -1, -1, t0, t1, nb, -1, step))
    starts = [t0 for _, _, t0, _ in log.actions]  # actions run one after another: sorted
    for step, kind, t0, t1, nb in log.tp_collectives:  # labelled with the action they ran in
        i = bisect_right(starts, t0) - 1
        inside = i >= 0 and (t1 <= log.actions[i][3] or kind == "all_to_all")  # an async exchange outlives its F
        a = program[log.actions[i][1]] if inside else None
        log.events.append(("collective", kind, a.stage if a else -1, a.microbatch if a else -1, t0, t1, nb, -1, step))
    log.actions = []
    log.tp_collectives = []
    log.sends_done = []


def gather(log: RankLog) -> list[RankLog] | None:
    """All ranks' logs on rank 0 (None elsewhere)."""
    out: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(log, out, dst=0)
    return out


def step_times(logs: list[RankLog]) -> list[float]:
    """Seconds per step: earliest start to latest end over all ranks."""
    n = min(len(lg.steps) for lg in logs)
    return [(max(lg.steps[i][1] for lg in logs) - min(lg.steps[i][0] for lg in logs)) / 1e9 for i in range(n)]


def median_step_time(times: list[float], warmup: int) -> float:
    measured = times[warmup:] or times
    return statistics.median(measured)


def to_timeline(logs: list[RankLog], schedule: str, meta: dict) -> Timeline:
    origin = min(lg.steps[0][0] for lg in logs if lg.steps)
    events = []
    for lg in logs:
        for stream, kind, stage, mb, t0, t1, nb, peer, step in lg.events:
            events.append(Event(lg.rank, stream, kind, stage, mb, (t0 - origin) / 1e9, (t1 - origin) / 1e9,
                                nb, peer, step))
    events.sort(key=lambda e: (e.start, e.rank))
    return Timeline("measured", schedule, len(logs), events, meta)


def write_trace(timeline: Timeline, path: str) -> None:
    """Perfetto JSON (pipesim.plots.perfetto), which `Timeline.read` and the plots read back."""
    perfetto_write(timeline, path)
