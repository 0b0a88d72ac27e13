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
- Optimizer: once the rank's program is done and its gradient collectives have ended (Adam needs
  the reduced gradients), the optimizer step of all its stages runs on the compute stream, then
  the "params" all-gathers (ZeRO 1/2) on the collective stream. The step ends when the last rank's
  optimizer and all-gathers are done (`step_time`); the pipeline's span stays `makespan`.
Without `ParallelCosts.step` only today's DDP all_reduce of `dp_grad_bytes` runs, and no optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from pipesim.comm_costs import group_collective_time
from pipesim.ir import BACKWARD_FIRST, Kind, Schedule
from pipesim.parallel_dims import ParallelDims
from pipesim.sim_program import ComputeOp, Op
from pipesim.sim_records import CollectiveRecord
from pipesim.step_costs import StepCosts


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

    def __init__(self, sched: Schedule, hw: Any, comm: bool, par: ParallelDims, costs: Any):
        self.sched, self.hw, self.par = sched, hw, par
        self.on = comm and par.dp > 1  # collectives take time (else none are recorded, as today)
        self.step: StepCosts | None = getattr(costs, "step", None)
        self.dp_bytes = list(getattr(costs, "dp_grad_bytes", None) or [])
        n = sched.num_ranks
        self.records: list[CollectiveRecord] = []
        self.last: list[CollectiveRecord | None] = [None] * n  # the tail of each rank's stream
        self.gate_wait = [0.0] * n  # seconds
        self.groups = [par.group("dp", par.rank(pp=r)) for r in range(n)] if self.on else []

    def _issue(self, rank: int, kind: str, stage: int, nbytes: int, now: float, after: int,
               phase: str) -> CollectiveRecord:
        seconds = group_collective_time(self.hw, kind, self.groups[rank], nbytes)
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
            needs: list[tuple[int, int, Any]] = []  # (index of the compute that needs it, stage, collective)
            seen: set[tuple[int, str]] = set()
            for i, a in enumerate(prog):
                phase = "forward" if a.kind == Kind.F else "backward" if a.kind in BACKWARD_FIRST else ""
                if phase and (a.stage, phase) not in seen:
                    seen.add((a.stage, phase))
                    needs += [(i, a.stage, c) for c in self.step.collectives[a.stage] if c.phase == phase]
            for i, stage, c in needs:  # in the order the program needs them
                rec = self._issue(rank, c.kind, stage, c.nbytes, 0.0, -1, c.phase)
                ops[rank][i] = GateOp(rec.end, ops[rank][i])

    def grads_done(self, rank: int, stage: int, index: int, now: float) -> None:
        """The stage's last weight-gradient piece (ZeRO 2: each) ended at `now` (action `index`): reduce
        its gradients."""
        if not self.on:
            return
        if self.step is None:  # today's step: DDP all_reduce of dp_grad_bytes
            if self.dp_bytes:
                self._issue(rank, "all_reduce", stage, self.dp_bytes[stage], now, index, "grads")
            return
        for c in self.step.collectives[stage]:
            if c.phase in ("grads", "microbatch"):  # ZeRO 2's "microbatch" ones: after every weight gradient
                self._issue(rank, c.kind, stage, c.nbytes, now, index, c.phase)

    def finish(self, ends: list[list[float]]) -> list[RankStepEnd]:
        """After the pipeline: each rank's optimizer (after its program and its gradient collectives), then
        its parameter all-gathers. [] without step costs."""
        if self.step is None:
            return []
        out = []
        for rank in range(self.sched.num_ranks):
            finish = ends[rank][-1] if ends[rank] else 0.0
            reductions = [c.end for c in self.records if c.rank == rank and c.phase in ("grads", "microbatch")]
            start = max([finish, *reductions])
            stages = self.sched.stages_of(rank)
            end = start
            for s in stages:
                end += self.step.optimizer_seconds[s]
            step_end = end
            if self.on:
                for s in stages:
                    for c in self.step.collectives[s]:
                        if c.phase == "params":
                            step_end = self._issue(rank, c.kind, s, c.nbytes, end, -1, "params").end
            out.append(RankStepEnd(finish, start, end, step_end, self.gate_wait[rank]))
        return out


__all__ = ["CollectiveStreams", "GateOp", "RankStepEnd"]
