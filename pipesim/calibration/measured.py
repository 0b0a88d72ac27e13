"""Reading measured timelines: the steps that count, the pipeline's span and bubble, per-action samples.

A measured step starts when its first compute starts (always 0F0 on rank 0): ranks that began the
step early sit in a RECV, which the simulator, starting every rank at 0, does not see either.
"""

from __future__ import annotations

import statistics

from pipesim.calibration.fit import Sample
from pipesim.cost.stage_work import action_flops, stage_work
from pipesim.model.config import ModelConfig
from pipesim.sim.host.sharing import runnable_profile
from pipesim.timeline import Event, Timeline, pipeline_span, trimmed_step  # re-exported: the measured steps' reading


def measured_steps(tl: Timeline) -> list[int]:
    """The steps after warmup (all steps when there are no more)."""
    steps = tl.steps()
    return steps[int(tl.meta.get("warmup", 0)):] or steps


def measured_metrics(tl: Timeline) -> tuple[float, float, int]:
    """(step time, bubble fraction, step) of the median measured step by pipeline makespan."""
    rows = []
    for step in measured_steps(tl):
        t0, t1, busy = pipeline_span(tl, step)
        span = t1 - t0
        rows.append((span, sum(1 - b / span for b in busy) / len(busy), step))
    rows.sort()
    return rows[(len(rows) - 1) // 2]


def interquartile_mean(values: list[float]) -> float:
    """Mean of the middle half (a quarter dropped at each end; all of 1 to 3 values)."""
    ranked = sorted(values)
    cut = len(ranked) // 4
    kept = ranked[cut:len(ranked) - cut]
    return sum(kept) / len(kept)


def typical_metrics(timelines: list[Timeline]) -> tuple[float, float]:
    """(step seconds, bubble fraction) of repeated runs of one configuration: the interquartile mean of
    every measured step of every run.

    This VM's speed moves between and within runs, and the runs' medians fall into clusters (a
    configuration alternating between 75 and 110 ms runs in one campaign), so the median run jumps
    between them from one campaign to the next; pooled over all steps, the middle half's mean repeats
    best across campaigns (per-configuration spread 3.0 % against 3.7 % for the median run, over seven
    campaigns of this plan on the 2-core development VM).
    """
    spans, bubbles = [], []
    for tl in timelines:
        for step in measured_steps(tl):
            t0, t1, busy = pipeline_span(tl, step)
            spans.append(t1 - t0)
            bubbles.append(sum(1 - b / (t1 - t0) for b in busy) / len(busy))
    return interquartile_mean(spans), interquartile_mean(bubbles)


def typical_step(timelines: list[Timeline]) -> float:
    """Seconds of a configuration's typical step (`typical_metrics`)."""
    return typical_metrics(timelines)[0]


def typical_run(timelines: list[Timeline]) -> Timeline:
    """Of repeated runs of one configuration, the one whose median step is nearest its typical step (the
    earliest of ties): the run shown in plots."""
    target = typical_step(timelines)
    return min(timelines, key=lambda tl: abs(measured_metrics(tl)[0] - target))


def runnable_spans(events: list[Event], num_ranks: int) -> list[list[tuple[float, float]]]:
    """Per rank, the spans in which it needed a core: its compute actions and its SEND postings."""
    spans: list[list[tuple[float, float]]] = [[] for _ in range(num_ranks)]
    for e in events:
        if e.stream in ("compute", "send"):
            spans[e.rank].append((e.start, e.end))
    return spans


def samples_from_timeline(tl: Timeline) -> list[Sample]:
    """One Sample per compute action of the measured steps, with how many ranks were runnable during it."""
    return [sample for _, sample in action_samples(tl)]


def action_samples(tl: Timeline, work: list | None = None) -> list[tuple[tuple[int, str], Sample]]:
    """((stage, kind), Sample) of every compute action of the measured steps (see `samples_from_timeline`).

    `work`: per stage ((F, I, W) FLOPs, bytes, ops) of one microbatch; default `stage_work` of the
    pipesim model in `meta.model` (a user's model counted by pipesim.cost.user_model_costs passes its own)."""
    if work is None:
        work = stage_work(ModelConfig(**tl.meta["model"]), tl.meta["p"] * tl.meta["v"], tl.meta["m"])
    out = []
    for step in measured_steps(tl):
        events = [e for e in tl.events if e.step == step]
        spans = runnable_spans(events, tl.num_ranks)
        for e in events:
            if e.stream != "compute":
                continue
            fl, n = action_flops(e.kind, e.stage, work[e.stage][0])
            if not any(fl):  # the first stage's empty I: microseconds of noise, it would dominate a relative fit
                continue
            moved, _ = action_flops(e.kind, e.stage, work[e.stage][1])  # bytes and ops: the same attribution
            ops, _ = action_flops(e.kind, e.stage, work[e.stage][2])
            others = [sp for r, sp in enumerate(spans) if r != e.rank]
            prof = runnable_profile([(e.start, e.end)], others, tl.num_ranks)[0]
            split = int(e.kind in ("I", "W") and e.stage > 0)  # the first stage's W is a plain backward
            groups = work[e.stage][2][2] if split and e.kind == "W" else 0.0  # W: once per parameter group
            graph = work[e.stage][2][1] + work[e.stage][2][2] if split and e.kind == "I" else 0.0  # I walks it
            out.append(((e.stage, e.kind), Sample(fl, e.duration, tuple(prof), n, moved, split, sum(ops), groups,
                                                  ops[1] + ops[2], graph)))
    return out


def comm_action_seconds(timelines: list[Timeline]) -> tuple[float, float]:
    """(mean seconds a SEND holds its rank, comm actions per charged compute overhead) in the measured steps.

    The mean, not the median, as for message latency and late RECVs: a step pays every SEND on its
    critical path and their sum follows the mean (SENDs on 2 ranks here: median about 0.18 ms, mean
    0.26-0.31 ms, with a tail of multi-millisecond postings).
    """
    sends, comms, units = [], 0, 0
    for tl in timelines:
        for step in measured_steps(tl):
            for e in tl.events:
                if e.step != step:
                    continue
                if e.stream == "send":
                    sends.append(e.duration)
                if e.stream in ("send", "recv"):
                    comms += 1
                elif e.stream == "compute":
                    units += 2 if e.kind == "B" else 1
    if not sends or not units:
        return 0.0, 0.0
    return sum(sends) / len(sends), comms / units


def message_delays(tl: Timeline) -> list[tuple[float, int, bool]]:
    """(delivery seconds, bytes, late) of every P2P message in the measured steps.

    Delivery runs from the moment both sides are there (the SEND posted, i.e. its end, and the
    receiver in its RECV) to the RECV's end. `late`: the RECV began after the SEND was posted (the
    receiver was computing then); on a host with few cores such a RECV waits for the sender's
    progress thread, well beyond the link's latency + bytes / bandwidth.
    """
    out = []
    for step in measured_steps(tl):
        events = [e for e in tl.events if e.step == step]
        sends = {(e.kind, e.stage, e.microbatch): e for e in events if e.stream == "send"}
        for r in events:
            if r.stream != "recv":
                continue
            key = ("SEND_F", r.stage - 1, r.microbatch) if r.kind == "RECV_F" else ("SEND_B", r.stage + 1, r.microbatch)
            s = sends.get(key)
            if s is not None:
                out.append((r.end - max(r.start, s.end), r.bytes, r.start > s.end))
    return out


def late_recv_delay(timelines: list[Timeline]) -> float:
    """Mean seconds of a RECV that begins after its message was posted (the receiver was computing then)."""
    late = [t for tl in timelines for t, _, is_late in message_delays(tl) if is_late]
    return sum(late) / len(late) if late else 0.0



def in_run_latency(timelines: list[Timeline], bandwidth: float, fallback: float) -> float:
    """Seconds of a message's latency inside the runs: the mean delivery of the messages whose receiver
    was already waiting, less bytes / bandwidth; `fallback` (the ping-pong's) when there are none.

    A ping-pong is a few hundred messages at one moment; the runs' own messages are thousands, sent
    while the ranks compute, which is what the simulator has to reproduce. The mean, not the median:
    deliveries are heavy-tailed here (median about 0.1 ms, mean about 0.4 ms on 2 ranks) and a step
    pays the delays of its critical path, whose sum follows the mean (as for late RECVs).
    """
    waits = [d - nbytes / bandwidth for tl in timelines for d, nbytes, late in message_delays(tl) if not late]
    return max(0.0, statistics.fmean(waits)) if waits else fallback


__all__ = ["action_samples", "comm_action_seconds", "in_run_latency", "interquartile_mean", "late_recv_delay",
           "measured_metrics", "measured_steps", "message_delays", "pipeline_span", "runnable_spans",
           "samples_from_timeline", "trimmed_step", "typical_metrics", "typical_run", "typical_step"]
