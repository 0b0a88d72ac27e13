"""The simulated step around the pipeline: data-parallel collectives on each rank's collective stream,
ZeRO-3's prefetched all-gathers, the optimizer step and the parameter all-gather after it.

Each pipeline rank has one collective stream (FIFO: a collective starts when it is issued and the
one before it has ended), beside its compute stream, so collectives overlap the rank's compute.
- Gradients: after a stage's last backward piece that produces weight gradients, its "grads"
  collectives (all_reduce for ZeRO 0, reduce_scatter for ZeRO 1 and 3) are issued; ZeRO 2 keeps
  only its gradient shard, so its "microbatch" reduce_scatter follows every such piece.
- ZeRO 3: every chunk's all-gather is issued at the step's start in the order the rank first needs
  them (prefetch); the chunk's first forward waits until its all-gather has ended (a `GateOp` in the
  rank's program), and the chunk stays gathered until its gradients' reduce_scatter (the memory
  model's `step_peak_state`). A "backward" phase collective would gate the first backward alike.
- ZeRO 3 with resharding (pipesim.model.fsdp: FSDP2 frees the chunk after a forward, or without pipelining
  after every backward): a forward or first backward piece that finds its chunk freed issues the chunk's
  "gather" all-gather when it starts; its units compute as their parts arrive (`gathered_seconds`), and what
  that adds is the rank's gather wait. A ZeRO-3 chunk's gradients are reduce-scattered unit by unit as the
  backward passes them (FSDP2 reduces each unit when its backward ends).
- Optimizer: once the rank's program is done and its gradient collectives have ended (Adam needs
  the reduced gradients), the optimizer step of all its stages runs on the compute stream, then
  the "params" all-gathers (ZeRO 1/2) on the collective stream. The step ends when the last rank's
  optimizer and all-gathers are done (`step_time`); the pipeline's span stays `makespan`.
- Replicas (a schedule with chains, DualPipe): before the optimizer, each pair of ranks holding the two
  copies of model stages swaps those stages' gradients (executor.replicas: one message each way at once,
  a "send_recv" timed as one transfer over the pair's link), from when both ranks are ready as above and
  both streams are free; ZeRO 1-3 swap the 1/dp shard left after their reduce_scatter. Phase "replicas".
- Embedding copies: a last stage that keeps its own copy of the word embedding (a tied head, the MTP modules')
  on another rank than the first stage all-reduces that copy's gradients with the first stage's once both are
  ready, before either runs its optimizer: Megatron-core's finalize_model_grads, after the data-parallel sync,
  `_allreduce_word_embedding_grads` over the embedding group (NVIDIA/Megatron-LM v0.15.3
  megatron/core/distributed/finalize_model_grads.py), the whole main_grad tensor even under the distributed
  optimizer. Phase "embedding"; one chain only (a schedule with chains keeps its copies on the first stage's rank).
Without `ParallelCosts.step` only today's DDP all_reduce of `dp_grad_bytes` runs, and no optimizer.
With `CommOptions.overlap_grad_reduce` (Megatron's --overlap-grad-reduce) a gradient collective is cut
into buckets of `bucket_params` parameters in reverse layer order; bucket k becomes ready while the
backward that produces it runs, at start + duration x (cumulative fraction of the stage's parameters),
and the stream reduces the buckets in order; what runs past the backward's end is the exposed tail.
Every collective is timed by `pipesim.comm.collective_algos.collective_seconds` (NCCL's algorithms on GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from pipesim.comm.collective_algos import collective_seconds
from pipesim.comm.comm_options import bucket_fractions
from pipesim.cost.model_costs import ParallelCosts
from pipesim.cost.step_costs import StepCollective, StepCosts
from pipesim.hardware.machine import Hardware
from pipesim.ir.schedule import BACKWARD_FIRST, Kind, Schedule
from pipesim.job import Job
from pipesim.model.fsdp import fsdp_units, gathered_seconds
from pipesim.model.memory import named_precision
from pipesim.sim.program import ComputeOp, Op
from pipesim.sim.records import CollectiveRecord

# phases of step-end collectives: after the pipeline's span (makespan)
AFTER_PIPELINE = ("replicas", "embedding", "params")


class GateOp(NamedTuple):
    """A compute that may not start before `ready` (its ZeRO-3 all-gather's end); then it runs as `op`."""

    ready: float  # seconds
    op: ComputeOp


@dataclass
class RankStepEnd:
    """One rank's end of step: when its optimizer ran and when everything it had to do was done (seconds)."""

    finish: float  # its program's last action
    optimizer_start: float
    optimizer_end: float
    step_end: float  # the optimizer's end, or its last parameter all-gather's
    gate_wait: float  # seconds its computes waited for ZeRO-3 all-gathers

    @property
    def optimizer(self) -> float:
        return self.optimizer_end - self.optimizer_start

    @property
    def exposed(self) -> float:
        """Seconds the rank's step was held by data-parallel communication its compute did not hide."""
        return self.gate_wait + (self.optimizer_start - self.finish) + (self.step_end - self.optimizer_end)


class CollectiveStreams:
    """Every rank's collective stream and the step's end (the kernel calls `grads_done` and `finish`)."""

    def __init__(self, sched: Schedule, hw: Hardware | None, comm: bool, job: Job, costs: ParallelCosts | None):
        par = job.dims
        self.sched, self.hw, self.par, self.comm = sched, hw, par, comm
        self.step: StepCosts | None = costs.step if costs is not None else None
        experts = self.step is not None and any(c.group == "edp" for cs in self.step.collectives for c in cs)
        # collectives take time (else none are recorded, as today); the experts' reduce over edp even at dp 1
        self.on = comm and hw is not None and (par.dp_cp > 1 or experts)
        self.dp_bytes = list(costs.dp_grad_bytes) if costs is not None else []
        n = sched.num_ranks
        self.records: list[CollectiveRecord] = []
        self.last: list[CollectiveRecord | None] = [None] * n  # the tail of each rank's stream
        self.gate_wait = [0.0] * n  # seconds
        self.groups = {axis: [par.group("dp_cp" if axis == "dp" else axis, par.rank(pp=r)) for r in range(n)]
                       for axis in (("dp", "edp") if experts else ("dp",))} if self.on else {}
        opts = job.comm
        self.bucket = opts.bucket_params(par.dp_cp) if opts.overlap_grad_reduce else 0  # parameters; 0: no buckets
        counts = costs.param_counts if costs is not None else ()
        dtype = costs.dtype_bytes if costs is not None else 0
        if not counts and dtype:  # no exact counts: from the gradient bytes
            counts = tuple(b // dtype for b in self.dp_bytes)
        self.params = counts  # parameters of each stage on one tp rank (what the buckets divide)
        precision = costs.precision if costs is not None else "fp32"
        state = named_precision(precision)
        self.grad_bytes = state.grad_bytes  # bytes per gradient value
        self.param_bytes = state.param_bytes  # bytes per parameter all-gathered
        # ZeRO 3: each chunk's FSDP units (its layers, the embedding, the head), and the chunks each rank holds
        # gathered now, where FSDP2 frees them between computes (`fsdp`; None: gathered once per step)
        layers = costs.layers_per_stage if costs is not None else ()
        last = sched.num_stages - 1
        self.units = tuple(fsdp_units(n, first=s == 0, last=s == last) for s, n in enumerate(layers)) \
            if self.step is not None and self.step.zero == 3 and any(layers) else ()  # all 0: hand-given costs
        policy = self.step.fsdp if self.step is not None else None
        self.fsdp = policy if self.on and policy is not None and not policy.once_per_step else None
        self.gathered: list[set[int]] = [set() for _ in range(n)]
        self.embedding_copies = costs.embedding_copy_counts if costs is not None else ()  # parameters per stage

    def _issue(self, rank: int, kind: str, stage: int, nbytes: int, now: float, after: int,
               phase: str, group: str = "dp") -> CollectiveRecord:
        seconds = collective_seconds(self.hw, kind, self.groups[group][rank], nbytes)
        prev = self.last[rank]
        start = now if prev is None or prev.end <= now else prev.end
        rec = CollectiveRecord(rank, kind, stage, start, start + seconds, nbytes, after, prev, phase)
        self.last[rank] = rec
        self.records.append(rec)
        return rec

    def prefetch(self, ops: list[list[Op]]) -> None:
        """ZeRO 3: issue each chunk's all-gathers at the step's start and gate its first forward / backward."""
        if self.step is None or not self.on:
            return
        for rank, prog in enumerate(self.sched.programs):
            needs: list[tuple[int, int, StepCollective]] = []  # (index of the compute that needs it, stage, collective)
            seen: set[tuple[int, str]] = set()
            for i, a in enumerate(prog):
                phase = "forward" if a.kind == Kind.F else "backward" if a.kind in BACKWARD_FIRST else ""
                if phase and (a.stage, phase) not in seen:
                    seen.add((a.stage, phase))
                    needs += [(i, a.stage, c) for c in self.step.collectives[a.stage] if c.phase == phase]
            for i, stage, c in needs:  # in the order the program needs them
                op = ops[rank][i]
                gated = op if isinstance(op, GateOp) else None  # the stage's dense and expert gathers gate it once
                compute = gated.op if gated else op
                if self.step.bucketed_gather and self.bucket:  # --overlap-param-gather: the next step's, in buckets
                    ready = self._bucketed_gather(rank, stage, c, compute)
                else:
                    ready = self._issue(rank, c.kind, stage, c.nbytes, 0.0, -1, c.phase, c.group).end
                ops[rank][i] = GateOp(max(ready, gated.ready) if gated else ready, compute)

    def _bucketed_gather(self, rank: int, stage: int, c: StepCollective, op: Op) -> float:
        """Megatron's overlapped parameter all-gather of a chunk, one bucket after another in forward order (the
        first dispatched at the step's start, the rest as the forward reaches them): the forward may start once
        every bucket k is in by the time its layers run, the forward's layers spread over the chunk's parameters
        evenly: ready = max_k (end_k - F c_{k-1}), c_{k-1} the fraction of the parameters in buckets before k."""
        fractions = bucket_fractions(c.nbytes, self.bucket * self.param_bytes)
        forward = op.seconds + op.tp_seconds  # seconds the forward runs alone
        ready, sent, before = 0.0, 0, 0.0
        for f in fractions:
            upto = round(c.nbytes * f)
            rec = self._issue(rank, c.kind, stage, upto - sent, 0.0, -1, c.phase, c.group)
            ready = max(ready, rec.end - forward * before)
            sent, before = upto, f
        return ready

    def fsdp_gather(self, rank: int, stage: int, index: int, now: float) -> CollectiveRecord | None:
        """ZeRO 3 with resharding: the all-gather(s) action `index` of `stage`, starting at `now`, issues because
        FSDP2 freed its chunk (the later record, or None when the chunk is gathered or never freed)."""
        if self.fsdp is None or stage in self.gathered[rank]:
            return None
        rec = None
        for c in self.step.collectives[stage]:
            if c.phase == "gather":
                rec = self._issue(rank, c.kind, stage, c.nbytes, now, index, c.phase, c.group)
        self.gathered[rank].add(stage)
        return rec

    def fsdp_seconds(self, rec: CollectiveRecord, stage: int, now: float, seconds: float) -> float:
        """A compute of `seconds` from `now` whose chunk arrives unit by unit with `rec` (pipesim.model.fsdp)."""
        return gathered_seconds(now, rec.start, rec.end, seconds, self.units[stage] if self.units else 1)

    def fsdp_free(self, rank: int, stage: int, forward: bool, weight_grads: bool) -> None:
        """After a compute of `stage`: FSDP2 frees the chunk after a forward (reshard after forward) and, without
        pipelining, after the backward piece that leaves its weight gradients."""
        if self.fsdp is not None and ((forward and self.fsdp.after_forward)
                                      or (weight_grads and self.fsdp.after_backward)):
            self.gathered[rank].discard(stage)

    def grads_done(self, rank: int, stage: int, index: int, now: float, start: float | None = None,
                   share: float = 0.0) -> float:
        """The stage's last weight-gradient piece (ZeRO 2: each), action `index` run from `start` to `now`,
        ended: reduce its gradients (in buckets during it with overlap_grad_reduce). Returns the seconds that
        piece ran longer for its own buckets beside it: their overlap with it x `share` (the fraction of its
        progress NCCL's SMs take, ComputeOp.shared / (seconds + shared)); 0 without buckets or a share."""
        if not self.on:
            return 0.0
        if self.step is None:  # today's step: DDP all_reduce of dp_grad_bytes
            if self.dp_bytes:
                return self._reduce(rank, "all_reduce", stage, self.dp_bytes[stage], start, now, index, "grads", share)
            return 0.0
        late = 0.0
        for c in self.step.collectives[stage]:
            if c.phase in ("grads", "microbatch"):  # ZeRO 2's "microbatch" ones: after every weight gradient
                late += self._reduce(rank, c.kind, stage, c.nbytes, start, now, index, c.phase, share, c.group)
        return late

    def _reduce(self, rank: int, kind: str, stage: int, nbytes: int, start: float | None, end: float, index: int,
                phase: str, share: float = 0.0, group: str = "dp") -> float:
        """One gradient collective of a backward run from `start` to `end`: whole at `end`, or bucket by bucket
        as the backward passes them (bucket k of fraction f_k ready at start + (end - start) f_k; the last at
        `end` exactly). Returns the buckets' overlap with [start, end] x `share` (what they cost the backward)."""
        if self.units and start is not None and stage < len(self.units):  # ZeRO 3: FSDP2 reduces unit by unit
            u = self.units[stage]
            fractions = [(k + 1) / u for k in range(u)]
        elif self.bucket and start is not None and stage < len(self.params):
            fractions = bucket_fractions(self.params[stage], self.bucket)
        else:
            self._issue(rank, kind, stage, nbytes, end, index, phase, group)
            return 0.0
        sent = 0  # bytes of the buckets before
        overlap = 0.0  # seconds the buckets ran while the backward did
        for f in fractions[:-1]:
            upto = round(nbytes * f)
            rec = self._issue(rank, kind, stage, upto - sent, start + (end - start) * f, index, phase, group)
            overlap += max(0.0, min(rec.end, end) - rec.start)
            sent = upto
        self._issue(rank, kind, stage, nbytes - sent, end, index, phase, group)
        return overlap * share if share else 0.0

    def beside(self, rank: int, now: float, seconds: float, extra: float) -> float:
        """Seconds a compute of `seconds` alone takes from `now` on the rank while its collective stream is busy:
        beside a collective it progresses at seconds / (seconds + extra) of its pace (its GEMMs on the SMs NCCL's
        channels leave), alone at full pace. The stream's collectives issued so far are all it can meet: the
        rank issues new ones only when a compute of its own ends."""
        busy = []  # (start, end) of the stream's collectives still running after `now`, latest first
        rec = self.last[rank] if self.on else None
        while rec is not None and rec.end > now:
            busy.append((rec.start, rec.end))
            rec = rec.prev
        if not busy:
            return seconds
        rate = seconds / (seconds + extra)  # progress per second beside a collective
        t, work = now, seconds  # work: seconds of it left at full pace
        for lo, hi in reversed(busy):
            lo = max(lo, now)
            if lo > t:  # alone until the next collective
                if work <= lo - t:
                    return t + work - now
                work -= lo - t
                t = lo
            if work <= (hi - t) * rate:
                return t + work / rate - now
            work -= (hi - t) * rate
            t = hi
        return t + work - now

    def finish(self, ends: list[list[float]]) -> list[RankStepEnd]:
        """After the pipeline: each rank's replicas' gradient swap (chains), its optimizer (after its program and
        its gradient collectives), then its parameter all-gathers. [] without step costs."""
        if self.step is None:
            return []
        n = self.sched.num_ranks
        finish = [ends[r][-1] if ends[r] else 0.0 for r in range(n)]
        ready = [max([finish[r], *(c.end for c in self.records if c.rank == r and c.phase in ("grads", "microbatch"))])
                 for r in range(n)]
        starts = self._reduce_embedding(self._swap_replicas(ready))
        out = []
        for rank in range(n):
            start = starts[rank]
            stages = self.sched.stages_of(rank)
            end = start
            for s in stages:
                end += self.step.optimizer_seconds[s]
            step_end = end
            if self.on:
                for s in stages:
                    for c in self.step.collectives[s]:
                        if c.phase == "params":
                            step_end = self._issue(rank, c.kind, s, c.nbytes, end, -1, "params", c.group).end
            out.append(RankStepEnd(finish[rank], start, end, step_end, self.gate_wait[rank]))
        return out

    def _reduce_embedding(self, starts: list[float]) -> list[float]:
        """Each rank's optimizer start after the embedding group's all-reduce (the first stage's rank and the rank
        of the last stage, when that one keeps its own embedding copy): `starts`, later for those two ranks."""
        sched = self.sched
        last = sched.num_stages - 1
        if not self.comm or self.hw is None or sched.chains > 1 or last >= len(self.embedding_copies):
            return starts
        a, b = sched.rank_of(0), sched.rank_of(last)
        nbytes = self.embedding_copies[last] * self.grad_bytes
        if a == b or not nbytes:
            return starts
        out = list(starts)
        self._pair_exchange(out, "all_reduce", ((a, 0), (b, last)), nbytes, "embedding")
        return out

    def _pair_exchange(self, starts: list[float], kind: str, ends: tuple[tuple[int, int], tuple[int, int]],
                       nbytes: int, phase: str) -> None:
        """A step-end exchange between two ranks ((rank, stage) each) once both are ready (`starts`) and both
        streams are free, recorded on both; `starts` moved to its end, in place."""
        (a, _), (b, _) = ends
        tails = [c.end for c in (self.last[a], self.last[b]) if c is not None]
        begin = max([starts[a], starts[b], *tails])
        seconds = collective_seconds(self.hw, kind, [self.par.rank(pp=a), self.par.rank(pp=b)], nbytes)
        for rank, stage in ends:
            rec = CollectiveRecord(rank, kind, stage, begin, begin + seconds, nbytes, -1, self.last[rank], phase)
            self.last[rank] = rec
            self.records.append(rec)
            starts[rank] = begin + seconds

    def replica_pairs(self) -> dict[tuple[int, int], list[int]]:
        """(rank a, rank b), a < b -> a's stages whose other copy is on b, by model stage (b lists the same model
        stages); {} for one chain. Copies on one rank are summed in place: no pair."""
        pairs: dict[tuple[int, int], list[int]] = {}
        sched = self.sched
        if sched.chains == 1:
            return pairs
        for a in range(sched.num_ranks):
            for s in sorted(sched.stages_of(a), key=sched.model_stage):
                for other in sched.replicas(s):
                    b = sched.rank_of(other)
                    if b > a:
                        pairs.setdefault((a, b), []).append(s)
        return pairs

    def _swap_replicas(self, ready: list[float]) -> list[float]:
        """Each rank's optimizer start: `ready`, or the end of its swaps of replicated gradients (both ways at
        once, one message per pair, in pair order) when the pipeline has chains and links take time."""
        if not self.comm or self.sched.chains == 1:
            return ready
        starts = list(ready)
        dp, zero = self.par.dp_cp, self.step.zero
        for (a, b), stages in sorted(self.replica_pairs().items()):
            # bytes: each copy's gradients; after ZeRO's reduce_scatter, a rank's ceil(P / dp) shard of each stage
            params = [self.params[s] if s < len(self.params) else 0 for s in stages]  # per tp rank
            nbytes = sum(-(-n // dp) if zero else n for n in params) * self.grad_bytes
            if not nbytes:
                continue
            theirs = next(o for o in self.sched.replicas(stages[0]) if self.sched.rank_of(o) == b)
            self._pair_exchange(starts, "send_recv", ((a, stages[0]), (b, theirs)), nbytes, "replicas")
        return starts


__all__ = ["CollectiveStreams", "GateOp", "RankStepEnd"]
