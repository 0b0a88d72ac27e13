"""The simulator kernel: every pipeline rank runs its lowered program in order, like the executor.

It knows programs, dependencies, links and time; three small plug-ins say the rest:
- compute (`pipesim.sim.program.TableCompute`): how long each compute action takes (the cost table);
- host (`pipesim.sim.host`: `HostSharing` or `HostTimeSlices`, only for hardware with a host profile):
  how ranks on one node share its CPU cores; None on GPUs, where a compute holds its device alone;
- P2P (`pipesim.sim.links.PlainP2P`, or `GlooP2P` on a host profile): when a RECV completes, and
  how long posting a SEND holds its rank.
Compute holds the rank for its duration (plus the blocking tensor-parallel collectives of that
action); a SEND posts a transfer and moves on (an isend); a RECV blocks until the matching
transfer's bytes have arrived. Transfers hold the link resources on the path between the two
devices (`pipesim.sim.links`), so messages that share a port or a bus queue up. Data-parallel
collectives run on a per-rank collective stream, overlapping compute, and the optimizer step ends
the step (`pipesim.sim.step`); ring attention's exposed hops lengthen the compute that runs them.

Same input, same output: ranks start in rank order, resources are FIFO, and the clock
(`pipesim.sim.clock`) breaks time ties by posting order, so two runs agree bit for bit.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from pipesim.comm.comm_options import CommOptions
from pipesim.cost.step_costs import per_microbatch_stages
from pipesim.cost.table import CostTable
from pipesim.errors import PipesimError
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Schedule
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.clock import Clock, HeapClock
from pipesim.sim.host.sharing import HostSharing
from pipesim.sim.host.slices import HostTimeSlices
from pipesim.sim.links import GlooP2P, LinkPool, PlainP2P, Transfer
from pipesim.sim.program import ComputeOp, SendOp, TableCompute, compile_programs, cp_exposed
from pipesim.sim.records import no_gc
from pipesim.sim.result import SimResult
from pipesim.sim.step import CollectiveStreams, GateOp


def check_devices(par: ParallelDims, hw: Any) -> None:
    """PipesimError when pp x dp (x cp) x tp devices do not fit the hardware."""
    need = par.world
    if hw is not None and need > hw.num_devices:
        cp = f" x cp {par.cp}" if par.cp > 1 else ""
        raise PipesimError(
            f"needs {need} devices (pp {par.pp} x dp {par.dp}{cp} x tp {par.tp}) but {hw.name} has {hw.num_devices}"
        )


def simulate(schedule: Schedule, costs: Any, hw: Any = None, *, comm: bool = True, dp: int | None = None,
             tp: int | None = None, clock: type[Clock] = HeapClock,
             comm_options: CommOptions | None = None) -> SimResult:
    """Simulate one training step of `schedule`.

    `costs` is a CostTable or a `pipesim.cost.model_costs.ParallelCosts` (its tp/dp collectives are then
    modeled). `hw` (a `pipesim.hardware.machine.Hardware`) places ranks on devices and times the links;
    with `comm=False` (or no hardware) transfers take zero time and the makespan equals the task
    graph's critical path exactly. `clock` is HeapClock (fast) or SimpyClock (SimPy's own queue, the
    reference: both give the same result bit for bit). `comm_options` (pipesim.comm.comm_options): Megatron's
    scatter/gather of pipeline messages, bucketed gradient reduction overlapped with backward; None: neither.
    """
    table: CostTable = costs if isinstance(costs, CostTable) else costs.table
    par = ParallelDims(pp=schedule.num_ranks, dp=dp or getattr(costs, "dp", 1) or 1,
                       tp=tp or getattr(costs, "tp", 1) or 1, cp=getattr(costs, "cp", 1) or 1)
    if table.num_stages != schedule.num_stages:
        raise PipesimError(f"cost table has {table.num_stages} stages but schedule {schedule.name!r} "
                           f"has {schedule.num_stages}")
    if hw is None and (comm and schedule.num_ranks > 1 or par.dp > 1 or par.tp > 1 or par.cp > 1):
        if par.dp > 1 or par.tp > 1 or par.cp > 1:
            raise PipesimError("data/tensor/context parallelism needs a hardware description")
        comm = False
    check_devices(par, hw)
    host = hw.host if hw is not None else None
    compute = TableCompute(table, host.split_costs if host is not None else None)
    p2p = GlooP2P(host.send_overhead, host.late_recv_delay) if host is not None and comm else PlainP2P()
    with no_gc():  # ~1M live objects at p=64, m=1024: the cyclic GC would rescan them again and again
        return _Kernel(add_p2p(schedule), compute, costs, hw, comm, par, p2p, clock, comm_options).run()


def _sequence_parallel(costs: Any) -> bool:
    """True when the costs' boundary is already split over tp (sequence parallelism): nothing to scatter."""
    return bool(getattr(getattr(costs, "options", None), "sp", False))


def host_model(clock: Clock, hw: Any, devices: list[int]) -> HostSharing | HostTimeSlices | None:
    """The host plug-in for ranks on `devices`: None without a host profile; time slices when the
    profile has a `time_slice`, else fluid sharing."""
    host = hw.host if hw is not None else None
    if host is None:
        return None
    nodes = [hw.node_of(d) for d in devices]
    if host.time_slice:
        return HostTimeSlices(clock, nodes, host.cores, host.node_corun_slowdown, host.time_slice,
                              host.oversubscription_slowdown)
    return HostSharing(clock, nodes, host.cores, host.node_corun_slowdown, host.oversubscription_slowdown)


class _Kernel:
    """One simulation run: the compiled programs, the clock, and each rank's progress through its program."""

    def __init__(self, sched: Schedule, compute: TableCompute, costs: Any, hw: Any, comm: bool, par: ParallelDims,
                 p2p: PlainP2P | GlooP2P, clock: type[Clock], comm_options: CommOptions | None = None):
        self.sched, self.table, self.hw, self.comm, self.par, self.p2p = sched, compute.table, hw, comm, par, p2p
        self.clock = clock()
        self.links = LinkPool()
        n = sched.num_ranks
        self.starts = [[0.0] * len(p) for p in sched.programs]  # seconds, per action
        self.ends = [[0.0] * len(p) for p in sched.programs]  # seconds, per action
        self.sm_shared = [0.0] * n  # seconds each rank's computes lost to its DP collectives' SMs (ComputeOp.shared)
        self.tp_time = [[0.0] * len(p) for p in sched.programs]  # seconds of TP collectives inside
        self.memory: list[list[tuple[float, int]]] = [[(0.0, 0)] for _ in range(n)]  # (seconds, bytes)
        opts = comm_options or CommOptions()
        self.streams = CollectiveStreams(sched, hw, comm, par, costs, opts)  # DP/ZeRO collectives, the optimizer
        self.blocking_sends = opts.blocking_p2p  # a SEND holds its rank until its transfer ends
        self.collectives = self.streams.records
        self._dp_allreduce = self.streams.grads_done  # after a stage's last weight-gradient piece
        self.step_ends: list = []  # per rank (pipesim.sim.step.RankStepEnd); [] without step costs
        self.mbs = sched.num_microbatches  # message slots per (stage, direction)
        self.slots: list[Any] = [None] * (2 * sched.num_stages * self.mbs)  # slot -> Transfer, or the blocked rank
        self.transfers: list[Transfer] = []  # in posting order
        self.cp_seconds = cp_exposed(sched, hw, comm, par, getattr(costs, "cp_exchanges", None) or {})
        self.ops = compile_programs(sched, compute, hw, comm, par, getattr(costs, "tp_collectives", None) or {},
                                    self.cp_seconds, per_microbatch_stages(getattr(costs, "step", None)),
                                    scatter=opts.scatter_gather and par.tp > 1 and not _sequence_parallel(costs),
                                    sm_share=getattr(costs, "sm_share", None))
        self.streams.prefetch(self.ops)  # ZeRO 3: all-gathers from the step's start, first F / B gated
        self.host = host_model(self.clock, hw, [par.rank(pp=r) for r in range(n)])

    def run(self) -> SimResult:
        clock, n = self.clock, self.sched.num_ranks
        self.pos = [0] * n  # next action of each rank
        self.blocked = [False] * n  # rank sleeps in the RECV at `pos` until its message arrives
        self.posting = [False] * n  # rank sleeps in the SEND at `pos` until it has posted it
        self.computing = [False] * n  # host cores: rank sleeps in the compute at `pos` until its work is done
        self.wakers = [partial(self._advance, r) for r in range(n)]  # resume rank r where it stopped
        self.live = [0] * n  # bytes of stashed activations
        self.inflight = [0] * n  # microbatches whose activations are stashed
        self.peak_inflight = [0] * n
        for rank in range(n):
            self._wake(rank, 0.0)
        clock.run()
        stuck = [r for r in range(n) if self.pos[r] < len(self.ops[r])]
        if stuck:  # validation rules this out for registered schedules; CSV imports are validated too
            raise PipesimError(f"simulation deadlocked on ranks {stuck}")
        self.step_ends = self.streams.finish(self.ends)
        return SimResult.build(self)

    def _wake(self, rank: int, when: float) -> None:
        """Resume `rank` at exactly `when` (>= now); a rank sleeps on one thing at a time."""
        self.clock.at(when, self.wakers[rank])

    def _advance(self, rank: int) -> None:
        """Run the rank's program from where it stopped until it has to wait, then sleep.

        A rank is a chain of clock callbacks rather than a generator process: the same semantics
        (compute holds it for its duration, SEND posts and moves on, RECV blocks until arrival)
        at a fraction of the per-event cost. Times are exact: a rank is always woken at an
        absolute time (compute end or message arrival), never at now + (t - now).
        """
        clock = self.clock
        now, i = clock.now, self.pos[rank]
        starts, ends, ops, prog = self.starts[rank], self.ends[rank], self.ops[rank], self.sched.programs[rank]
        slots, wake = self.slots, self._wake
        peek = clock.next_time  # nothing earlier than `now` pending -> keep going without a wake-up event
        mem = self.memory[rank]
        live, held, peak = self.live[rank], self.inflight[rank], self.peak_inflight[rank]
        if self.blocked[rank]:  # woken by the message this RECV waited for
            self.blocked[rank] = False
            ends[i] = now
            i += 1
        elif self.posting[rank]:  # woken at the end of posting this SEND
            self.posting[rank] = False
            resume = self._post_send(rank, i, ops[i], now)
            i += 1
            if resume > now:  # a blocking send: sleep until its bytes are in
                self.pos[rank] = i
                wake(rank, resume)
                return
        elif self.computing[rank]:  # host cores: woken when the shared cores have done this action's work
            self.computing[rank] = False
            op = ops[i]
            tp, delta, count, grad_stage = op.tp_seconds, op.stash_bytes, op.inflight, op.allreduce_stage
            starts[i] = self.host.started[rank]  # it began when it first had a core (time slices: maybe later)
            ends[i] = now
            if tp:
                self.tp_time[rank][i] = tp
            if op.recompute_bytes:  # the re-run forward's activations, live while this backward ran
                mem.append((starts[i], live + op.recompute_bytes))
                mem.append((now, live + delta))
                live += delta
            elif delta:
                live += delta
                mem.append((now, live))
            if count:
                held += count
                peak = max(peak, held)
            if grad_stage >= 0:
                self._dp_allreduce(rank, grad_stage, i, now, starts[i])
            i += 1
        n = len(ops)
        post, recv_done, host = self.p2p.send_hold, self.p2p.recv_done, self.host
        while i < n:
            op = ops[i]
            starts[i] = now
            record = type(op)
            if record is ComputeOp:
                d, tp = op.seconds, op.tp_seconds
                if host is not None:  # shared cores: how long it takes depends on who else runs
                    self.computing[rank] = True
                    host.start(rank, d + tp, self.wakers[rank])
                    break
                delta, count, grad_stage = op.stash_bytes, op.inflight, op.allreduce_stage
                if op.shared:  # beside the rank's data-parallel collectives its GEMMs lose NCCL's SMs
                    d = self.streams.beside(rank, now, d, op.shared)
                    self.sm_shared[rank] += d - op.seconds
                if tp:
                    d += tp
                    self.tp_time[rank][i] = tp
                if op.recompute_bytes:  # the re-run forward's activations live from this backward's start...
                    mem.append((now, live + op.recompute_bytes))
                    now += d
                    live += delta
                    mem.append((now, live))  # ...to its end
                else:
                    now += d
                    if delta:
                        live += delta
                        mem.append((now, live))
                ends[i] = now
                if count:
                    held += count
                    if held > peak:
                        peak = held
                if grad_stage >= 0:
                    late = self._dp_allreduce(rank, grad_stage, i, now, starts[i], op.shared / (op.seconds + op.shared)
                                              if op.shared else 0.0)
                    if late:  # its own gradient buckets ran beside it: it ends later by what they slowed
                        self.sm_shared[rank] += late
                        now += late
                        ends[i] = now
                i += 1
                if d and peek() <= now:  # another event comes first: sleep until `now`
                    clock.at(now, self.wakers[rank])
                    break
            elif record is SendOp:
                if post and host is not None:  # posting is CPU work on the shared cores too
                    self.posting[rank] = True
                    host.start(rank, post, self.wakers[rank])
                    break
                if post:  # posting the isend holds the rank; the message leaves once it is posted
                    now += post
                    if peek() <= now:  # another event comes first: post at `now` after it
                        self.posting[rank] = True
                        clock.at(now, self.wakers[rank])
                        break
                resume = self._post_send(rank, i, op, now)
                i += 1
                if resume > now:  # a blocking send: sleep until its bytes are in
                    wake(rank, resume)
                    break
            else:
                if record is GateOp:  # ZeRO 3: the compute waits for its prefetched all-gather, then runs
                    if op.ready > now:
                        self.streams.gate_wait[rank] += op.ready - now
                        wake(rank, op.ready)
                        break
                    ops[i] = op.op
                    continue
                rid = op.slot + prog[i].microbatch
                slot = slots[rid]
                if slot is None:  # not posted yet: the sender wakes us at the arrival time
                    self.blocked[rank] = True
                    slots[rid] = rank
                    break
                arrive = recv_done(now, slot.post, slot.end)
                if op.gather:  # scatter/gather: the receiving tp group all-gathers the parts once they are in
                    arrive = (arrive if arrive > now else now) + op.gather
                if arrive > now:  # bytes still moving
                    self.blocked[rank] = True
                    wake(rank, arrive)
                    break
                ends[i] = now
                i += 1
        self.pos[rank] = i
        self.live[rank], self.inflight[rank], self.peak_inflight[rank] = live, held, peak

    def _post_send(self, rank: int, i: int, op: SendOp, now: float) -> float:
        """Post the SEND at `i` on `rank` at `now`: its transfer takes the links, a blocked receiver is woken.
        Returns when the rank may go on: `now` (an isend), or with `blocking_sends` the transfer's end (Megatron
        waits on its sends), which is also when the SEND action ends."""
        rid, dst, nbytes, dur, res, link = op
        send = self.sched.programs[rank][i]
        tr = Transfer(send, rank, dst, nbytes, link, res, now, i)
        if res:
            self.links.reserve(tr, dur)
        else:
            tr.start, tr.end = now, now + dur
        rid += send.microbatch
        waiter = self.slots[rid]
        self.slots[rid] = tr
        self.transfers.append(tr)
        if waiter is not None:  # the receiver is already blocked on this message (then all-gathers it)
            gather = self.ops[waiter][self.pos[waiter]].gather
            self._wake(waiter, tr.end + gather if gather else tr.end)
        resume = tr.end if self.blocking_sends and tr.end > now else now
        self.ends[rank][i] = resume
        return resume
