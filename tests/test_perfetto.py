"""The Perfetto / Chrome trace schema: tracks, microsecond slices, SEND -> RECV flow arrows."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

import schedules
from pipesim.ir.schedule import Kind
from pipesim.plots.from_schedule import unit_timeline
from pipesim.plots.perfetto import TID, flow_pairs, timeline_to_trace, write_trace
from pipesim.timeline import Event, Timeline

DUR = {Kind.F: 1e-3, Kind.B: 2e-3}  # seconds; transfers take 0.25 ms


def _duration(action) -> float:
    return DUR.get(action.kind, 0.25e-3)


@pytest.fixture(scope="module")
def two_steps() -> Timeline:
    """1F1B, 3 ranks, 4 microbatches, two steps back to back, plus one all-reduce on rank 0."""
    one = unit_timeline(schedules.build("1f1b", 3, 4), _duration, transfer_bytes=lambda a: 1 << 20)
    span = one.makespan
    events = list(one.events) + [replace(e, start=e.start + span, end=e.end + span, step=1) for e in one.events]
    events.append(Event(0, "collective", "all_reduce", 0, -1, 2 * span, 2 * span + 1e-3, bytes=4096))
    return Timeline("simulated", "1f1b", 3, events, dict(one.meta))


def _slices(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_every_slice_is_complete_and_in_microseconds(two_steps):
    trace = timeline_to_trace(two_steps)
    slices = _slices(trace)
    assert len(slices) == len(two_steps.events)
    for s in slices:
        assert {"pid", "tid", "ts", "dur", "name", "args"} <= s.keys()
        assert set(s["args"]) == {"stage", "microbatch", "bytes", "peer", "step"}
    by_key = {(s["pid"], s["name"], s["args"]["step"]): s for s in slices}
    for e in two_steps.events:
        s = by_key[(e.rank + 1, e.label, e.step)]  # pid = rank + 1: Perfetto treats pid 0 specially
        assert s["ts"] == e.start * 1e6  # exactly seconds * 1e6
        assert s["dur"] == (e.end - e.start) * 1e6
        assert s["tid"] == TID[e.stream]
        assert s["cat"] == e.kind
        assert (s["args"]["bytes"], s["args"]["peer"]) == (e.bytes, e.peer)
    assert trace["displayTimeUnit"] == "ms"


def test_tracks_are_named_per_rank_and_stream(two_steps):
    trace = timeline_to_trace(two_steps)
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert processes == {1: "rank 0", 2: "rank 1", 3: "rank 2"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    used = {(s["pid"], s["tid"]) for s in _slices(trace)}
    assert used == set(threads)  # every track used is named, and no empty track is named
    assert threads[(1, TID["compute"])] == "compute"
    assert threads[(1, TID["send"])] == "send"
    assert threads[(1, TID["recv"])] == "recv"
    assert threads[(1, TID["collective"])] == "collective"
    assert len({TID["compute"], TID["send"], TID["recv"], TID["collective"]}) == 4


def test_no_track_holds_overlapping_slices(two_steps):
    trace = timeline_to_trace(two_steps)
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for s in _slices(trace):
        tracks.setdefault((s["pid"], s["tid"]), []).append((s["ts"], s["ts"] + s["dur"]))
    for spans in tracks.values():
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_overlapping_sends_get_a_second_lane():
    a = Event(0, "send", "SEND_F", 0, 0, 0.0, 2e-3, bytes=8, peer=1)
    b = Event(0, "send", "SEND_B", 0, 1, 1e-3, 3e-3, bytes=8, peer=1)
    trace = timeline_to_trace(Timeline("simulated", "x", 2, [a, b]))
    tids = sorted(s["tid"] for s in _slices(trace))
    assert tids == [TID["send"], TID["send"] + 10]
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {TID["send"]: "send", TID["send"] + 10: "send #2"}


def test_one_flow_per_send_to_its_matching_recv(two_steps):
    trace = timeline_to_trace(two_steps)
    flows = [e for e in trace["traceEvents"] if e["ph"] in ("s", "f")]
    sends = [e for e in two_steps.events if e.kind in ("SEND_F", "SEND_B")]
    # 1F1B on 3 ranks, 4 microbatches: stages 0,1 send F and stages 1,2 send B -> 16 sends a step
    assert len(sends) == 32
    ids = Counter(f["id"] for f in flows)
    assert len(ids) == len(sends) and set(ids.values()) == {2}
    slices = _slices(trace)
    for fid in ids:
        start = next(f for f in flows if f["id"] == fid and f["ph"] == "s")
        finish = next(f for f in flows if f["id"] == fid and f["ph"] == "f")
        assert finish["bp"] == "e" and "bp" not in start
        send = next(s for s in slices if (s["pid"], s["tid"]) == (start["pid"], start["tid"])
                    and s["ts"] <= start["ts"] <= s["ts"] + s["dur"])
        recv = next(s for s in slices if (s["pid"], s["tid"]) == (finish["pid"], finish["tid"])
                    and s["ts"] <= finish["ts"] <= s["ts"] + s["dur"])
        assert send["cat"] in ("SEND_F", "SEND_B") and recv["cat"] == "RECV" + send["cat"][4:]
        delta = 1 if send["cat"] == "SEND_F" else -1
        assert recv["args"]["stage"] == send["args"]["stage"] + delta
        assert (recv["args"]["microbatch"], recv["args"]["step"]) == (send["args"]["microbatch"],
                                                                      send["args"]["step"])
        assert recv["pid"] == send["args"]["peer"] + 1 and send["pid"] == recv["args"]["peer"] + 1


def test_send_without_recv_has_no_flow():
    send = Event(0, "send", "SEND_F", 0, 0, 0.0, 1e-3, 8, 1)
    wrong_step = Event(1, "recv", "RECV_F", 1, 0, 0.0, 1e-3, 8, 0, step=1)
    wrong_stage = Event(1, "recv", "RECV_F", 2, 0, 0.0, 1e-3, 8, 0)
    assert flow_pairs(Timeline("simulated", "x", 2, [send, wrong_step, wrong_stage])) == []
    right = Event(1, "recv", "RECV_F", 1, 0, 0.5e-3, 2e-3, 8, 0)
    assert flow_pairs(Timeline("simulated", "x", 2, [send, right])) == [(send, right)]


def test_trace_file_round_trips_to_the_timeline(two_steps, tmp_path):
    path = tmp_path / "trace.json"
    write_trace(two_steps, path)
    data = json.loads(path.read_text())
    assert {"traceEvents", "displayTimeUnit", "pipesim"} <= data.keys()
    back = Timeline.read(path)
    assert back.events == two_steps.events
    assert (back.source, back.schedule, back.num_ranks) == ("simulated", "1f1b", 3)


MEASURED = Path(__file__).parent / "data" / "measured_1f1b_gpt_p2.json"  # `pipesim run 1f1b --nproc 2 -m 4
# --model gpt --layers 4 --hidden 256 --seq 128 --batch 8 --trace`: 15 of its 24 receives began before their send


def _flow_spans(trace: dict) -> list[tuple[float, float]]:
    ends: dict[int, dict[str, float]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] in ("s", "f"):
            ends.setdefault(e["id"], {})[e["ph"]] = e["ts"]
    return [(v["s"], v["f"]) for v in ends.values()]


@pytest.mark.parametrize("source", ["simulated", "measured"])
def test_flows_go_forward_in_time(two_steps, source):
    timeline = two_steps if source == "simulated" else Timeline.read(MEASURED)
    pairs = flow_pairs(timeline)
    if source == "measured":
        assert sum(r.start < s.start for s, r in pairs) > len(pairs) // 2  # receives posted early: the hard case
    trace = timeline_to_trace(timeline)
    spans = _flow_spans(trace)
    assert len(spans) == len(pairs) > 0
    for (start, end), (send, recv) in zip(spans, pairs, strict=True):
        assert start <= end  # no arrow points back in time
        assert start == send.start * 1e6  # from the send's start ...
        assert recv.start * 1e6 <= end <= recv.end * 1e6 and end == pytest.approx(recv.end * 1e6, abs=2e-3)
        # ... to the receive's completion, inside the receive slice so the arrow binds to it
