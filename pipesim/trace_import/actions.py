"""Finding the pipeline's actions in a rank's spans: what torch.distributed.pipelining (2.13) records.

Three spellings, tried in this order (the first one any rank shows is used for all ranks):
- `PP:<action>` (`PP:0F1`, `PP:1I0`, `PP:0SEND_F1`, `PP:(0F1;1B0)OVERLAP_F_B`): `_PipelineScheduleRuntime`
  wraps every action in `record_function(_get_profiler_function_name(action))`; that runtime runs the
  multi-stage schedules (interleaved, looped BFS, zero bubble, ZBV, DualPipeV) and any loaded CSV.
- `Forward i` / `Backward i`: ScheduleGPipe's ranges (one stage per rank, stage = rank).
- Python frames `torch/distributed/pipelining/stage.py(N): forward_one_chunk` (and `backward_one_chunk`,
  `backward_weight_one_chunk`) of a `with_stack=True` trace: Schedule1F1B records no range of its own,
  so its actions show only this way. One stage per rank; microbatches are numbered in their order
  within each `schedules.py(N): step` frame (torch runs each kind's microbatches in order).
P2P: a recv spans the backend's `gloo:recv` (`nccl:recv`) range, from its post until it completed and was
waited for; a send spans its post only (`PP:<s>SEND_F<m>`, else the `c10d::send` op): the backend's send
range ends only when the schedule waits for it, often at the end of the step, not when the data left.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace

from pipesim.trace_import.chrome import RankTrace, Span

PP_ACTION = re.compile(r"^PP:(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")
PP_OVERLAP = re.compile(r"^PP:\((.*)\)OVERLAP_F_B$")
SUB_ACTION = re.compile(r"^(\d+)(F|B|I|W)(\d+)$")
GPIPE_RANGE = re.compile(r"^(Forward|Backward) (\d+)$")
STAGE_FRAME = re.compile(
    r"pipelining/stage\.py\(\d+\): (forward_one_chunk|backward_one_chunk|backward_weight_one_chunk)$")
STEP_FRAME = re.compile(r"pipelining/schedules\.py\(\d+\): step$")
BACKEND_RECV = re.compile(r"^(gloo|nccl):recv$")
SEND_OP = "c10d::send"

COMPUTE_KINDS = ("F", "B", "I", "W")
STREAM_OF = {"SEND_F": "send", "SEND_B": "send", "RECV_F": "recv", "RECV_B": "recv"}
RECV_FOR = {"F": "RECV_F", "B": "RECV_B", "I": "RECV_B"}  # the input each compute waits for
SEND_FOR = {"F": "SEND_F", "B": "SEND_B", "I": "SEND_B"}  # the output each compute sends


@dataclass(frozen=True)
class Found:
    """One action found on one rank (times in the trace's seconds)."""

    kind: str  # F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B
    stage: int
    microbatch: int
    start: float  # seconds
    end: float  # seconds
    step: int = 0
    peer: int = -1  # rank at the other end (P2P only)

    @property
    def stream(self) -> str:
        return STREAM_OF.get(self.kind, "compute")


def spelling(traces: list[RankTrace]) -> str | None:
    """'pp', 'gpipe' or 'frames': how these traces name the actions (None: not at all)."""
    names = {s.name for t in traces for s in t.spans}
    if any(PP_ACTION.match(n) or PP_OVERLAP.match(n) for n in names):
        return "pp"
    if any(GPIPE_RANGE.match(n) for n in names):
        return "gpipe"
    if any(STAGE_FRAME.search(n) for n in names):
        return "frames"
    return None


def _numbered_by_repeat(found: list[Found]) -> list[Found]:
    """Step of each action = how many times its (kind, stage, microbatch) ran before on this rank."""
    seen: Counter = Counter()
    out = []
    for f in sorted(found, key=lambda f: f.start):
        key = (f.kind, f.stage, f.microbatch)
        out.append(replace(f, step=seen[key]))
        seen[key] += 1
    return out


def _cpu_ranges(trace: RankTrace) -> list[Span]:
    """The host side's spans: a CUDA trace repeats each record_function range on the GPU's timeline."""
    return [s for s in trace.spans if s.cat != "gpu_user_annotation"]


def _pp_actions(trace: RankTrace) -> list[Found]:
    found = []
    for s in _cpu_ranges(trace):
        if (m := PP_ACTION.match(s.name)) is not None:
            found.append(Found(m.group(2), int(m.group(1)), int(m.group(3)), s.start, s.end))
        elif (m := PP_OVERLAP.match(s.name)) is not None:  # no range per sub-action: split the span evenly
            subs = [SUB_ACTION.match(a) for a in m.group(1).split(";")]
            width = (s.end - s.start) / max(1, len(subs))
            found.extend(Found(a.group(2), int(a.group(1)), int(a.group(3)), s.start + i * width,
                               s.start + (i + 1) * width) for i, a in enumerate(subs) if a is not None)
    return _numbered_by_repeat(found)


def _gpipe_actions(trace: RankTrace) -> list[Found]:
    found = [Found("F" if m.group(1) == "Forward" else "B", trace.rank, int(m.group(2)), s.start, s.end)
             for s in _cpu_ranges(trace) if (m := GPIPE_RANGE.match(s.name)) is not None]
    return _numbered_by_repeat(found)


def _frame_actions(trace: RankTrace) -> list[Found]:
    frames = [(m.group(1), s) for s in trace.spans if (m := STAGE_FRAME.search(s.name)) is not None]
    split = any(name == "backward_weight_one_chunk" for name, _ in frames)
    kind_of = {"forward_one_chunk": "F", "backward_one_chunk": "I" if split else "B", "backward_weight_one_chunk": "W"}
    steps = [s for s in trace.spans if STEP_FRAME.search(s.name)]
    counts: Counter = Counter()
    found = []
    for name, s in frames:
        step = next((i for i, st in enumerate(steps) if st.start <= s.start <= st.end), 0)
        kind = kind_of[name]
        found.append(Found(kind, trace.rank, counts[(step, kind)], s.start, s.end, step))
        counts[(step, kind)] += 1
    return found


def _p2p_spans(trace: RankTrace, op: str) -> list[Span]:
    if op == "send":
        return [s for s in trace.spans if s.name == SEND_OP]
    return [s for s in trace.spans if BACKEND_RECV.match(s.name)]


def _pp_comms(trace: RankTrace, actions: list[Found], placement: dict[int, int]) -> list[Found]:
    """PP:SEND/RECV ranges post the op; a recv's backend span inside its range runs to its completion."""
    backend = _p2p_spans(trace, "recv")
    out = []
    for a in actions:
        if a.stream == "compute":
            out.append(a)
            continue
        inner = [b.end for b in backend if a.start <= b.start <= a.end] if a.stream == "recv" else []
        peer_stage = a.stage + 1 if a.kind in ("SEND_F", "RECV_B") else a.stage - 1
        out.append(replace(a, end=max([a.end, *inner]), peer=placement.get(peer_stage, -1)))
    return out


def _inferred_comms(trace: RankTrace, computes: list[Found], num_stages: int, placement: dict[int, int]) -> list[Found]:
    """Sends and recvs of a schedule that does not name them, matched to the computes that need them.

    The i-th-from-last send belongs to the i-th-from-last compute that sends (F below the last stage,
    B/I above the first); likewise for recvs. Matching from the end skips the shape-inference messages
    torch exchanges before the first step's first action.
    """
    def needs(c: Found, op: str) -> str | None:
        if op == "send":
            return "SEND_F" if c.kind == "F" and c.stage < num_stages - 1 else (
                "SEND_B" if c.kind in ("B", "I") and c.stage > 0 else None)
        return "RECV_F" if c.kind == "F" and c.stage > 0 else (
            "RECV_B" if c.kind in ("B", "I") and c.stage < num_stages - 1 else None)

    out = []
    for op in ("send", "recv"):
        wanting = [(c, k) for c in computes if (k := needs(c, op)) is not None]
        spans = _p2p_spans(trace, op)
        for (c, kind), s in zip(reversed(wanting), reversed(spans)):
            peer_stage = c.stage + 1 if kind in ("SEND_F", "RECV_B") else c.stage - 1
            out.append(Found(kind, c.stage, c.microbatch, s.start, s.end, c.step, placement.get(peer_stage, -1)))
    return out


def _trim_waits(found: list[Found]) -> list[Found]:
    """A compute range that waited for its input starts when that input arrived (the recv's end), and
    one that also posted its output (GPipe's `Forward i`) ends when that send was posted."""
    arrived = {(f.kind, f.stage, f.microbatch, f.step): f.end for f in found if f.stream == "recv"}
    posted = {(f.kind, f.stage, f.microbatch, f.step): f.start for f in found if f.stream == "send"}
    out = []
    for f in found:
        if f.stream == "compute":
            end_of_recv = arrived.get((RECV_FOR.get(f.kind, ""), f.stage, f.microbatch, f.step))
            if end_of_recv is not None and f.start < end_of_recv < f.end:
                f = replace(f, start=end_of_recv)
            send_post = posted.get((SEND_FOR.get(f.kind, ""), f.stage, f.microbatch, f.step))
            if send_post is not None and f.start < send_post < f.end:
                f = replace(f, end=send_post)
        out.append(f)
    return out


def find_actions(traces: list[RankTrace], how: str) -> list[list[Found]]:
    """Every rank's actions (compute and P2P), in start order, for the spelling `how`."""
    reader = {"pp": _pp_actions, "gpipe": _gpipe_actions, "frames": _frame_actions}[how]
    per_rank = [reader(t) for t in traces]
    placement = {f.stage: t.rank for t, found in zip(traces, per_rank) for f in found if f.kind == "F"}
    num_stages = max(placement, default=-1) + 1
    out = []
    for t, found in zip(traces, per_rank):
        if how == "pp":
            found = _pp_comms(t, found, placement)
        else:
            found = found + _inferred_comms(t, found, num_stages, placement)
        out.append(sorted(_trim_waits(found), key=lambda f: (f.start, f.end)))
    return out
