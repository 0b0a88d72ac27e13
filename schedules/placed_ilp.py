"""The Zero Bubble paper's ILP (appendix G) generalised from one stage per rank to any placement: v chunks
per rank, ZB-V's V (rank r holds stages r and 2p-1-r) or the looped placement, solved by HiGHS.

Variables: each action's end time (seconds) and one binary per pair of a rank's actions that the
dependency graph leaves unordered (schedules.placed_graph: eq. 6 with a big-M of the warm start's
makespan). Memory (eq. 7) is the rank's sum over its stages, in bytes: after each action that adds to
it (F: +M_B of its stage; I: M_W - M_B when positive) the rank's stash is within its limit. This is the
V family's "controllable memory" (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory",
arXiv 2405.15362): the authors hand-build V-Min, V-Half and V-ZB from one repeated building block for
about (p+4)//3, (p+2)//2 and p microbatches' activations (1F1B: p); here the limit is any number of
bytes per rank and the order is searched for the given seconds and hops. Objective: the makespan (the
last W of any stage), or the paper's eq. 3 (the longest rank's first start to last end). The warm
start is a valid order (the handcrafted one), so the answer is never worse than it. `highspy` is
imported only when a search runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipesim.ir.schedule import Action
from schedules.placed_graph import (
    KINDS,
    Graph,
    Key,
    Programs,
    delta,
    fits,
    placed_end_times,
    placed_measure,
    placed_work_bound,
    seconds_of,
)
from schedules.zb_ilp import IlpResult, add_columns, check_objective, run_search, set_warm_start
from schedules.zb_inputs import AutoCosts


def solve_placed(placement: Sequence[int], m: int, costs: AutoCosts, start: Programs, *, time_limit: float = 10.0,
                 objective: str = "makespan", seed: int = 0, graph: Graph | None = None) -> IlpResult:
    """The best order HiGHS finds within `time_limit` seconds, warm-started from `start` (valid, within limits)."""
    check_objective(objective)
    graph = graph or Graph(placement, m, costs)
    warm = placed_measure(placement, start, costs, objective)
    floor = placed_work_bound(graph, objective)
    if warm <= floor * (1 + 1e-12):  # the warm start meets the bound: proven without a solve
        return IlpResult(start, warm, warm, warm, True, 0.0, "Optimal (meets the work bound)")
    model = PlacedModel(graph, horizon=warm + 1e-9 * max(1.0, warm), objective=objective, floor=floor)
    return run_search(model, start, warm, floor, lambda progs: placed_measure(placement, progs, costs, objective),
                      time_limit=time_limit, seed=seed, accept=lambda progs: fits(placement, progs, costs))


class PlacedModel:
    """Columns: one end time per action, then one binary per open pair (1: the pair's first before its second),
    then the objective's variable."""

    def __init__(self, graph: Graph, horizon: float, objective: str, floor: float) -> None:
        self.g, self.c, self.horizon, self.objective, self.floor = graph, graph.c, horizon, objective, floor
        self.col = dict(graph.index)
        self.pairs: dict[tuple[Key, Key], int] = {}
        for pair in graph.open_pairs():
            self.pairs[pair] = len(self.col) + len(self.pairs)
        self.z = len(self.col) + len(self.pairs)
        self.ranks = max(graph.placement) + 1

    def build(self, h, highspy) -> None:
        inf, c, col, g = highspy.kHighsInf, self.c, self.col, self.g
        add_columns(h, highspy, self, lambda key: seconds_of(c, key))
        rows: list[tuple[dict[int, float], float, float]] = []
        for a, b, gap in g.edges:  # E_b - E_a >= gap
            rows.append(({col[b]: 1.0, col[a]: -1.0}, gap, inf))
        big = self.horizon
        for (a, b), x in self.pairs.items():  # x = 1: a before b (E_b >= E_a + T_b), else b before a
            rows.append(({col[b]: 1.0, col[a]: -1.0, x: -big}, seconds_of(c, b) - big, inf))
            rows.append(({col[a]: 1.0, col[b]: -1.0, x: big}, seconds_of(c, a), inf))
        rows += self.memory_rows(inf)
        for r in range(self.ranks):
            keys = g.on_rank(r)
            lasts = [key for key in keys if not any(g.ordered(key, other) for other in keys)]
            top = min(key[0] for key in keys)
            first = (top, KINDS[0], 0)  # the rank's first stage's first F: every other action of the rank follows it
            for last in lasts:
                if self.objective == "makespan":
                    rows.append(({self.z: 1.0, col[last]: -1.0}, 0.0, inf))
                else:
                    rows.append(({self.z: 1.0, col[last]: -1.0, col[first]: 1.0}, seconds_of(c, first), inf))
        for coef, lo, hi in rows:
            h.addRow(lo, hi, len(coef), list(coef), list(coef.values()))

    def memory_rows(self, inf: float) -> list[tuple[dict[int, float], float, float]]:
        """Eq. 7 per rank: after each action that adds bytes, the sum of the deltas of the rank's actions before it
        (and its own) is within the limit; a pair's binary decides the open ones."""
        g, c, rows = self.g, self.c, []
        for r in range(self.ranks):
            limit = c.limit[r]
            if limit == float("inf"):
                continue
            keys = g.on_rank(r)
            for a in keys:
                if delta(c, a) <= 0:
                    continue
                const, coef, most = delta(c, a), {}, delta(c, a)
                for b in keys:
                    if b == a or g.ordered(a, b):
                        continue
                    d = delta(c, b)
                    if g.ordered(b, a):
                        const += d
                        most += d
                        continue
                    most += max(d, 0.0)
                    if (a, b) in self.pairs:  # x = 1: a before b, so b counts when x = 0
                        x = self.pairs[(a, b)]
                        const += d
                        coef[x] = coef.get(x, 0.0) - d
                    else:  # pair (b, a), x = 1: b before a
                        x = self.pairs[(b, a)]
                        coef[x] = coef.get(x, 0.0) + d
                if most <= limit:
                    continue  # cannot bind
                rows.append((coef, -inf, limit - const))
        return rows

    def warm_start(self, h, highspy, programs: Programs) -> None:
        set_warm_start(h, highspy, self, programs, *placed_end_times(self.g.placement, programs, self.c))

    def programs(self, values: list[float]) -> Programs:
        """Each rank's actions by start time (then end, then topological position: zero-length ties stay valid)."""
        out = []
        for r in range(self.ranks):
            keys = self.g.on_rank(r)
            keys.sort(key=lambda key: (round(values[self.col[key]] - seconds_of(self.c, key), 9),
                                       round(values[self.col[key]], 9), self.g.rank_in_order[self.g.index[key]]))
            out.append(tuple(Action(*key) for key in keys))
        return tuple(out)
