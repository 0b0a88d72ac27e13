"""The simulator kernel: every pipeline rank runs its lowered program in order, like the executor.

It knows programs of ops, their dependencies, links and time (SimPy, `pipesim.sim.clock`). What the
framework does is lowered into the ops before the run (`pipesim.sim.program.compile_programs`: TP
collectives, scatter/gather, blocking sends, ZeRO 3's gated computes, ring attention), and what the
machine does comes in as plug-ins (`pipesim.sim.plugins`: compute seconds, CPU core sharing, gloo's
P2P). Compute holds the rank for its duration (plus the blocking tensor-parallel collectives of that
action); a SEND posts a transfer and moves on (an isend; a blocking one waits for its bytes); a RECV
blocks until the matching transfer's bytes have arrived. Transfers hold the link resources on the
path between the two devices (`pipesim.sim.links`), so messages that share a port or a bus queue up.
Data-parallel collectives run on a per-rank collective stream, overlapping compute, and the optimizer
step ends the step (`pipesim.sim.step`). What stays in the kernel, and why: docs/architecture.md.

Same input, same output: ranks start in rank order, resources are FIFO, and SimPy runs events at one
time in posting order, so two runs agree bit for bit.
"""

from __future__ import annotations

from functools import partial

from pipesim.cost.model_costs import ParallelCosts
from pipesim.cost.table import CostTable
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.ir.deps import produces_weight_grad
from pipesim.ir.gc_pause import no_gc
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import BACKWARD_FIRST, COMPUTE, Kind, Schedule
from pipesim.job import Job
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.clock import Clock
from pipesim.sim.links import LinkPool, Transfer
from pipesim.sim.perturb import Perturbation
from pipesim.sim.plugins import Plugins, plugins_for
from pipesim.sim.program import ComputeOp, Op, SendOp, compile_programs, cp_exposed
from pipesim.sim.records import RunRecord
from pipesim.sim.result import SimResult
from pipesim.sim.step import CollectiveStreams, GateOp

RUNNING, BLOCKED, POSTING, COMPUTING = 0, 1, 2, 3  # what a rank sleeps on (`_Kernel.waiting`)


def check_devices(dims: ParallelDims, hw: Hardware | None) -> None:
    """PipesimError when pp x dp (x cp) x tp devices do not fit the hardware."""
    need = dims.world
    if hw is not None and need > hw.num_devices:
        cp = f" x cp {dims.cp}" if dims.cp > 1 else ""
        raise PipesimError(
            f"needs {need} devices (pp {dims.pp} x dp {dims.dp}{cp} x tp {dims.tp}) but {hw.name} has {hw.num_devices}"
        )


def simulate(schedule: Schedule, costs: ParallelCosts | CostTable, hw: Hardware | None = None, *,
             comm: bool = True, plugins: Plugins | None = None, perturb: Perturbation | None = None) -> SimResult:
    """Simulate one training step of `schedule`.

    `costs` is a CostTable (compute alone) or a `pipesim.cost.model_costs.ParallelCosts`, whose job says the
    data, tensor and context parallelism around the pipeline and the framework's communication options (its
    pp is the schedule's ranks). `hw` places ranks on devices and times the links; with `comm=False` (or no
    hardware) transfers take zero time and the makespan equals the task graph's critical path exactly.
    `plugins`: what the machine does (compute seconds, host cores, P2P completion); by default the ones
    `pipesim.sim.plugins.plugins_for` chooses for `hw`. `perturb`: a what-if (a slow rank or link, jitter,
    recorded durations) applied to the compiled programs' seconds (`pipesim.sim.perturb`).
    """
    table, parallel = (costs.table, costs) if isinstance(costs, ParallelCosts) else (costs, None)
    job = parallel.job.with_pp(schedule.num_ranks) if parallel is not None else Job(ParallelDims(schedule.num_ranks))
    par = job.dims
    if table.num_stages != schedule.num_stages:
        raise PipesimError(f"cost table has {table.num_stages} stages but schedule {schedule.name!r} "
                           f"has {schedule.num_stages}")
    if hw is None and (par.dp > 1 or par.tp > 1 or par.cp > 1):
        raise PipesimError("data/tensor/context parallelism needs a hardware description")
    comm = comm and hw is not None
    check_devices(par, hw)
    with no_gc():  # ~1M live objects at p=64, m=1024: the cyclic GC would rescan them again and again
        lowered = add_p2p(schedule)
        plugins = plugins if plugins is not None else plugins_for(table, hw, comm)
        cp_seconds = cp_exposed(lowered, hw, comm, par, parallel.cp_exchanges if parallel is not None else {})
        ops = compile_programs(lowered, plugins.compute, hw, comm, job, parallel, cp_seconds)
        if perturb:
            ops = perturb.apply(lowered, ops)
        return _Kernel(lowered, ops, plugins, parallel, hw, comm, job, cp_seconds).run()


class _Kernel:
    """One simulation run: the compiled programs, the clock, and each rank's progress through its program."""

    def __init__(self, sched: Schedule, ops: list[list[Op]], plugins: Plugins, costs: ParallelCosts | None,
                 hw: Hardware | None, comm: bool, job: Job, cp_seconds: dict):
        self.sched, self.table, self.hw, self.comm, self.job = sched, plugins.compute.table, hw, comm, job
        self.p2p = plugins.p2p
        par = job.dims
        self.clock = Clock()
        self.links = LinkPool()
        n = sched.num_ranks
        self.starts = [[0.0] * len(p) for p in sched.programs]  # seconds, per action
        self.ends = [[0.0] * len(p) for p in sched.programs]  # seconds, per action
        self.sm_shared = [0.0] * n  # seconds each rank's computes lost to its DP collectives' SMs (ComputeOp.shared)
        self.tp_time = [[0.0] * len(p) for p in sched.programs]  # seconds of TP collectives inside
        self.ep_time = [[0.0] * len(p) for p in sched.programs]  # seconds of EP all-to-alls inside
        self.memory: list[list[tuple[float, int]]] = [[(0.0, 0)] for _ in range(n)]  # (seconds, bytes)
        self.streams = CollectiveStreams(sched, hw, comm, job, costs)  # DP/ZeRO collectives, the optimizer
        self._dp_allreduce = self.streams.grads_done  # after a stage's last weight-gradient piece
        self.slot_stride = sched.num_microbatches  # message slots per (stage, direction)
        self.slots: list = [None] * (2 * sched.num_stages * self.slot_stride)  # slot -> Transfer, or the blocked rank
        self.transfers: list[Transfer] = []  # in posting order
        self.cp_seconds = cp_seconds
        self.ops = ops
        self.streams.prefetch(self.ops)  # ZeRO 3: all-gathers from the step's start, first F / B gated
        # each pipeline rank's device and its copies' in the other replicas (dp, cp, tp), which share a CPU host's cores
        devices = [[par.rank(pp=r, dp=d, cp=c, tp=t) for d in range(par.dp) for c in range(par.cp)
                    for t in range(par.tp)] for r in range(n)]
        self.host = plugins.host(self.clock, devices) if plugins.host is not None else None

    def run(self) -> SimResult:
        clock, n = self.clock, self.sched.num_ranks
        self.pos = [0] * n  # next action of each rank
        self.waiting = [RUNNING] * n  # what the rank sleeps on at `pos`: BLOCKED, POSTING, COMPUTING (or nothing)
        self.wakers = [partial(self._advance, r) for r in range(n)]  # resume rank r where it stopped
        self.live = [0] * n  # bytes of stashed activations
        self.inflight = [0] * n  # microbatches whose activations are stashed
        self.peak_inflight = [0] * n
        # what one wake-up of rank r reads, looked up once (the kernel wakes a rank ~130k times at p=64, m=1024)
        self.rank_state = [(self.starts[r], self.ends[r], self.ops[r], self.sched.programs[r], self.memory[r],
                            self.wakers[r]) for r in range(n)]
        for rank in range(n):
            self._wake(rank, 0.0)
        clock.run()
        stuck = [r for r in range(n) if self.pos[r] < len(self.ops[r])]
        if stuck:  # validation rules this out for registered schedules; CSV imports are validated too
            raise PipesimError(f"simulation deadlocked on ranks {stuck}")
        return SimResult.build(RunRecord(
            self.sched, self.table, self.hw, self.comm, self.job, self.starts, self.ends, self.tp_time,
            self.transfers, self.streams.records, self.memory, self.peak_inflight, self.slots, self.slot_stride,
            self.streams.finish(self.ends), self.cp_seconds, self.sm_shared, self.ep_time))

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
        starts, ends, ops, prog, mem, waker = self.rank_state[rank]
        at, peek = clock.at, clock.next_time  # nothing earlier than `now` pending -> keep going without a wake-up
        live, held, peak = self.live[rank], self.inflight[rank], self.peak_inflight[rank]
        waiting = self.waiting[rank]
        fsdp = self.streams.fsdp is not None  # ZeRO 3 resharding: chunks gathered again when freed
        if waiting:
            self.waiting[rank] = RUNNING
            if waiting == BLOCKED:  # woken by the message this RECV waited for
                ends[i] = now
                i += 1
            elif waiting == POSTING:  # woken at the end of posting this SEND
                resume = self._post_send(rank, i, ops[i], now)
                i += 1
                if resume > now:  # a blocking send: sleep until its bytes are in
                    self.pos[rank] = i
                    at(resume, waker)
                    return
            else:  # COMPUTING, host cores: woken when the shared cores have done this action's work
                _, tp, delta, count, grad_stage, recompute, _, ep = ops[i]
                if fsdp:
                    self._fsdp_free(rank, prog[i])
                starts[i] = self.host.started[rank]  # it began when it first had a core (time slices: maybe later)
                ends[i] = now
                if tp:
                    self.tp_time[rank][i] = tp
                if ep:
                    self.ep_time[rank][i] = ep
                if recompute:  # the re-run forward's activations, live while this backward ran
                    mem.append((starts[i], live + recompute))
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
        post, recv_done, host, slots = self.p2p.send_hold, self.p2p.recv_done, self.host, self.slots
        while i < n:
            op = ops[i]
            starts[i] = now
            record = type(op)
            if record is ComputeOp:
                d, tp, delta, count, grad_stage, recompute, shared, ep = op
                gather = self._fsdp_gather(rank, i, prog[i], now) if fsdp else None  # ZeRO 3: its chunk was freed
                if host is not None:  # shared cores: how long it takes depends on who else runs
                    if gather is not None:
                        d = self._fsdp_wait(rank, gather, prog[i].stage, now, d)
                    self.waiting[rank] = COMPUTING
                    host.start(rank, d + tp + ep if ep else d + tp, waker)
                    break
                if shared:  # beside the rank's data-parallel collectives its GEMMs lose NCCL's SMs
                    d = self.streams.beside(rank, now, d, shared)
                    self.sm_shared[rank] += d - op.seconds
                if gather is not None:  # its units compute as their parameters arrive
                    d = self._fsdp_wait(rank, gather, prog[i].stage, now, d)
                if tp:
                    d += tp
                    self.tp_time[rank][i] = tp
                if ep:  # the expert-parallel all-to-alls inside it (drawn before its TP collectives)
                    d += ep
                    self.ep_time[rank][i] = ep
                if recompute:  # the re-run forward's activations live from this backward's start...
                    mem.append((now, live + recompute))
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
                    late = self._dp_allreduce(rank, grad_stage, i, now, starts[i], shared / (op.seconds + shared)
                                              if shared else 0.0)
                    if late:  # its own gradient buckets ran beside it: it ends later by what they slowed
                        self.sm_shared[rank] += late
                        now += late
                        ends[i] = now
                if fsdp:
                    self._fsdp_free(rank, prog[i])
                i += 1
                if d and peek() <= now:  # another event comes first: sleep until `now`
                    at(now, waker)
                    break
            elif record is SendOp:
                if post and host is not None:  # posting is CPU work on the shared cores too
                    self.waiting[rank] = POSTING
                    host.start(rank, post, waker)
                    break
                if post:  # posting the isend holds the rank; the message leaves once it is posted
                    now += post
                    if peek() <= now:  # another event comes first: post at `now` after it
                        self.waiting[rank] = POSTING
                        at(now, waker)
                        break
                resume = self._post_send(rank, i, op, now)
                i += 1
                if resume > now:  # a blocking send: sleep until its bytes are in
                    at(resume, waker)
                    break
            else:
                if record is GateOp:  # ZeRO 3: the compute waits for its prefetched all-gather, then runs
                    if op.ready > now:
                        self.streams.gate_wait[rank] += op.ready - now
                        at(op.ready, waker)
                        break
                    ops[i] = op.op
                    continue
                rid = op.slot + prog[i].microbatch
                slot = slots[rid]
                if slot is None:  # not posted yet: the sender wakes us at the arrival time
                    self.waiting[rank] = BLOCKED
                    slots[rid] = rank
                    break
                arrive = recv_done(now, slot.post, slot.end)
                if op.gather:  # scatter/gather: the receiving tp group all-gathers the parts once they are in
                    arrive = (arrive if arrive > now else now) + op.gather
                if arrive > now:  # bytes still moving
                    self.waiting[rank] = BLOCKED
                    at(arrive, waker)
                    break
                ends[i] = now
                i += 1
        self.pos[rank] = i
        self.live[rank], self.inflight[rank], self.peak_inflight[rank] = live, held, peak

    def _fsdp_gather(self, rank: int, i: int, a, now: float):
        """The all-gather a forward or first backward piece issues when FSDP2 freed its chunk (None otherwise)."""
        if a.kind == Kind.F or a.kind in BACKWARD_FIRST:
            return self.streams.fsdp_gather(rank, a.stage, i, now)
        return None

    def _fsdp_wait(self, rank: int, gather, stage: int, now: float, seconds: float) -> float:
        """The compute's seconds with its chunk arriving unit by unit; the difference is the rank's gather wait."""
        gated = self.streams.fsdp_seconds(gather, stage, now, seconds)
        self.streams.gate_wait[rank] += gated - seconds
        return gated

    def _fsdp_free(self, rank: int, a) -> None:
        self.streams.fsdp_free(rank, a.stage, a.kind == Kind.F, a.kind in COMPUTE and produces_weight_grad(a.kind))

    def _post_send(self, rank: int, i: int, op: SendOp, now: float) -> float:
        """Post the SEND at `i` on `rank` at `now`: its transfer takes the links, a blocked receiver is woken.
        Returns when the rank may go on: `now` (an isend), or for a blocking SEND the transfer's end (Megatron
        waits on its sends), which is also when the SEND action ends."""
        rid, dst, nbytes, dur, res, link, blocking = op
        send = self.sched.programs[rank][i]
        if res:
            tr = Transfer(send, rank, dst, nbytes, link, res, now, i)
            self.links.reserve(tr, dur)
        else:
            tr = Transfer(send, rank, dst, nbytes, link, res, now, i, now, now + dur)
        rid += send.microbatch
        slots = self.slots
        waiter = slots[rid]
        slots[rid] = tr
        self.transfers.append(tr)
        end = tr.end
        if waiter is not None:  # the receiver is already blocked on this message (then all-gathers it)
            gather = self.ops[waiter][self.pos[waiter]].gather
            self.clock.at(end + gather if gather else end, self.wakers[waiter])
        resume = end if blocking and end > now else now
        self.ends[rank][i] = resume
        return resume
