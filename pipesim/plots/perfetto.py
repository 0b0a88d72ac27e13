"""Perfetto / Chrome trace export: one schema for simulated and measured timelines.

Each rank is a process (pid = rank + 1), each stream (compute, send, recv, collective) a thread
of it, so a send overlapping a compute never lands on an overflow track. Flow arrows join every SEND to the
RECV that consumes it, forward in time: from the send's start to the receive's completion (a receive slice
often begins, waiting, before its send does). The pipesim Timeline rides along under "pipesim", so `pipesim plot`
reads the very file Perfetto (ui.perfetto.dev) or chrome://tracing opens.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipesim.outputs import write_text
from pipesim.timeline import STREAMS, Event, Timeline

TID = {stream: i + 1 for i, stream in enumerate(STREAMS)}  # thread id per stream (0 avoided)


def pid_of(rank: int) -> int:
    """Process id of a rank: rank + 1, since Perfetto treats pid 0 (the Linux idle task) specially."""
    return rank + 1
_RECV_OF_SEND = {"SEND_F": ("RECV_F", +1), "SEND_B": ("RECV_B", -1)}  # kind -> (matching kind, stage step)


def _us(seconds: float) -> float:
    """Chrome traces count microseconds."""
    return seconds * 1e6


def lanes(timeline: Timeline) -> dict[int, int]:
    """Lane of each event (index into timeline.events) within its (rank, stream) track.

    Events of one stream rarely overlap (two sends on different links can); an overlapping one
    goes to lane 1, 2, ... so no track holds partially overlapping slices, which Perfetto rejects.
    """
    lane_of: dict[int, int] = {}
    ends: dict[tuple[int, str], list[float]] = {}
    order = sorted(range(len(timeline.events)), key=lambda i: (timeline.events[i].start, timeline.events[i].end, i))
    for i in order:
        e = timeline.events[i]
        track = ends.setdefault((e.rank, e.stream), [])
        lane = next((k for k, end in enumerate(track) if end <= e.start), len(track))
        if lane == len(track):
            track.append(e.end)
        else:
            track[lane] = e.end
        lane_of[i] = lane
    return lane_of


def tid_of(stream: str, lane: int = 0) -> int:
    """Thread id of a stream's lane: 1..4 for lane 0 (compute, send, recv, collective), +10 per lane."""
    return TID.get(stream, TID["collective"]) + 10 * lane


def _metadata(timeline: Timeline, tracks: set[tuple[int, str, int]]) -> list[dict]:
    """'M' events naming and ordering the tracks: process "rank R", threads per stream (and lane)."""
    out: list[dict] = []
    for rank in range(timeline.num_ranks):
        pid = pid_of(rank)
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank}})
    for rank, stream, lane in sorted(tracks, key=lambda t: (t[0], tid_of(t[1]), t[2])):
        tid = tid_of(stream, lane)
        name = stream if lane == 0 else f"{stream} #{lane + 1}"
        out.append({"ph": "M", "name": "thread_name", "pid": pid_of(rank), "tid": tid, "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid_of(rank), "tid": tid,
                    "args": {"sort_index": TID.get(stream, TID["collective"]) * 100 + lane}})
    return out


def _slice(e: Event, lane: int) -> dict:
    return {
        "ph": "X",
        "name": e.label,
        "cat": e.kind,
        "pid": pid_of(e.rank),
        "tid": tid_of(e.stream, lane),
        "ts": _us(e.start),
        "dur": _us(e.end - e.start),
        "args": {"stage": e.stage, "microbatch": e.microbatch, "bytes": e.bytes, "peer": e.peer, "step": e.step},
    }


def flow_pairs(timeline: Timeline) -> list[tuple[Event, Event]]:
    """(SEND, RECV) pairs: SEND_F(s, k) -> RECV_F(s+1, k), SEND_B(s, k) -> RECV_B(s-1, k), same step."""
    recvs = {(e.kind, e.stage, e.microbatch, e.step): e for e in timeline.events if e.kind in ("RECV_F", "RECV_B")}
    pairs = []
    for e in timeline.events:
        if e.kind not in _RECV_OF_SEND:
            continue
        kind, delta = _RECV_OF_SEND[e.kind]
        recv = recvs.get((kind, e.stage + delta, e.microbatch, e.step))
        if recv is not None:
            pairs.append((e, recv))
    return pairs


FLOW_INSET = 1e-3  # us: how far inside the receive slice its arrow ends, so it binds to that slice


def flow_times(send: Event, recv: Event) -> tuple[float, float]:
    """(start, end) of a SEND -> RECV arrow in us: the send's start, just before the receive's end.

    The receive completes after the send started, so the arrow never points back in time; the end sits
    inside the receive slice (bp 'e' binds a flow end to its enclosing slice).
    """
    start = _us(send.start)
    end = _us(recv.end) - min(FLOW_INSET, _us(recv.end - recv.start) / 2)
    return start, max(start, end)


def _flows(timeline: Timeline, lane_of: dict[int, int]) -> list[dict]:
    out: list[dict] = []
    index = {id(e): i for i, e in enumerate(timeline.events)}
    for flow_id, (send, recv) in enumerate(flow_pairs(timeline), start=1):
        name = f"{send.kind[5:]} {send.stage}->{recv.stage} mb{send.microbatch}"
        common = {"name": name, "cat": "p2p", "id": flow_id}
        s_tid = tid_of(send.stream, lane_of[index[id(send)]])
        f_tid = tid_of(recv.stream, lane_of[index[id(recv)]])
        start, end = flow_times(send, recv)
        out.append({**common, "ph": "s", "pid": pid_of(send.rank), "tid": s_tid, "ts": start})
        out.append({**common, "ph": "f", "bp": "e", "pid": pid_of(recv.rank), "tid": f_tid, "ts": end})
    return out


def timeline_to_trace(timeline: Timeline) -> dict:
    """Chrome trace JSON object: tracks per rank and stream, slices in us, flows SEND -> RECV."""
    lane_of = lanes(timeline)
    tracks = {(e.rank, e.stream, lane_of[i]) for i, e in enumerate(timeline.events)}
    events = _metadata(timeline, tracks)
    order = sorted(range(len(timeline.events)), key=lambda i: (timeline.events[i].start, timeline.events[i].rank, i))
    events += [_slice(timeline.events[i], lane_of[i]) for i in order]
    events += _flows(timeline, lane_of)
    events += _blame(timeline)
    return {"traceEvents": events, "displayTimeUnit": "ms", "pipesim": timeline.to_dict()}


BLAME_TID = 9  # the track of a rank's attributed waits, below its streams


def _blame(timeline: Timeline) -> list[dict]:
    """A what-if's attributed waits (meta "blame": [rank, start, end, culprit], pipesim.sim.blame) as slices on a
    "waits on" track of each waiting rank, named after the rank or link that caused them."""
    rows = timeline.meta.get("blame") or []
    out: list[dict] = []
    for rank in sorted({int(r[0]) for r in rows}):
        out.append({"ph": "M", "name": "thread_name", "pid": pid_of(rank), "tid": BLAME_TID,
                    "args": {"name": "waits on (blame)"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid_of(rank), "tid": BLAME_TID,
                    "args": {"sort_index": 1000}})
    for rank, start, end, culprit in rows:
        out.append({"ph": "X", "name": f"waits on {culprit}", "cat": "blame", "pid": pid_of(int(rank)),
                    "tid": BLAME_TID, "ts": _us(start), "dur": _us(end - start), "args": {"culprit": culprit}})
    return out


def trace_text(timeline: Timeline) -> str:
    """The trace as compact JSON text (what `write_trace` writes)."""
    return json.dumps(timeline_to_trace(timeline), separators=(",", ":"))


def write_trace(timeline: Timeline, path: str | Path) -> None:
    """Write the trace atomically; `Timeline.read(path)` gets the timeline back."""
    write_text(path, trace_text(timeline))
