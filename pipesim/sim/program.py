"""The simulator's programs: each rank's lowered actions compiled to op records for the hot loop.

An op holds what the kernel needs of an action and is the same for every microbatch, so one record
per (stage, kind) is shared (creating and hashing records per action would dominate at p=64,
m=1024); the microbatch is read from the action at run time. Message slots follow
`pipesim.ir.deps.message_slot` (slot = op.slot + microbatch), and how long compute takes comes from
the compute plug-in (`TableCompute`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from pipesim.comm.collective_algos import collective_seconds, collective_time, scatter_gather
from pipesim.comm.comm_options import CommOptions
from pipesim.comm.expert_exchange import ExpertExchange, exchange_timing, exposed_exchange_seconds
from pipesim.comm.overlap_interference import exposed_beside, exposed_collective
from pipesim.comm.tp_collective import TpCollective
from pipesim.comm.ub_overlap import exposed_ub
from pipesim.cost.cost_equation import SplitCosts
from pipesim.cost.model_costs import ParallelCosts
from pipesim.cost.step_costs import exposed_seconds, per_microbatch_stages
from pipesim.cost.table import CostTable
from pipesim.device.profile import device_profile
from pipesim.hardware.machine import Hardware
from pipesim.ir.deps import message_slot, produces_weight_grad, releases_activations
from pipesim.ir.schedule import BACKWARD_FIRST, COMPUTE, SENDS, Action, Kind, Schedule
from pipesim.job import Job
from pipesim.parallel_dims import ParallelDims


class ComputeOp(NamedTuple):
    """F, B, I or W on one stage."""

    seconds: float  # alone on its device, split bookkeeping included, TP collectives not
    tp_seconds: float  # seconds of the blocking TP collectives inside it
    stash_bytes: int  # bytes of activations stashed (+, F) or freed (-, the releasing backward)
    inflight: int  # +1 (F), -1 (the releasing backward) or 0: microbatches stashed
    allreduce_stage: int  # the stage whose DP gradient reduction follows it (its last B/W; ZeRO 2: each), else -1
    recompute_bytes: int = 0  # bytes a recomputing backward (B, or I) re-creates, live only while it runs
    shared: float = 0.0  # seconds it gains when it runs wholly beside its rank's data-parallel collectives (SMs)
    ep_seconds: float = 0.0  # seconds of the expert-parallel all-to-alls inside it (they block the rank)


class SendOp(NamedTuple):
    """A SEND: posts the message into slot `slot + microbatch`."""

    slot: int
    dst: int  # pipeline rank that receives
    nbytes: int  # bytes
    seconds: float  # uncontended transfer time
    resources: tuple[str, ...]  # contended link resources it holds
    link: str  # link class name ("" without communication)
    blocking: bool = False  # holds its rank until its bytes are in (Megatron's p2p_communication waits on its sends)


class RecvOp(NamedTuple):
    """A RECV: takes the message in slot `slot + microbatch`."""

    slot: int
    gather: float = 0.0  # seconds the receiving tp group all-gathers a scatter/gather message after it arrives


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
            if k == Kind.W and costs.split_rerun:
                d += costs.split_rerun
        return d


def compile_programs(sched: Schedule, compute: TableCompute, hw: Hardware | None, comm: bool, job: Job,
                     costs: ParallelCosts | None, cp_seconds: dict | None = None) -> list[list[Op]]:
    """Per rank, the op of each action (one shared record per (rank, stage, kind)), with the framework's behaviour
    lowered into the ops: the TP collectives inside each compute (`costs.tp_collectives`), ring attention's exposed
    hops (`cp_seconds`: (stage, kind) -> seconds, `cp_exposed`), the SMs a compute loses beside its rank's
    data-parallel collectives (`costs.sm_share`, where collectives take time: `comm` and dp > 1), which compute
    releases a stage's gradient reduction (its last B/W; with ZeRO 2 every one), Megatron's scatter/gather of
    pipeline messages (tp > 1 without sequence parallelism) and its blocking sends (`job.comm`). Message slots
    use the schedule's microbatch count as stride. `costs` None: a bare cost table (no parallelism around it)."""
    par = job.dims
    opts = job.comm
    shared = costs.sm_share if costs is not None and comm and par.dp_cp > 1 and costs.sm_share else {}
    every_grad = per_microbatch_stages(costs.step) if costs is not None else frozenset()
    tp_collectives = costs.tp_collectives if costs is not None and comm else {}  # each over a group of more than 1
    ep_exchanges = costs.ep_exchanges if costs is not None and comm and par.ep > 1 else {}
    scatter = opts.scatter_gather and par.tp > 1 and not job.sp
    blocking = opts.blocks_sends(interleaved=sched.model_stages > sched.num_ranks)
    stride = sched.num_microbatches
    last_grad: dict[int, tuple[int, int]] = {}  # stage -> (rank, index) of its last B/W
    ep_sms = 0  # SMs the all-to-all kernels hold while they run
    all_ops: list[list[Op]] = []
    for rank, prog in enumerate(sched.programs):
        cache: dict[tuple[int, Kind], Op] = {}  # (stage, kind) -> its one op on this rank
        for key, a in {(a.stage, a.kind): a for a in prog}.items():  # one action of each (stage, kind)
            op = _op(rank, a, sched, compute, hw, comm, par, tp_collectives, stride, cp_seconds, scatter,
                     blocking)
            if (a.stage, a.kind.value) in shared and a.kind in COMPUTE:
                op = op._replace(shared=shared[(a.stage, a.kind.value)])
            if (a.stage, a.kind.value) in ep_exchanges and a.kind in COMPUTE:
                ep, sms = _ep_time(rank, ep_exchanges[(a.stage, a.kind.value)], hw, par, opts)
                op = op._replace(ep_seconds=ep)
                ep_sms = max(ep_sms, sms)
            if a.kind in COMPUTE and produces_weight_grad(a.kind) and a.stage in every_grad:
                op = op._replace(allreduce_stage=a.stage)
            cache[key] = op
        get = cache.__getitem__
        all_ops.append([get((a.stage, a.kind)) for a in prog])
        grads = {(st, k) for st, k in cache if k in COMPUTE and produces_weight_grad(k)}
        for i in range(len(prog) - 1, -1, -1):  # each stage's last weight-gradient piece on this rank
            if not grads:
                break
            a = prog[i]
            if (a.stage, a.kind) in grads:
                grads = {g for g in grads if g[0] != a.stage}
                last_grad[a.stage] = (rank, i)
    for stage, (rank, i) in sorted(last_grad.items()):  # then all-reduce the stage's gradient
        all_ops[rank][i] = all_ops[rank][i]._replace(allreduce_stage=stage)
    if comm and opts.blocks_edge_sends(interleaved=sched.model_stages > sched.num_ranks):
        _block_edge_sends(sched, all_ops)
    sms = device_profile(hw.device.family).sms if ep_sms and hw is not None and hw.device.family else 0
    share = ep_sms / sms if sms else host_exchange_share(hw, par) if ep_exchanges else 0.0
    _time_overlaps(sched, compute.table, all_ops, share)
    if any(any(c.host_seconds) for c in compute.table.stages):
        _floor_at_host(sched, compute.table, all_ops)
    return all_ops


def _block_edge_sends(sched: Schedule, all_ops: list[list[Op]]) -> None:
    """Megatron-core's interleaved schedule overlaps only its steady state's sends (--overlap-p2p-communication): each
    rank's warm-up (its forwards before the first 1F1B pair: every SEND before the last forward that precedes its
    first backward) and flush (its backwards after the last pair: every SEND after the first backward that follows
    its last forward, but that backward's own) wait on their sends (schedules.py
    forward_backward_pipelining_with_interleaving: send_forward_recv_forward / send_backward_recv_backward without
    overlap_p2p_comm). Those SENDs hold the rank. Every other schedule with more stages than ranks (the V shapes,
    the zero-bubble ones) gets the same rule: Megatron-core's p2p code is the only one pipesim models for a stack
    that holds its sends (`--blocking-p2p`), and it lifts the hold only in the steady state."""
    for rank, prog in enumerate(sched.programs):
        forwards = [i for i, a in enumerate(prog) if a.kind is Kind.F]
        backwards = [i for i, a in enumerate(prog) if a.kind in BACKWARD_FIRST]
        if not forwards or not backwards:
            continue
        steady_f = max(i for i in forwards if i < backwards[0]) if forwards[0] < backwards[0] else -1
        steady_b = min((i for i in backwards if i > forwards[-1]), default=len(prog))
        last_pair = (prog[steady_b].stage, prog[steady_b].microbatch) if steady_b < len(prog) else None
        for i, a in enumerate(prog):
            if a.kind in SENDS and (i < steady_f or (i > steady_b and (a.stage, a.microbatch) != last_pair)):
                all_ops[rank][i] = all_ops[rank][i]._replace(blocking=True)


def _floor_at_host(sched: Schedule, table: CostTable, all_ops: list[list[Op]]) -> None:
    """An action whose host cannot run ahead (pipesim.cost.host_issue) lasts at least the host's seconds to launch
    it: the excess over its GPU seconds (collectives inside it included) joins its `seconds`. An overlapped pair's
    host launches both halves, one after the other: the pair lasts at least their sum, the excess on its backward.
    A record shared by several positions (every microbatch's, outside pairs) is floored once and stays shared."""
    for rank, prog in enumerate(sched.programs):
        ops, i = all_ops[rank], 0
        # ids of the records an action or pair spans -> (those records, kept alive so no id is reused; the last floored)
        floored: dict[tuple[int, ...], tuple[tuple[Op, ...], Op]] = {}
        while i < len(prog):
            a = prog[i]
            if a.kind not in COMPUTE:
                i += 1
                continue
            last = i + 1 if i + 1 < len(prog) and (a, prog[i + 1]) in sched.overlaps else i
            span = tuple(ops[i:last + 1])
            key = tuple(map(id, span))
            if key not in floored:
                host = sum(table.stages[b.stage].host(b.kind) for b in prog[i:last + 1])
                busy = sum(op.seconds + op.tp_seconds + op.ep_seconds for op in span)
                floored[key] = (span, span[-1]._replace(seconds=span[-1].seconds + host - busy) if host > busy
                                else span[-1])
            ops[last] = floored[key][1]
            i = last + 1


def host_exchange_share(hw: Hardware | None, par: ParallelDims) -> float:
    """On a CPU host (gloo) the all-to-all's copies and socket work run on the host's cores: with every core
    computing (as many ranks as cores, or more) they take it from the computation beside them, all of it (1.0: the
    overlapped pair hides nothing); with spare cores, none. 0.0 off a host."""
    if hw is None or hw.host is None:
        return 0.0
    return 1.0 if min(par.world, hw.devices_per_node) >= hw.host.cores else 0.0


def _time_overlaps(sched: Schedule, table: CostTable, all_ops: list[list[Op]], ep_share: float = 0.0) -> None:
    """An overlapped pair (OVERLAP_F_B) takes `table.overlap_seconds(F, B)` in all: the backward half keeps
    its time and the forward half gets the rest; both halves are adjacent, so nothing else runs between.
    With overlap_share 1 (the default, no FB given) the ops stay as they are, bit for bit.

    Expert-parallel all-to-alls are what the pair exists for (DualPipe, DeepSeek-V3 report section 3.2.1: one
    chunk's dispatch and combine run while the other chunk computes): the two halves' all-to-alls, back to
    back on the network, hide under the pair's computation, carried by the backward half. Hiding is not free:
    while the all-to-all kernels run they hold a share s = `ep_share` of the SMs (DeepEP's `num_sms`, NCCL's
    channels), so the computation beside them runs at 1 - s of its speed (G' = G / (1 - s), linear in SMs) and the
    pair adds `exposed_beside(C, G, G')`: max(C - G, C s) while the computation outlasts the all-to-alls
    (C = eF + eB, G = cF + cB); s = 0 leaves max(0, C - G), the free overlap. On a CPU host s is the share of the
    cores gloo's copies take (`host_exchange_share`); s = 1 exposes all of C."""
    if not sched.overlaps:
        return
    for rank, prog in enumerate(sched.programs):
        for i in range(len(prog) - 1):
            if (prog[i], prog[i + 1]) in sched.overlaps:
                fwd, bwd = all_ops[rank][i], all_ops[rank][i + 1]
                fwd = fwd._replace(seconds=table.overlap_forward_seconds(fwd.seconds, bwd.seconds))
                if fwd.ep_seconds or bwd.ep_seconds:
                    busy = fwd.seconds + bwd.seconds  # G: the pair's computation on every SM
                    beside = busy / (1 - ep_share) if ep_share < 1 else math.inf  # G': no SM (core) left: never
                    exposed = max(0.0, exposed_beside(fwd.ep_seconds + bwd.ep_seconds, busy, beside))
                    fwd, bwd = fwd._replace(ep_seconds=0.0), bwd._replace(ep_seconds=exposed)
                    all_ops[rank][i + 1] = bwd
                all_ops[rank][i] = fwd


def _op(rank: int, a: Action, sched: Schedule, compute: TableCompute, hw: Hardware | None, comm: bool,
        par: ParallelDims, tp_collectives: dict[tuple[int, str], tuple[TpCollective, ...]], stride: int,
        cp_seconds: dict | None, scatter: bool, blocking: bool) -> Op:
    k, st = a.kind, a.stage
    if k in COMPUTE:
        sign = 1 if k == Kind.F else (-1 if releases_activations(k) else 0)
        seconds = compute.seconds(a)
        if cp_seconds and (st, k.value) in cp_seconds:  # ring attention's hops the attention did not hide
            seconds += cp_seconds[(st, k.value)]
        costs = compute.table.stages[st]
        redo = costs.recompute_bytes if k == Kind.B or k == Kind.I else 0  # as pipesim.cost.rank_memory.RECOMPUTING
        return ComputeOp(seconds, _tp_time(rank, a, hw, comm, par, tp_collectives),
                         sign * costs.activation_bytes, sign, -1, redo)
    slot = message_slot(st, k, 0, stride)
    nbytes = compute.table.transfer_bytes(a)
    split = scatter and comm and nbytes > 0  # Megatron's scatter/gather (the caller checked tp > 1, no sp)
    if k not in SENDS:
        return RecvOp(slot, _scatter_gather(hw, par, sched.rank_of(a.peer_stage), rank, nbytes).gather) if split \
            else RecvOp(slot)
    dst = sched.rank_of(a.peer_stage)
    if not comm or hw is None:
        return SendOp(slot, dst, nbytes, 0.0, (), "", blocking)
    src_dev, dst_dev = par.rank(pp=rank), par.rank(pp=dst)
    if split:  # tp rank 0's rail carries S / t (the other ranks' rails the same, side by side)
        sg = _scatter_gather(hw, par, rank, dst, nbytes)
        return SendOp(slot, dst, sg.rail_bytes, sg.send, tuple(sorted(hw.link_resources(src_dev, dst_dev))),
                      hw.link_between(src_dev, dst_dev).name, blocking)
    return SendOp(slot, dst, nbytes, hw.p2p_time(src_dev, dst_dev, nbytes),
                  tuple(sorted(hw.link_resources(src_dev, dst_dev))), hw.link_between(src_dev, dst_dev).name, blocking)


def _scatter_gather(hw: Hardware, par: ParallelDims, src: int, dst: int, nbytes: int):
    """Megatron's scatter/gather of one S = `nbytes` message from pipeline rank `src` to `dst` (their tp groups)."""
    return scatter_gather(hw, par.group("tp", par.rank(pp=src)), par.group("tp", par.rank(pp=dst)), nbytes)


def _tp_time(rank: int, action: Action, hw: Hardware | None, comm: bool, par: ParallelDims,
             tp_collectives: dict[tuple[int, str], tuple[TpCollective, ...]]) -> float:
    """Seconds of the collectives inside one compute action that no computation hides (tp's, and the whole stage's
    amax reduction: `TpCollective.axis`): a blocking one whole; one beside a GEMM what that GEMM, slowed by the SMs of
    NCCL's channels, does not cover (`exposed_collective`); one on userbuffers what its method adds to its GEMM
    (pipesim.comm.ub_overlap)."""
    colls = tp_collectives.get((action.stage, action.kind.value)) if tp_collectives else None
    if not colls or not comm or hw is None:
        return 0.0
    total = 0.0
    groups: dict[str, list[int]] = {}  # by axis: tp's for most, the whole stage's for an amax reduction
    for c in colls:
        group = groups.get(c.axis) or groups.setdefault(c.axis, par.group(c.axis, par.rank(pp=rank)))
        if len(group) == 1:  # one rank: nothing to exchange
            continue
        if c.beside is not None and c.ub is not None:
            total += exposed_ub(collective_time(c.kind, c.nbytes, group, hw).seconds, c.beside, c.ub, len(group),
                                kind=c.kind, nbytes=c.nbytes)
        elif c.beside is not None:
            total += exposed_collective(collective_time(c.kind, c.nbytes, group, hw), c.nbytes, len(group), c.beside)
        else:
            total += collective_seconds(hw, c.kind, group, c.nbytes)
    return total


def _ep_time(rank: int, exchanges: tuple[ExpertExchange, ...], hw: Hardware | None, par: ParallelDims,
             opts: CommOptions) -> tuple[float, int]:
    """(seconds, SMs held) of a compute action's expert-parallel all-to-alls over the rank's ep group (replica 0's
    devices) with the job's dispatcher (`opts.moe_dispatcher`: NCCL's alltoall, DeepEP or Hybrid-EP)."""
    if hw is None:
        return 0.0, 0
    group = par.group("ep", par.rank(pp=rank))
    kernel = "nccl" if opts.moe_dispatcher == "alltoall" else opts.moe_dispatcher
    timed = [exchange_timing(hw, group, x, kernel=kernel, deepep_sms=opts.deepep_sms, hybridep_sms=opts.hybridep_sms)
             for x in exchanges]
    return exposed_exchange_seconds(exchanges, [t for t, _ in timed]), max((n for _, n in timed), default=0)


def cp_exposed(sched: Schedule, hw: Hardware | None, comm: bool, par: ParallelDims, cp_exchanges: dict) -> dict:
    """(stage, kind) -> seconds of ring attention's K/V hops not hidden behind the attention compute (and of
    --cp-comm-type all_gather's gathers, exposed whole).

    A hop goes from each cp rank of the stage to the next at once, so it takes as long as the
    ring's slowest pair (`collective_seconds` of send_recv); `pipesim.cost.step_costs.exposed_seconds`
    keeps what each hop's compute does not cover. {} with cp = 1 or without links.
    """
    if par.cp == 1 or not comm or hw is None or not cp_exchanges:
        return {}
    out = {}
    for (stage, kind), exchanges in sorted(cp_exchanges.items()):
        ring = par.group("cp", par.rank(pp=sched.rank_of(stage)))
        pairs = [[ring[i], ring[(i + 1) % len(ring)]] for i in range(len(ring))]

        def hop(nbytes: int, pairs: list = pairs) -> float:
            return max(collective_seconds(hw, "send_recv", pair, nbytes) for pair in pairs)

        hops = [x for x in exchanges if x.kind == "send_recv"]  # --cp-comm-type all_gather: whole collectives
        seconds = exposed_seconds(hops, hop) + sum(x.hops * collective_seconds(hw, x.kind, ring, x.nbytes)
                                                   for x in exchanges if x.kind != "send_recv")
        if seconds:
            out[(stage, kind)] = seconds
    return out


__all__ = ["ComputeOp", "Op", "RecvOp", "SendOp", "TableCompute", "compile_programs", "cp_exposed"]
