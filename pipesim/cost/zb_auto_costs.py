"""zb-auto from real costs: the Zero Bubble heuristic (schedules.zb_auto) fed by a cost table and a memory limit.

The registry builds zb-auto and zb-2p with unit costs; with a model or `--cost` the simulator rebuilds
them here from the table's F, I, W seconds, each boundary's P2P seconds and a per-rank activation
limit (`--memory-limit`: bytes, or `Nx` times 1F1B's activation memory, p microbatches of the rank's
stage; zb-auto defaults to 1x, zb-2p to 2x). The result is an ordinary Schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipesim.cost.table import CostTable
from pipesim.errors import PipesimError
from pipesim.ir.schedule import Schedule, loop_placement
from schedules.zb_auto import AutoCosts, zb_auto_programs, zb_auto_schedule
from schedules.zb_heuristic import NoFit, paper_heuristic
from schedules.zb_ilp import IlpResult, measure, solve, work_bound

MAX_ILP_BINARIES = 20_000  # order binaries (about 1.5 p m^2) above which `exact` keeps the heuristic: HiGHS
# proves small cases in seconds (p 3, m 6: under 1 s on this 2-core CPU box) and only bounds large ones

AUTO_SCHEDULES = {"zb-auto": 1.0, "zb-2p": 2.0}  # name -> default limit, in multiples of 1F1B's activations
SEARCHED_TEXT = "zb-auto, zb-2p and zb-v"  # every schedule an order search applies to (zb-v: pipesim.cost.v_search)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


@dataclass(frozen=True)
class MemoryLimit:
    """Per-rank activation limit: absolute bytes, or a multiple of 1F1B's (p microbatches of the stage)."""

    bytes: float | None = None  # bytes
    multiple: float | None = None  # x 1F1B's activation memory

    def per_rank(self, table: CostTable, p: int, m: int) -> tuple[float, ...]:
        """Bytes each rank may stash (a stage without activation bytes counts one unit per microbatch)."""
        if self.bytes is not None:
            return (self.bytes,) * p
        return tuple(self.multiple * min(p, m) * _activation(table, r) for r in range(p))


def parse_memory_limit(text: str) -> MemoryLimit:
    """`2x` (twice 1F1B's activation memory), `inf`, or bytes: `8000000000`, `8GB`, `7.5GiB`."""
    t = text.strip().lower().replace(" ", "")
    try:
        if t in ("inf", "none", "unlimited"):
            return MemoryLimit(bytes=float("inf"))
        if t.endswith("x"):
            value = float(t[:-1])
            if value <= 0:
                raise ValueError
            return MemoryLimit(multiple=value)
        digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
        value = float(digits) * _UNITS[t[len(digits):]]
        if value <= 0:
            raise ValueError
        return MemoryLimit(bytes=value)
    except (ValueError, KeyError):
        raise PipesimError(f"malformed --memory-limit {text!r}: expected bytes (8000000000, 8GB, 7.5GiB), "
                           "a multiple of 1F1B's activation memory (2x), or inf") from None


def _activation(table: CostTable, stage: int) -> float:
    return float(table.stages[stage].activation_bytes or 1)


def auto_costs(table: CostTable, p: int, m: int, limit: MemoryLimit, comm: Sequence[float] = ()) -> AutoCosts:
    """The heuristic's inputs from a one-stage-per-rank cost table; `comm`: seconds per boundary (0 if empty)."""
    if table.num_stages != p:
        raise PipesimError(f"zb-auto places one stage per rank: {table.num_stages} stages on {p} ranks")
    st = table.stages
    return AutoCosts(tuple(c.forward for c in st), tuple(c.backward_input for c in st),
                     tuple(c.backward_weight for c in st), tuple(comm) or (0.0,) * (p - 1),
                     tuple(_activation(table, r) for r in range(p)), limit.per_rank(table, p, m))


def makespan_lower_bound(table: CostTable, p: int, m: int, comm: Sequence[float] = ()) -> float:
    """No one-stage-per-rank order of m microbatches ends sooner (seconds): for each rank r, its first input
    arrives after the forwards and hops above it (head), then either all its work runs (m (F + I + W)), or
    its F's and I's run (m (F + I)) and the last microbatch's input gradient still travels down to rank 0,
    whose last W follows. With equal stages and no comm: max((p-1)F + m(F+I+W), (p-1)F + m(F+I) + (p-1)I + W).
    """
    st, hop = table.stages, tuple(comm) or (0.0,) * (p - 1)
    bound = 0.0
    for r in range(p):
        head = sum(st[s].forward + hop[s] for s in range(r))
        c = st[r]
        chain = sum(hop[s] + st[s].backward_input for s in range(r)) + st[0].backward_weight
        bound = max(bound, head + m * (c.forward + c.backward_input + c.backward_weight),
                    head + m * (c.forward + c.backward_input) + chain)
    return bound


def rebuild(schedule: Schedule, table: CostTable, limit: MemoryLimit | None, comm: Sequence[float] = (),
            ilp_time_limit: float | None = None) -> Schedule:
    """`schedule` again when it is zb-auto or zb-2p, ordered for these costs (and, with `ilp_time_limit`
    seconds, improved by the ILP where p, m are small enough: `exact`); any other schedule unchanged."""
    default = AUTO_SCHEDULES.get(schedule.name)
    if default is None:
        for flag, given in (("--memory-limit", limit is not None), ("--ilp", ilp_time_limit is not None)):
            if given:
                raise PipesimError(f"{flag} applies to {SEARCHED_TEXT}, not {schedule.name}")
        return schedule
    limit = limit or MemoryLimit(multiple=default)
    p, m = schedule.num_ranks, schedule.num_microbatches
    costs = auto_costs(table, p, m, limit, comm)
    if ilp_time_limit is not None:
        return exact(schedule.name, costs, p, m, time_limit=ilp_time_limit).schedule
    return zb_auto_schedule(p, m, costs, schedule.name)


@dataclass(frozen=True)
class Searched:
    """An order searched for given costs: the schedule, the ILP's verdict (None: not run), the work bound."""

    schedule: Schedule
    ilp: IlpResult | None
    heuristic: float  # seconds: the heuristic's makespan (or span)
    bound: float  # seconds: no order is shorter
    reason: str = ""  # why the ILP did not run

    @property
    def value(self) -> float:
        return self.ilp.objective if self.ilp is not None else self.heuristic

    @property
    def gap(self) -> float:
        """(value - bound) / value."""
        return max(0.0, (self.value - self.bound) / self.value) if self.value else 0.0


def ilp_binaries(p: int, m: int) -> int:
    return p * 3 * m * (m - 1) // 2


def exact(name: str, costs: AutoCosts, p: int, m: int, *, time_limit: float = 10.0,
          objective: str = "makespan") -> Searched:
    """zb-auto / zb-2p's heuristic order, then the ILP warm-started from it when p, m are small enough."""
    if name not in AUTO_SCHEDULES:
        raise PipesimError(f"--ilp searches {SEARCHED_TEXT}, not {name}")
    if time_limit <= 0:
        raise PipesimError(f"--ilp takes a positive number of seconds, got {time_limit:g}")
    start = zb_auto_programs(p, m, costs)  # the shortest of zb-auto's settings, the paper's heuristic among them
    if objective == "span":  # the paper's heuristic keeps its best by span: the better start for that objective
        try:
            paper = paper_heuristic(p, m, costs)[1]
            if measure(p, paper, costs, objective) < measure(p, start, costs, objective):
                start = paper
        except NoFit:
            pass
    heuristic = measure(p, start, costs, objective)
    floor = work_bound(p, m, costs, objective)
    if ilp_binaries(p, m) > MAX_ILP_BINARIES:
        sched = Schedule(name, m, loop_placement(p, 1), start)
        sched.meta["memory_limit_bytes"] = list(costs.limit)
        return Searched(sched, None, heuristic, floor, f"{ilp_binaries(p, m)} order binaries > {MAX_ILP_BINARIES}")
    result = solve(p, m, costs, start, time_limit=time_limit, objective=objective)
    sched = Schedule(name, m, loop_placement(p, 1), result.programs)
    sched.meta["memory_limit_bytes"] = list(costs.limit)
    sched.meta["search"] = "ilp-optimal" if result.optimal else "ilp-best-found"
    return Searched(sched, result, heuristic, result.bound)
