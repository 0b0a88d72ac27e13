"""zb-v searched for real costs: the V placement's order (rank r holds stages r and 2p-1-r) found by the ILP
over the placement (schedules.placed_ilp) under a per-rank activation limit in bytes, from the best
start that fits.

Why: zb-v's order is tuned to equal costs and 1F1B's activation memory; Qi et al. 2024 ("Pipeline
Parallelism with Controllable Memory", arXiv 2405.15362) hand-build V-Min, V-Half and V-ZB for about
1/3, 1/2 and 1x of 1F1B's activations. Given a limit (`--memory-limit`: bytes, or `Nx` times 1F1B's,
min(p, m) microbatches of the rank's two chunks; by default what zb-v's own order holds), the start is
the shortest of zb-v, v-half, v-min and a list scheduler's order (schedules.placed_list) that fits
(one microbatch at a time when none does); with `--ilp S` the ILP improves it for up to S seconds and
says whether it proved the optimum. Without `--ilp` but with a limit, that start is the answer. The
result is an ordinary Schedule named zb-v on the V placement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pipesim.cost.table import CostTable
from pipesim.cost.zb_auto_costs import AUTO_SCHEDULES, MAX_ILP_BINARIES, MemoryLimit, Searched
from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action, Kind, Schedule, v_placement
from schedules.placed_graph import Graph, Programs, fits, peak_stash, placed_measure, placed_work_bound
from schedules.placed_ilp import solve_placed
from schedules.placed_list import list_orders
from schedules.v_memory import v_half, v_min
from schedules.zb_inputs import AutoCosts
from schedules.zero_bubble_v import zb_v

V_SEARCHED = ("zb-v",)  # the schedules searched here; their default limit is zb-v's own peak, rank by rank
SEARCHED = (*AUTO_SCHEDULES, *V_SEARCHED)  # every schedule whose order a search sets (SEARCHED_TEXT in words)


def _activation(table: CostTable, stage: int) -> float:
    return float(table.stages[stage].activation_bytes or 1)


def v_limit(limit: MemoryLimit, table: CostTable, p: int, m: int) -> tuple[float, ...]:
    """Bytes each rank may stash: absolute, or a multiple of 1F1B's (min(p, m) microbatches of both its chunks)."""
    if limit.bytes is not None:
        return (limit.bytes,) * p
    return tuple(limit.multiple * min(p, m) * (_activation(table, r) + _activation(table, 2 * p - 1 - r))
                 for r in range(p))


def v_costs(table: CostTable, p: int, m: int, limit: MemoryLimit | None, comm: Sequence[float] = ()) -> AutoCosts:
    """The search's inputs from a 2p-chunk cost table; `comm`: seconds per boundary s -> s + 1 (0 if empty; the
    turn of the V, boundary p-1 -> p, is on one rank and costs nothing whatever is given). `limit` None: what
    zb-v's own order holds on each rank, so the searched order never needs more memory than the handcrafted one."""
    if table.num_stages != 2 * p:
        raise PipesimError(f"zb-v places 2 chunks per rank: {table.num_stages} stages on {p} ranks")
    st = table.stages
    hops = list(comm) or [0.0] * (2 * p - 1)
    hops[p - 1] = 0.0
    stash = tuple(_activation(table, s) for s in range(2 * p))
    costs = AutoCosts(tuple(c.forward for c in st), tuple(c.backward_input for c in st),
                      tuple(c.backward_weight for c in st), tuple(hops), stash,
                      v_limit(limit or MemoryLimit(bytes=float("inf")), table, p, m))
    if limit is None:
        costs = replace(costs, limit=tuple(peak_stash(v_placement(p), zb_v(p, m).programs, costs)))
    return costs


def serial(p: int, m: int) -> Programs:
    """One microbatch at a time down the V and back, each W right after its I: valid under any limit that holds one
    microbatch of a rank's two chunks, so the search always has a start."""
    placement, order = v_placement(p), []
    for j in range(m):
        order += [Action(s, Kind.F, j) for s in range(2 * p)]
        for s in range(2 * p - 1, -1, -1):
            order += [Action(s, Kind.I, j), Action(s, Kind.W, j)]
    return tuple(tuple(a for a in order if placement[a.stage] == r) for r in range(p))


def handcrafted(p: int, m: int, costs: AutoCosts, objective: str = "makespan") -> tuple[str, Programs]:
    """(name, order) of the shortest of zb-v, v-half, v-min and the list scheduler's order (schedules.placed_list)
    within the limit (ties keep that order); when none fits, the one-microbatch-at-a-time order ("serial")."""
    placement, best = v_placement(p), None
    starts = [(b.__name__.replace("_", "-"), lambda b=b: b(p, m).programs) for b in (zb_v, v_half, v_min)]
    starts += [("list", lambda: list_orders(placement, m, costs)), ("serial", lambda: serial(p, m))]
    for name, build in starts:
        if best is not None and name == "serial":
            break
        programs = build()
        if programs is None or not fits(placement, programs, costs):
            continue
        value = placed_measure(placement, programs, costs, objective)
        if best is None or value < best[0]:
            best = (value, name, programs)
    if best is None:
        need = [costs.activation[r] + costs.activation[2 * p - 1 - r] for r in range(p)]
        raise PipesimError(f"--memory-limit {min(costs.limit):g} B leaves a rank less than one microbatch of its two "
                           f"chunks ({max(need):g} B): nothing can run")
    return best[1], best[2]


def search_v(name: str, costs: AutoCosts, p: int, m: int, *, time_limit: float | None = 10.0,
             objective: str = "makespan") -> Searched:
    """The best handcrafted V order within the limit, then (with `time_limit` seconds) the ILP from it."""
    if name not in V_SEARCHED:
        raise PipesimError(f"the V search orders {' and '.join(V_SEARCHED)}, not {name}")
    if time_limit is not None and time_limit <= 0:
        raise PipesimError(f"--ilp takes a positive number of seconds, got {time_limit:g}")
    placement = v_placement(p)
    origin, start = handcrafted(p, m, costs, objective)
    heuristic = placed_measure(placement, start, costs, objective)
    graph = Graph(placement, m, costs)
    floor = placed_work_bound(graph, objective)

    def schedule(programs: Programs, how: str) -> Schedule:
        sched = Schedule(name, m, placement, programs)
        sched.meta.update(virtual=2, memory_limit_bytes=list(costs.limit), search=how, warm_start=origin)
        return sched

    if time_limit is None:
        return Searched(schedule(start, f"handcrafted {origin}"), None, heuristic, floor, "no --ilp")
    binaries = len(graph.open_pairs())
    if binaries > MAX_ILP_BINARIES:
        return Searched(schedule(start, f"handcrafted {origin}"), None, heuristic, floor,
                        f"{binaries} order binaries > {MAX_ILP_BINARIES}")
    result = solve_placed(placement, m, costs, start, time_limit=time_limit, objective=objective, graph=graph)
    return Searched(schedule(result.programs, "ilp-optimal" if result.optimal else "ilp-best-found"), result,
                    heuristic, result.bound)


def rebuild_v(schedule: Schedule, table: CostTable, limit: MemoryLimit | None, comm: Sequence[float] = (),
              ilp_time_limit: float | None = None) -> Schedule:
    """zb-v ordered for these costs when a limit or `ilp_time_limit` is given; otherwise as it is."""
    if schedule.name not in V_SEARCHED or (limit is None and ilp_time_limit is None):
        return schedule
    p, m = schedule.num_ranks, schedule.num_microbatches
    if schedule.placement != v_placement(p):
        raise PipesimError(f"{schedule.name}: the V search needs the V placement")
    costs = v_costs(table, p, m, limit, comm)
    return search_v(schedule.name, costs, p, m, time_limit=ilp_time_limit).schedule
