"""The simulator's programs: each rank's lowered actions compiled to op records for the hot loop.

An op holds what the kernel needs of an action and is the same for every microbatch, so one record
per (stage, kind) is shared (creating and hashing records per action would dominate at p=64,
m=1024); the microbatch is read from the action at run time. Message slots follow
`pipesim.deps.message_slot` (slot = op.slot + microbatch), and how long compute takes comes from
the compute plug-in (`TableCompute`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from pipesim.comm_costs import group_collective_time
from pipesim.cost_equation import SplitCosts
from pipesim.costs import CostTable
from pipesim.deps import message_slot, produces_weight_grad, releases_activations
from pipesim.ir import COMPUTE, SENDS, Action, Kind, Schedule
from pipesim.parallel_dims import ParallelDims


class ComputeOp(NamedTuple):
    """F, B, I or W on one stage."""

    seconds: float  # alone on its device, split bookkeeping included, TP collectives not
    tp_seconds: float  # seconds of the blocking TP collectives inside it
    stash_bytes: int  # bytes of activations stashed (+, F) or freed (-, the releasing backward)
    inflight: int  # +1 (F), -1 (the releasing backward) or 0: microbatches stashed
    allreduce_stage: int  # the stage whose DP gradient all-reduce follows it (its last B/W), else -1


class SendOp(NamedTuple):
    """A SEND: posts the message into slot `slot + microbatch`."""

    slot: int
    dst: int  # pipeline rank that receives
    nbytes: int  # bytes
    seconds: float  # uncontended transfer time
    resources: tuple[str, ...]  # contended link resources it holds
    link: str  # link class name ("" without communication)


class RecvOp(NamedTuple):
    """A RECV: takes the message in slot `slot + microbatch`."""

    slot: int


Op = ComputeOp | SendOp | RecvOp


@dataclass(frozen=True)
class TableCompute:
    """Compute plug-in: an action's seconds from the cost table, plus the split bookkeeping of a host profile.

    The first stage's split W is a plain backward and its I is empty: no bookkeeping there.
    """

    table: CostTable
    split: SplitCosts | None = None  # None: hardware without a host profile (GPUs, or no hardware)

    def seconds(self, action: Action) -> float:
        d = self.table.duration(action)
        k, st = action.kind, action.stage
        if self.split is not None and st and (k == Kind.I or k == Kind.W):
            costs = self.table.stages[st]
            d = self.split.add_to(d, 1, costs.weight_ops if k == Kind.W else 0.0,
                                  costs.backward_ops if k == Kind.I else 0.0)
        return d


def compile_programs(sched: Schedule, compute: TableCompute, hw: Any, comm: bool, par: ParallelDims,
                     tp_collectives: dict) -> list[list[Op]]:
    """Per rank, the op of each action (one shared record per (rank, stage, kind)); message slots use
    the schedule's microbatch count as stride."""
    stride = sched.num_microbatches
    last_grad: dict[int, tuple[int, int]] = {}  # stage -> (rank, index) of its last B/W
    all_ops: list[list[Op]] = []
    for rank, prog in enumerate(sched.programs):
        cache: dict[tuple[int, str], tuple[Op, bool]] = {}  # (stage, kind) -> (op, finishes a weight gradient)
        ops: list[Op] = []
        append = ops.append
        for i, a in enumerate(prog):
            key = (a.stage, a.kind)
            entry = cache.get(key)
            if entry is None:
                entry = cache[key] = (_op(rank, a, sched, compute, hw, comm, par, tp_collectives, stride),
                                      a.kind in COMPUTE and produces_weight_grad(a.kind))
            append(entry[0])
            if entry[1]:
                last_grad[a.stage] = (rank, i)
        all_ops.append(ops)
    for stage, (rank, i) in sorted(last_grad.items()):  # then all-reduce the stage's gradient
        all_ops[rank][i] = all_ops[rank][i]._replace(allreduce_stage=stage)
    return all_ops


def _op(rank: int, a: Action, sched: Schedule, compute: TableCompute, hw: Any, comm: bool, par: ParallelDims,
        tp_collectives: dict, stride: int) -> Op:
    k, st = a.kind, a.stage
    if k in COMPUTE:
        sign = 1 if k == Kind.F else (-1 if releases_activations(k) else 0)
        return ComputeOp(compute.seconds(a), _tp_time(rank, a, hw, comm, par, tp_collectives),
                         sign * compute.table.stages[st].activation_bytes, sign, -1)
    slot = message_slot(st, k, 0, stride)
    if k not in SENDS:
        return RecvOp(slot)
    dst = sched.rank_of(a.peer_stage)
    nbytes = compute.table.transfer_bytes(a)
    if not comm:
        return SendOp(slot, dst, nbytes, 0.0, (), "")
    src_dev, dst_dev = par.rank(pp=rank), par.rank(pp=dst)
    return SendOp(slot, dst, nbytes, hw.p2p_time(src_dev, dst_dev, nbytes),
                  tuple(sorted(hw.link_resources(src_dev, dst_dev))), hw.link_between(src_dev, dst_dev).name)


def _tp_time(rank: int, action: Action, hw: Any, comm: bool, par: ParallelDims, tp_collectives: dict) -> float:
    """Seconds of the blocking TP collectives inside one compute action."""
    colls = tp_collectives.get((action.stage, action.kind.value)) if tp_collectives else None
    if not colls or par.tp == 1 or not comm:
        return 0.0
    group = par.group("tp", par.rank(pp=rank))
    return sum(group_collective_time(hw, kind, group, nbytes) for kind, nbytes in colls)


__all__ = ["ComputeOp", "Op", "RecvOp", "SendOp", "TableCompute", "compile_programs"]
