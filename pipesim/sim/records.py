"""What the simulator kernel writes: the run's raw record (per-action times, transfers, collectives, memory),
and the collective records."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipesim.cost.table import CostTable
from pipesim.hardware.machine import Hardware
from pipesim.ir.schedule import Schedule
from pipesim.job import Job
from pipesim.sim.links import Transfer


@dataclass
class CollectiveRecord:
    """A collective on a rank's collective stream (data-parallel / ZeRO, `pipesim.sim.step`)."""

    rank: int
    kind: str  # "all_reduce", "reduce_scatter", "all_gather"; "send_recv": DualPipe's swap of replicas' gradients
    stage: int
    start: float  # seconds
    end: float  # seconds
    nbytes: int  # bytes per device buffer
    after: int = -1  # index of the compute action whose end released it
    prev: CollectiveRecord | None = None  # the collective before it on the same stream
    # pipesim.cost.step_costs.PHASES: "grads", "forward"/"backward" (ZeRO-3 prefetch), "params"; or "replicas"
    # (pipesim.sim.step: the replicated stages' gradients swapped before the optimizer) or "embedding" (a last
    # stage's embedding copy's gradients all-reduced with the first stage's)
    phase: str = "grads"


@dataclass
class RunRecord:
    """One run of the kernel as it happened, before any metric: what `SimResult.build` derives everything from."""

    schedule: Schedule  # lowered (with SEND/RECV)
    table: CostTable
    hardware: Hardware | None
    comm: bool  # links modeled
    job: Job  # its pp is the schedule's ranks
    starts: list[list[float]]  # seconds, per rank, per action
    ends: list[list[float]]  # seconds, per rank, per action
    tp_time: list[list[float]]  # seconds of TP collectives inside each compute action
    transfers: list[Transfer]  # in posting order
    collectives: list[CollectiveRecord]  # in issue order
    memory: list[list[tuple[float, int]]]  # per rank: (seconds, activation bytes: stashed + recomputing)
    peak_inflight: list[int]  # per rank: most microbatches stashed at once
    messages: list  # message slot -> Transfer (pipesim.ir.deps.message_slot)
    slot_stride: int  # microbatch slots per (stage, direction)
    step_ends: list = field(default_factory=list)  # per rank, pipesim.sim.step.RankStepEnd; [] without step costs
    cp_seconds: dict = field(default_factory=dict)  # (stage, kind) -> exposed ring-attention seconds per action
    sm_shared: list[float] = field(default_factory=list)  # per rank: seconds of compute lost to its DP collectives
    ep_time: list[list[float]] = field(default_factory=list)  # seconds of EP all-to-alls inside each compute action


__all__ = ["CollectiveRecord", "RunRecord"]
