"""A measured run replayed through the simulator, and its what-ifs: each rank (or link) brought to the median's.

A measured timeline (`pipesim import-trace`'s, or `pipesim run --trace`'s) holds when every action of a
step began and ended. The replay gives the simulator, for one step, each compute action's own time and
each message's delivery, read off that step, and lets it run the schedule's dependencies:
- a compute's time runs from when it could begin (the later of its rank's previous compute, posting its
  SENDs included, and the arrival of the messages its RECVs just before it took) to its end plus the
  posting of the SENDs that follow it: the runtime's gaps and a late RECV's progress are its rank's;
- a message's arrival: where the RECV began before the message was posted (its SEND's start in the trace,
  else its producer's end), the RECV's end: the receiver waited for it; otherwise the RECV's start, and
  what the RECV took is the receiver's (a runtime that blocks on its own sends before it, as torch's
  Schedule1F1B does, waits there on its peer: that gap stays the message's). A RECV the trace lacks
  counts as ending when its compute began.
With every measured duration given back, the simulated ranks end each compute exactly when the measured
ones did, so the replay reproduces the measured step (pipeline span: first compute start to last compute
end) up to the trace's own inconsistencies (clocks of different hosts, missing RECVs); `Replay.error` says
by how much, for the run at hand.

The what-if then changes durations and lets the dependencies decide: rank k's compute times replaced by
the median rank's (the j-th action of each kind on rank k takes what the j-th of that kind took on the
median rank), or a link's deliveries by the median link's. "The step would be X % faster without rank k" is
(replay - what-if) / replay. A slow rank (`--slow`) stretches its computes' own spans, not its gaps. A message
whose receiver reached its RECV late keeps that lateness (it counts as arriving when the RECV began), so a
what-if that makes the receiver earlier understates the gain.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

import schedules as registry
from pipesim.cost.table import CostTable
from pipesim.errors import PipesimError
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import COMPUTE, RECVS, SENDS, Schedule
from pipesim.sim.perturb import Perturbation
from pipesim.sim.result import SimResult
from pipesim.sim.simulator import simulate
from pipesim.timeline import Timeline, pipeline_span


@dataclass(frozen=True)
class Recorded:
    """One measured step as the simulator's inputs: the schedule and each action's measured seconds."""

    schedule: Schedule  # as registered (the simulator lowers it; indices below are of add_p2p(schedule))
    computes: dict[tuple[int, int], float]  # (rank, index) -> seconds of a compute action, its rank's gaps included
    messages: dict[tuple[int, int], float]  # (sender rank, SEND index) -> seconds of delivery
    peers: dict[tuple[int, int], int]  # (sender rank, SEND index) -> receiving rank
    step: int  # the measured step
    measured: float  # seconds: the step's pipeline span (first compute start to last compute end)
    spans: dict[tuple[int, int], float] = field(default_factory=dict)  # (rank, index) -> the compute's own seconds

    def perturbation(self, extra: Perturbation | None = None) -> Perturbation:
        """The recorded durations, with `extra` on top: a slow rank stretches its computes' own seconds (not the
        gaps around them: posting, a late RECV's progress), as `pipesim run --slow` does; links and jitter as
        elsewhere."""
        computes = dict(self.computes)
        if extra is None:
            return Perturbation(durations={**computes, **self.messages})
        for rank, factor in extra.slow:
            for key, own in self.spans.items():
                if key[0] == rank:
                    computes[key] += (factor - 1) * own
        return Perturbation(slow_links=extra.slow_links, jitter=extra.jitter, seed=extra.seed,
                            durations={**computes, **self.messages})


def pick_step(tl: Timeline, step: int | None = None) -> int:
    """`step` (checked), else the measured step after the warm-up whose span is the median (the lower one)."""
    steps = tl.steps()
    if step is not None:
        if step not in steps:
            raise PipesimError(f"the timeline has steps {steps[0]}-{steps[-1]}, not step {step}")
        return step
    warm = tl.meta.get("warmup", 0)
    if isinstance(warm, bool) or not isinstance(warm, int) or warm < 0:
        raise PipesimError(f"the timeline's meta 'warmup' must be a whole number of steps, got {warm!r}")
    kept = steps[warm:] or steps
    spans = sorted((pipeline_span(tl, s)[1] - pipeline_span(tl, s)[0], s) for s in kept)
    return spans[(len(spans) - 1) // 2][1]


def _meta_count(tl: Timeline, *keys: str, default: int | None = None) -> int:
    """The timeline's meta count under the first of `keys` it gives (else `default`): a positive integer, or refused."""
    value = next((tl.meta[k] for k in keys if tl.meta.get(k) is not None), default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PipesimError(f"the timeline's meta {keys[0]!r} must be a positive integer (the run's "
                           f"{'microbatches' if keys[0] == 'm' else keys[0]}), got {value!r}")
    return value


def record(tl: Timeline, step: int | None = None) -> Recorded:
    """The simulator's inputs for one measured step of `tl` (a registered schedule's run)."""
    if tl.schedule not in registry.names():
        raise PipesimError(f"the timeline's schedule {tl.schedule!r} is not a registered one: import the trace "
                           "with --schedule NAME")
    p, m = tl.num_ranks, _meta_count(tl, "m", "microbatches")
    stages = _meta_count(tl, "stages") if tl.meta.get("stages") is not None else p * _meta_count(tl, "v", default=1)
    sched = registry.build(tl.schedule, p, m, stages // p if registry.spec(tl.schedule).virtual else None)
    if sched.overlaps:
        raise PipesimError(f"{tl.schedule} runs overlapped forward + backward pairs, which the replay does not "
                           "read from a timeline")
    step = pick_step(tl, step)
    t0, t1, _ = pipeline_span(tl, step)
    seen = {(e.rank, e.stream, e.kind, e.stage, e.microbatch): e for e in tl.events if e.step == step}
    lowered = add_p2p(sched)
    computes: dict[tuple[int, int], float] = {}
    spans: dict[tuple[int, int], float] = {}
    done: dict[tuple[int, int], float] = {}  # (rank, compute index) -> its end with its SENDs' posting (rebased)
    for r, prog in enumerate(lowered.programs):
        posts = [(e.start - t0, e.end - t0) for e in tl.events if e.step == step and e.rank == r and e.stream == "send"]
        starts = sorted(e.start - t0 for e in tl.events if e.step == step and e.rank == r and e.stream != "send")
        for i, a in enumerate(prog):
            if a.kind in COMPUTE:
                e = seen.get((r, "compute", a.kind.value, a.stage, a.microbatch))
                if e is None:
                    raise PipesimError(f"step {step} of the timeline has no {a} on rank {r}: not a run of "
                                       f"{tl.schedule} with p {p}, m {m}")
                end = e.end - t0
                nxt = next((x for x in starts if x >= end), end)  # the rank's next RECV or compute
                # posting the SENDs that follow it is its rank's work, up to its next action (a span that lasts
                # to the send's completion, as pipesim run records it, is cut there)
                done[(r, i)] = min(nxt, max([end] + [x1 for x0, x1 in posts if end <= x0 <= nxt]))
                spans[(r, i)] = e.end - e.start
    where = {tuple(a): (r, i) for r, prog in enumerate(lowered.programs) for i, a in enumerate(prog)}
    for r, prog in enumerate(lowered.programs):  # a message cannot be posted after its consumer began
        for i, a in enumerate(prog):
            if a.kind in SENDS:
                k = next(k for k in range(i - 1, -1, -1) if prog[k].kind in COMPUTE)
                dst, j = where[tuple(a.matching())]
                use = next(b for b in lowered.programs[dst][j:] if b.kind in COMPUTE)
                began = seen[(dst, "compute", use.kind.value, use.stage, use.microbatch)].start - t0
                own = seen[(r, "compute", prog[k].kind.value, prog[k].stage, prog[k].microbatch)].end - t0
                done[(r, k)] = min(done[(r, k)], max(own, began))
    sends: dict[tuple, tuple[int, int, float, float]] = {}  # SEND -> (sender rank, index, posted in the replay, traced)
    for r, prog in enumerate(lowered.programs):
        for i, a in enumerate(prog):
            if a.kind in SENDS:
                k = next(k for k in range(i - 1, -1, -1) if prog[k].kind in COMPUTE)  # its producer
                e = seen.get((r, "send", a.kind.value, a.stage, a.microbatch))  # a runtime may post it later
                made = done[(r, k)]
                sends[tuple(a)] = (r, i, made, max(made, e.start - t0) if e is not None else made)
    messages: dict[tuple[int, int], float] = {}
    peers: dict[tuple[int, int], int] = {}
    for r, prog in enumerate(lowered.programs):
        prev = ready = 0.0
        for i, a in enumerate(prog):
            if a.kind in RECVS:
                src, j, made, posted = sends[tuple(a.matching())]
                e = seen.get((r, "recv", a.kind.value, a.stage, a.microbatch))
                if e is not None:
                    start, end = e.start - t0, e.end - t0
                else:  # not in the trace: it ended when its compute began
                    nxt = next(b for b in prog[i:] if b.kind in COMPUTE)
                    start = end = seen[(r, "compute", nxt.kind.value, nxt.stage, nxt.microbatch)].start - t0
                # the receiver waited for the sender: the RECV's end; else the message was there when the RECV began
                # and what the RECV took (gloo's progress of a late RECV) is the receiver's own
                arrival = end if start < posted else max(made, start)
                messages[(src, j)] = max(0.0, arrival - made)
                peers[(src, j)] = r
                ready = max(ready, arrival)
            elif a.kind in COMPUTE:
                computes[(r, i)] = max(0.0, done[(r, i)] - max(prev, ready))
                spans[(r, i)] = min(spans[(r, i)], computes[(r, i)])
                prev, ready = done[(r, i)], 0.0
    return Recorded(sched, computes, messages, peers, step, t1 - t0, spans)


def run(rec: Recorded, perturb: Perturbation | None = None) -> SimResult:
    """The recorded step through the simulator (no machine model: every duration is the measured one)."""
    table = CostTable.uniform(rec.schedule.num_stages, 0.0, 0.0, 0.0)
    return simulate(rec.schedule, table, None, comm=False, perturb=rec.perturbation(extra=perturb))


def _span(result: SimResult) -> float:
    """First compute start to last compute end of a simulated step (the measured step's definition)."""
    sched = result.schedule
    starts = [result.starts[r][i] for r, prog in enumerate(sched.programs) for i, a in enumerate(prog)
              if a.kind in COMPUTE]
    ends = [result.ends[r][i] for r, prog in enumerate(sched.programs) for i, a in enumerate(prog)
            if a.kind in COMPUTE]
    return max(ends) - min(starts)


def median_rank(rec: Recorded) -> int:
    """The rank whose compute seconds in the step are the median (the lower one with an even count)."""
    totals = sorted((sum(v for (r, _), v in rec.computes.items() if r == rank), rank)
                    for rank in range(rec.schedule.num_ranks))
    return totals[(len(totals) - 1) // 2][1]


def _by_kind(rec: Recorded, rank: int) -> dict[str, list[tuple[int, float]]]:
    """kind -> [(index, seconds)] of the rank's computes in program order."""
    prog = add_p2p(rec.schedule).programs[rank]
    out: dict[str, list[tuple[int, float]]] = {}
    for (r, i), v in sorted(rec.computes.items()):
        if r == rank:
            out.setdefault(prog[i].kind.value, []).append((i, v))
    return out


def _link(rec: Recorded, key: tuple[int, int]) -> tuple[int, int]:
    return tuple(sorted((key[0], rec.peers[key])))


def what_ifs(rec: Recorded) -> dict:
    """The replay against the measured step, then each rank and each link brought to the median's: the step
    and the share of it lost to that rank or link ((replay - what-if) / replay)."""
    replay = _span(run(rec))
    mid = median_rank(rec)
    typical = _by_kind(rec, mid)
    ranks = []
    for k in range(rec.schedule.num_ranks):
        computes = dict(rec.computes)
        for kind, items in _by_kind(rec, k).items():
            ref = typical.get(kind, [])
            for j, (i, _) in enumerate(items):
                if j < len(ref):
                    computes[(k, i)] = ref[j][1]
        t = _span(run(replace(rec, computes=computes)))
        ranks.append({"rank": k, "compute": sum(v for (r, _), v in rec.computes.items() if r == k),
                      "step_without": t, "share": (replay - t) / replay if replay > 0 else 0.0})
    per_link: dict[tuple[int, int], list[float]] = {}
    for key, v in rec.messages.items():
        per_link.setdefault(_link(rec, key), []).append(v)
    medians = {lk: statistics.median(v) for lk, v in per_link.items()}
    typical_link = statistics.median_low(sorted(medians.values())) if medians else 0.0
    links = []
    for lk in sorted(per_link):
        messages = {key: (typical_link if _link(rec, key) == lk else v) for key, v in rec.messages.items()}
        t = _span(run(replace(rec, messages=messages)))
        links.append({"link": f"{lk[0]}-{lk[1]}", "median_delivery": medians[lk], "step_without": t,
                      "share": (replay - t) / replay if replay > 0 else 0.0})
    return {"schedule": rec.schedule.name, "ranks_count": rec.schedule.num_ranks, "step": rec.step,
            "measured_step": rec.measured, "replayed_step": replay,
            "replay_error": replay / rec.measured - 1 if rec.measured > 0 else 0.0,
            "median_rank": mid, "median_link_delivery": typical_link, "ranks": ranks, "links": links}


__all__ = ["Recorded", "median_rank", "pick_step", "record", "run", "what_ifs"]
