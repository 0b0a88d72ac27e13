"""The SimPy simulator: every pipeline rank runs its lowered program in order, like the executor.

Each rank is a chain of SimPy events on its device. Compute holds the rank for its duration (plus the
blocking tensor-parallel collectives of that action); a SEND posts a transfer and moves on (an
isend; on host hardware posting holds the rank `send_overhead`); a RECV blocks until the matching
transfer's bytes have arrived (and, on host hardware, lasts at least `late_recv_delay` when its message
was posted while the receiver computed: gloo's progress thread must answer it). Transfers hold the link
resources on the path between the two devices (`pipesim.sim_links`), so messages that share a
port or a bus queue up. Data-parallel gradient all-reduces run on a per-rank collective stream
after the stage's last backward, overlapping the rest of the step.
On hardware with `host_cores`, ranks on a node share its cores: fluidly (`pipesim.host_model`), or
with `time_slice` set, taking turns in slices (`pipesim.host_slices`), where a compute action
begins when its rank first gets a core.

Same input, same output: ranks start in rank order, resources are FIFO, and SimPy breaks
time ties by insertion order, so two runs produce identical numbers bit for bit.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from simpy import Event

from pipesim.costs import CostTable
from pipesim.errors import PipesimError
from pipesim.host_model import host_cores_model
from pipesim.ir import Schedule
from pipesim.lowering import add_p2p
from pipesim.parallel_dims import ParallelDims
from pipesim.sim_links import Environment, LinkPool, Transfer
from pipesim.sim_result import CollectiveRecord, SimResult, no_gc

_COMPUTE, _SEND, _RECV = 0, 1, 2


def check_devices(par: ParallelDims, hw: Any) -> None:
    """PipesimError when pp x dp x tp devices do not fit the hardware."""
    need = par.world
    if hw is not None and need > hw.num_devices:
        raise PipesimError(
            f"needs {need} devices (pp {par.pp} x dp {par.dp} x tp {par.tp}) but {hw.name} has {hw.num_devices}"
        )


def simulate(schedule: Schedule, costs: Any, hw: Any = None, *, comm: bool = True, dp: int | None = None,
             tp: int | None = None) -> SimResult:
    """Simulate one training step of `schedule`.

    `costs` is a CostTable or a `pipesim.model_costs.ParallelCosts` (its tp/dp collectives are then
    modeled). `hw` (a `pipesim.hardware.Hardware`) places ranks on devices and times the links;
    with `comm=False` (or no hardware) transfers take zero time and the makespan equals the task
    graph's critical path exactly.
    """
    table: CostTable = costs if isinstance(costs, CostTable) else costs.table
    par = ParallelDims(pp=schedule.num_ranks, dp=dp or getattr(costs, "dp", 1) or 1,
                       tp=tp or getattr(costs, "tp", 1) or 1)
    if table.num_stages != schedule.num_stages:
        raise PipesimError(f"cost table has {table.num_stages} stages but schedule {schedule.name!r} "
                           f"has {schedule.num_stages}")
    if hw is None and (comm and schedule.num_ranks > 1 or par.dp > 1 or par.tp > 1):
        if par.dp > 1 or par.tp > 1:
            raise PipesimError("data/tensor parallelism needs a hardware description")
        comm = False
    check_devices(par, hw)
    with no_gc():  # ~1M live objects at p=64, m=1024: the cyclic GC would rescan them again and again
        return _Engine(add_p2p(schedule), table, costs, hw, comm, par).run()


class _Engine:
    """One simulation run: programs compiled to flat op lists, then SimPy processes per rank."""

    def __init__(self, sched: Schedule, table: CostTable, costs: Any, hw: Any, comm: bool, par: ParallelDims):
        self.sched, self.table, self.hw, self.comm, self.par = sched, table, hw, comm, par
        self.env = Environment()
        self.links = LinkPool()
        self.tp_coll = getattr(costs, "tp_collectives", None) or {}
        self.dp_bytes = list(getattr(costs, "dp_grad_bytes", None) or [])
        n = sched.num_ranks
        self.starts = [[0.0] * len(p) for p in sched.programs]  # seconds, per action
        self.ends = [[0.0] * len(p) for p in sched.programs]  # seconds, per action
        self.tp_time = [[0.0] * len(p) for p in sched.programs]  # seconds of TP collectives inside
        self.memory: list[list[tuple[float, int]]] = [[(0.0, 0)] for _ in range(n)]  # (seconds, bytes)
        self.collectives: list[CollectiveRecord] = []
        self.last_coll: list[CollectiveRecord | None] = [None] * n  # each rank's collective stream
        self.slots: list[Any] = []  # recv id -> Transfer, or the rank (int) blocked waiting for it
        self.transfers: list[Transfer] = []  # in posting order
        self.ops = self._compile()
        self.send_post = getattr(hw, "send_overhead", 0.0) if hw is not None and comm else 0.0  # seconds per SEND
        self.recv_late = self._late_recv()  # seconds
        # ranks computing on host cores share them (None unless hw.host_cores is set)
        self.host = host_cores_model(self.env, hw, [par.rank(pp=r) for r in range(n)])

    # -- preparation ---------------------------------------------------------------------------

    def _compile(self) -> list[list[tuple]]:
        """Per rank, a list of op tuples (one shared tuple per (stage, kind)) for the hot loop.

        Message slots are numbered arithmetically, (recv stage, direction) * stride + microbatch, and
        ops are cached per (stage, kind), because creating and hashing Action objects would dominate
        at p=64, m=1024.
        """
        sched = self.sched
        mbs, split = 1, False
        for prog in sched.programs:  # one pass instead of Schedule.split_backward + a max()
            for a in prog:
                if a.microbatch >= mbs:
                    mbs = a.microbatch + 1
                if a.kind._value_ == "I":
                    split = True
        self.slots = [None] * (2 * sched.num_stages * mbs)
        self.mbs = mbs
        release = "W" if split else "B"
        last_grad: dict[int, tuple[int, int]] = {}  # stage -> (rank, index) of its last B/W
        cache: dict[tuple[int, str], tuple] = {}  # (stage, kind) -> op; the microbatch is read at run time
        all_ops = []
        for rank, prog in enumerate(sched.programs):
            ops: list[tuple] = []
            append = ops.append
            for i, a in enumerate(prog):
                key = (a.stage, a.kind._value_)
                op = cache.get(key)
                if op is None:
                    op = cache[key] = self._op(rank, a, release, mbs)
                append(op)
                if op[0] == _COMPUTE and op[6]:
                    last_grad[a.stage] = (rank, i)
            all_ops.append(ops)
        for stage, (rank, i) in sorted(last_grad.items()):
            op = all_ops[rank][i]
            all_ops[rank][i] = op[:4] + (stage,) + op[5:]  # then all-reduce the stage's gradient
        return all_ops

    def _op(self, rank: int, a, release: str, mbs: int) -> tuple:
        """The op of every action with this (stage, kind); message slot = op[1] + microbatch."""
        k, st = a.kind._value_, a.stage
        if len(k) == 1:  # F, B, I, W: (code, seconds, TP seconds, stash bytes, all-reduce stage, in-flight, grad)
            act = self.table.stages[st].activation_bytes
            sign = 1 if k == "F" else (-1 if k == release else 0)
            d = self.table.duration(a)
            if (k == "I" or k == "W") and st and self.hw is not None:  # split backward's runtime bookkeeping
                d += self.hw.split_backward_overhead  # (the first stage's W is a plain backward, its I empty)
                if k == "W":  # W runs autograd once per parameter group of the stage
                    d += self.table.stages[st].weight_ops * self.hw.split_group_overhead
                else:  # I first walks the stage's autograd graph (in Python) to find the groups
                    d += self.table.stages[st].backward_ops * self.hw.split_graph_overhead
            return (_COMPUTE, d, self._tp_time(rank, a), sign * act, -1, sign, k in ("B", "W"))
        if k == "SEND_F":
            return (_SEND, 2 * (st + 1) * mbs, *self._send_plan(rank, a))
        if k == "SEND_B":
            return (_SEND, (2 * (st - 1) + 1) * mbs, *self._send_plan(rank, a))
        return (_RECV, (2 * st + (k == "RECV_B")) * mbs)

    def _tp_time(self, rank: int, action) -> float:
        """Seconds of the blocking TP collectives inside one compute action."""
        colls = self.tp_coll.get((action.stage, action.kind.value)) if self.tp_coll else None
        if not colls or self.par.tp == 1 or not self.comm:
            return 0.0
        from pipesim.comm_costs import group_collective_time

        group = self.par.group("tp", self.par.rank(pp=rank))
        return sum(group_collective_time(self.hw, kind, group, nbytes) for kind, nbytes in colls)

    def _send_plan(self, rank: int, send) -> tuple:
        """(dst rank, bytes, seconds, resources, link class name) of a SEND; the same for every microbatch."""
        dst = self.sched.rank_of(send.peer_stage)
        nbytes = self.table.transfer_bytes(send)
        if not self.comm:
            return dst, nbytes, 0.0, (), ""
        a, b = self.par.rank(pp=rank), self.par.rank(pp=dst)
        res = tuple(sorted(self.hw.link_resources(a, b)))
        return dst, nbytes, self.hw.p2p_time(a, b, nbytes), res, self.hw.link_between(a, b).name

    def _late_recv(self) -> float:
        """Seconds a RECV lasts at least when its message was posted while the receiver computed.

        Host ranks only (gloo): the receiver asks for the data when it reaches the RECV, and the
        sender's progress thread, now sharing a core with its compute, answers late; more so with
        more ranks than cores. 0 without hardware or without communication.
        """
        hw = self.hw
        if hw is None or not self.comm or not hw.late_recv_delay:
            return 0.0
        if hw.host_cores is None or not hw.oversubscribed_recv_delay:
            return hw.late_recv_delay
        nodes = [hw.node_of(self.par.rank(pp=r)) for r in range(self.sched.num_ranks)]
        extra = max(nodes.count(n) - hw.host_cores for n in set(nodes))
        return hw.late_recv_delay + (hw.oversubscribed_recv_delay if extra > 0 else 0.0)

    # -- the ranks ------------------------------------------------------------------------------

    def run(self) -> SimResult:
        env, n = self.env, self.sched.num_ranks
        self.pos = [0] * n  # next action of each rank
        self.blocked = [False] * n  # rank sleeps in the RECV at `pos` until its message arrives
        self.posting = [False] * n  # rank sleeps in the SEND at `pos` until it has posted it
        self.computing = [False] * n  # host cores: rank sleeps in the compute at `pos` until its work is done
        self.host_done = [partial(self._advance, r, None) for r in range(n)]
        self.live = [0] * n  # bytes of stashed activations
        self.inflight = [0] * n  # microbatches whose activations are stashed
        self.peak_inflight = [0] * n
        self.wakers = [[partial(self._advance, r)] for r in range(n)]  # callback lists of the alarms
        self.alarms = [env.alarm() for _ in range(n)]
        for rank in range(n):
            self._wake(rank, 0.0)
        env.run()
        stuck = [r for r in range(n) if self.pos[r] < len(self.ops[r])]
        if stuck:  # validation rules this out for registered schedules; CSV imports are validated too
            raise PipesimError(f"simulation deadlocked on ranks {stuck}")
        return SimResult.build(self)

    def _wake(self, rank: int, when: float) -> None:
        """Resume `rank` at exactly `when` (>= now); a rank sleeps on one thing at a time."""
        self.env.arm(self.alarms[rank], self.wakers[rank], when)

    def _advance(self, rank: int, _event: Event) -> None:
        """Run the rank's program from where it stopped until it has to wait, then sleep.

        A rank is a chain of SimPy events rather than a generator process: the same semantics
        (compute holds it for its duration, SEND posts and moves on, RECV blocks until arrival)
        with a third of the per-event overhead. Times are exact: a rank is always woken at an
        absolute time (compute end or message arrival), never at now + (t - now).
        """
        env = self.env
        now, i = env._now, self.pos[rank]
        starts, ends, ops, prog = self.starts[rank], self.ends[rank], self.ops[rank], self.sched.programs[rank]
        slots, wake = self.slots, self._wake
        queue = env._queue  # nothing earlier than `now` pending -> keep going without a wake-up event
        mem = self.memory[rank]
        live, held, peak = self.live[rank], self.inflight[rank], self.peak_inflight[rank]
        if self.blocked[rank]:  # woken by the message this RECV waited for
            self.blocked[rank] = False
            ends[i] = now
            i += 1
        elif self.posting[rank]:  # woken at the end of posting this SEND
            self.posting[rank] = False
            self._post_send(rank, i, ops[i], now)
            i += 1
        elif self.computing[rank]:  # host cores: woken when the shared cores have done this action's work
            self.computing[rank] = False
            _, _, tp, delta, grad_stage, count, _ = ops[i]
            starts[i] = self.host.started[rank]  # it began when it first had a core (time slices: maybe later)
            ends[i] = now
            if tp:
                self.tp_time[rank][i] = tp
            if delta:
                live += delta
                mem.append((now, live))
            if count:
                held += count
                peak = max(peak, held)
            if grad_stage >= 0:
                self._dp_allreduce(rank, grad_stage, i, now)
            i += 1
        n = len(ops)
        post, late = self.send_post, self.recv_late
        while i < n:
            op = ops[i]
            starts[i] = now
            code = op[0]
            if code == _COMPUTE:
                _, d, tp, delta, grad_stage, count, _ = op
                if self.host is not None:  # shared cores: how long it takes depends on who else runs
                    self.computing[rank] = True
                    self.host.start(rank, d + tp, self.host_done[rank])
                    break
                if tp:
                    d += tp
                    self.tp_time[rank][i] = tp
                now += d
                ends[i] = now
                if delta:
                    live += delta
                    mem.append((now, live))
                if count:
                    held += count
                    if held > peak:
                        peak = held
                if grad_stage >= 0:
                    self._dp_allreduce(rank, grad_stage, i, now)
                i += 1
                if d and queue and queue[0][0] <= now:  # another event comes first: sleep until `now`
                    env.arm(self.alarms[rank], self.wakers[rank], now)
                    break
            elif code == _SEND:
                if post and self.host is not None:  # posting is CPU work on the shared cores too
                    self.posting[rank] = True
                    self.host.start(rank, post, self.host_done[rank])
                    break
                if post:  # posting the isend holds the rank; the message leaves once it is posted
                    now += post
                    if queue and queue[0][0] <= now:  # another event comes first: post at `now` after it
                        self.posting[rank] = True
                        env.arm(self.alarms[rank], self.wakers[rank], now)
                        break
                self._post_send(rank, i, op, now)
                i += 1
            else:
                rid = op[1] + prog[i].microbatch
                slot = slots[rid]
                if slot is None:  # not posted yet: the sender wakes us at the arrival time
                    self.blocked[rank] = True
                    slots[rid] = rank
                    break
                arrive = slot.end
                if late and slot.post < now and now + late > arrive:  # posted while we computed: late
                    arrive = now + late
                if arrive > now:  # bytes still moving
                    self.blocked[rank] = True
                    wake(rank, arrive)
                    break
                ends[i] = now
                i += 1
        self.pos[rank] = i
        self.live[rank], self.inflight[rank], self.peak_inflight[rank] = live, held, peak

    def _post_send(self, rank: int, i: int, op: tuple, now: float) -> None:
        """Post the SEND at `i` on `rank` at `now`: its transfer takes the links, a blocked receiver is woken."""
        _, rid, dst, nbytes, dur, res, link = op
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
        if waiter is not None:  # the receiver is already blocked on this message
            self._wake(waiter, tr.end)
        self.ends[rank][i] = now

    def _dp_allreduce(self, rank: int, stage: int, index: int, now: float) -> None:
        """Gradient all-reduce of `stage` over its data-parallel group, on the rank's collective stream."""
        if self.par.dp == 1 or not self.comm or not self.dp_bytes:
            return
        from pipesim.comm_costs import group_collective_time

        nbytes = self.dp_bytes[stage]
        seconds = group_collective_time(self.hw, "all_reduce", self.par.group("dp", self.par.rank(pp=rank)), nbytes)
        prev = self.last_coll[rank]
        start = now if prev is None or prev.end <= now else prev.end
        rec = CollectiveRecord(rank, "all_reduce", stage, start, start + seconds, nbytes, index, prev)
        self.last_coll[rank] = rec
        self.collectives.append(rec)
