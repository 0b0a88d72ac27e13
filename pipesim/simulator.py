"""The SimPy simulator: every pipeline rank runs its lowered program in order, like the executor.

Each rank is one SimPy process on its device. Compute holds the rank for its duration (plus the
blocking tensor-parallel collectives of that action); a SEND posts a transfer and moves on (an
isend); a RECV blocks until the matching transfer's bytes have arrived. Transfers hold the link
resources on the path between the two devices (`pipesim.sim_links`), so messages that share a
port or a bus queue up. Data-parallel gradient all-reduces run on a per-rank collective stream
after the stage's last backward, overlapping the rest of the step.

Same input, same output: processes are created in rank order, resources are FIFO, and SimPy breaks
time ties by insertion order, so two runs produce identical numbers bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipesim.costs import CostTable
from pipesim.errors import PipesimError
from pipesim.ir import Schedule
from pipesim.lowering import add_p2p
from pipesim.sim_links import Environment, LinkPool, Transfer
from pipesim.sim_result import CollectiveRecord, SimResult

_COMPUTE, _SEND, _RECV = 0, 1, 2


@dataclass(frozen=True)
class Parallelism:
    """How many copies (dp) and shards (tp) each pipeline rank has; Megatron order tp, dp, pp."""

    dp: int = 1
    tp: int = 1

    def device(self, rank: int, dp_index: int = 0, tp_index: int = 0) -> int:
        """Global device id of (pipeline rank, data-parallel index, tensor-parallel index)."""
        return rank * self.dp * self.tp + dp_index * self.tp + tp_index

    def tp_group(self, rank: int) -> list[int]:
        return [self.device(rank, 0, t) for t in range(self.tp)]

    def dp_group(self, rank: int) -> list[int]:
        return [self.device(rank, d, 0) for d in range(self.dp)]


def check_devices(num_ranks: int, par: Parallelism, hw: Any) -> None:
    """PipesimError when pp x dp x tp devices do not fit the hardware."""
    need = num_ranks * par.dp * par.tp
    if hw is not None and need > hw.num_devices:
        raise PipesimError(
            f"needs {need} devices (pp {num_ranks} x dp {par.dp} x tp {par.tp}) but {hw.name} has {hw.num_devices}"
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
    par = Parallelism(dp or getattr(costs, "dp", 1) or 1, tp or getattr(costs, "tp", 1) or 1)
    if table.num_stages != schedule.num_stages:
        raise PipesimError(f"cost table has {table.num_stages} stages but schedule {schedule.name!r} "
                           f"has {schedule.num_stages}")
    if hw is None and (comm and schedule.num_ranks > 1 or par.dp > 1 or par.tp > 1):
        if par.dp > 1 or par.tp > 1:
            raise PipesimError("data/tensor parallelism needs a hardware description")
        comm = False
    check_devices(schedule.num_ranks, par, hw)
    return _Engine(add_p2p(schedule), table, costs, hw, comm, par).run()


class _Engine:
    """One simulation run: programs compiled to flat op lists, then SimPy processes per rank."""

    def __init__(self, sched: Schedule, table: CostTable, costs: Any, hw: Any, comm: bool, par: Parallelism):
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
        self.slots: list[Any] = []  # recv id -> Transfer, or the Event a blocked RECV sleeps on
        self.ops = self._compile()

    # -- preparation ---------------------------------------------------------------------------

    def _compile(self) -> list[list[tuple]]:
        """Per rank, a flat list of (code, arg...) tuples so the hot loop does no lookups.

        Message slots are numbered arithmetically, (recv stage, direction, microbatch), and per-stage
        values are cached, because hashing Action objects dominates at p=64, m=1024.
        """
        sched, table = self.sched, self.table
        mbs = 1 + max((a.microbatch for prog in sched.programs for a in prog), default=0)
        self.slots = [None] * (2 * sched.num_stages * mbs)
        release = "W" if sched.split_backward else "B"
        last_grad: dict[int, tuple[int, int]] = {}  # stage -> (rank, index) of its last B/W
        compute_op: dict[tuple[int, str], tuple] = {}
        send_plan: dict[tuple[int, str], tuple] = {}
        all_ops = []
        for rank, prog in enumerate(sched.programs):
            ops: list[tuple] = []
            for i, a in enumerate(prog):
                k, st, mb = a.kind._value_, a.stage, a.microbatch
                if len(k) == 1:  # F, B, I, W
                    op = compute_op.get((st, k))
                    if op is None:
                        act = table.stages[st].activation_bytes
                        delta = act if k == "F" else (-act if k == release else 0)
                        op = compute_op[(st, k)] = (_COMPUTE, table.duration(a), self._tp_time(rank, a), delta, -1)
                    ops.append(op)
                    if k == "B" or k == "W":
                        last_grad[st] = (rank, i)
                elif k == "SEND_F":
                    plan = send_plan.get((st, k)) or send_plan.setdefault((st, k), self._send_plan(rank, a))
                    ops.append((_SEND, (2 * (st + 1)) * mbs + mb, *plan))
                elif k == "SEND_B":
                    plan = send_plan.get((st, k)) or send_plan.setdefault((st, k), self._send_plan(rank, a))
                    ops.append((_SEND, (2 * (st - 1) + 1) * mbs + mb, *plan))
                else:
                    ops.append((_RECV, (2 * st + (k == "RECV_B")) * mbs + mb))
            all_ops.append(ops)
        for stage, (rank, i) in sorted(last_grad.items()):
            all_ops[rank][i] = all_ops[rank][i][:4] + (stage,)  # then all-reduce the stage's gradient
        return all_ops

    def _tp_time(self, rank: int, action) -> float:
        """Seconds of the blocking TP collectives inside one compute action."""
        colls = self.tp_coll.get((action.stage, action.kind.value)) if self.tp_coll else None
        if not colls or self.par.tp == 1 or not self.comm:
            return 0.0
        from pipesim.comm_costs import group_collective_time

        group = self.par.tp_group(rank)
        return sum(group_collective_time(self.hw, kind, group, nbytes) for kind, nbytes in colls)

    def _send_plan(self, rank: int, send) -> tuple:
        """(dst rank, bytes, seconds, resources, link class name) of a SEND; the same for every microbatch."""
        dst = self.sched.rank_of(send.peer_stage)
        nbytes = self.table.transfer_bytes(send)
        if not self.comm:
            return dst, nbytes, 0.0, (), ""
        a, b = self.par.device(rank), self.par.device(dst)
        res = tuple(sorted(self.hw.link_resources(a, b)))
        return dst, nbytes, self.hw.p2p_time(a, b, nbytes), res, self.hw.link_between(a, b).name

    # -- the processes -------------------------------------------------------------------------

    def run(self) -> SimResult:
        for rank in range(self.sched.num_ranks):
            self.env.process(self._rank(rank))
        self.env.run()
        stuck = [r for r, prog in enumerate(self.sched.programs) if prog and self.ends[r][-1] < 0]
        if stuck:  # validation rules this out for registered schedules; CSV imports are validated too
            raise PipesimError(f"simulation deadlocked on ranks {stuck}")
        return SimResult.build(self)

    def _rank(self, rank: int):
        env, starts, ends, tp_time = self.env, self.starts[rank], self.ends[rank], self.tp_time[rank]
        slots, mem, reserve = self.slots, self.memory[rank], self.links.reserve
        if ends:
            ends[-1] = -1.0  # marks "not finished" until the last action ends
        prog = self.sched.programs[rank]
        live = 0  # bytes of stashed activations
        for i, op in enumerate(self.ops[rank]):
            code = op[0]
            starts[i] = now = env.now
            if code == _COMPUTE:
                d = op[1] + op[2]
                if d:
                    yield env.timeout(d)
                    now = env.now
                tp_time[i] = op[2]
                if op[3]:
                    live += op[3]
                    mem.append((now, live))
                if op[4] >= 0:
                    self._dp_allreduce(rank, op[4], i, now)
            elif code == _SEND:
                _, rid, dst, nbytes, dur, res, link = op
                tr = Transfer(prog[i], rank, dst, nbytes, link, res, now, i)
                if res:
                    reserve(tr, dur)
                else:
                    tr.start, tr.end = now, now + dur
                waiter = slots[rid]
                slots[rid] = tr
                if waiter is not None:  # the RECV is already blocked on this message
                    if tr.end == now:
                        waiter.succeed()
                    else:
                        env.wake_at(waiter, tr.end)
            else:
                rid = op[1]
                slot = slots[rid]
                if slot is None:  # not posted yet: sleep until the sender wakes us
                    ev = slots[rid] = env.event()
                    yield ev
                    now = env.now
                elif slot.end > now:  # posted, bytes still moving
                    yield env.wake_at(env.event(), slot.end)
                    now = env.now
            ends[i] = now

    def _dp_allreduce(self, rank: int, stage: int, index: int, now: float) -> None:
        """Gradient all-reduce of `stage` over its data-parallel group, on the rank's collective stream."""
        if self.par.dp == 1 or not self.comm or not self.dp_bytes:
            return
        from pipesim.comm_costs import group_collective_time

        nbytes = self.dp_bytes[stage]
        seconds = group_collective_time(self.hw, "all_reduce", self.par.dp_group(rank), nbytes)
        prev = self.last_coll[rank]
        start = now if prev is None or prev.end <= now else prev.end
        rec = CollectiveRecord(rank, "all_reduce", stage, start, start + seconds, nbytes, index, prev)
        self.last_coll[rank] = rec
        self.collectives.append(rec)
