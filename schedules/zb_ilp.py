"""An exact search for zero-bubble orders: the Zero Bubble paper's ILP (appendix G), solved by HiGHS.

Variables, per stage (= rank): each action's end time E (seconds) and, for each pair of the stage's actions
whose order the dependencies leave open, one binary (F_j against I_k or W_k, I_j against W_k, k < j; each
kind keeps microbatch order, as the paper's graph does). Constraints: F waits for the stage above plus
the hop, I for the stage below plus the hop (eq. 4, 5); two actions of a stage do not overlap, in the
order their binary says (eq. 6, a big-M of the warm start's length: no better order ends later);
after each F the stash (F +M_B, I +M_W - M_B, W -M_W) is within the limit (eq. 7). Objective: the
makespan (the last W of any stage), or the paper's eq. 3 (the longest stage span) with objective="span".
The heuristic's order (schedules.zb_auto) is the warm start, so the answer is never worse than it; HiGHS
runs single-threaded with a fixed seed and a time limit, and says whether it proved optimality, with its
bound and gap. `highspy` is imported only here, when a search runs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action, Kind
from schedules.zb_heuristic import end_times, stage_spans
from schedules.zb_inputs import AutoCosts

Programs = tuple[tuple[Action, ...], ...]
KINDS = (Kind.F, Kind.I, Kind.W)


@dataclass(frozen=True)
class IlpResult:
    """The order the ILP found, what it is worth, and how far from proven it is."""

    programs: Programs
    objective: float  # seconds: makespan (or span) of `programs`, re-timed
    warm_start: float  # seconds: the same figure for the warm start's order
    bound: float  # seconds: no order is shorter (the best of HiGHS's bound and the work bound)
    optimal: bool  # HiGHS proved it (within its default gap tolerance)
    seconds: float  # wall-clock seconds of the solve
    status: str  # HiGHS's model status, in words

    @property
    def gap(self) -> float:
        """(objective - bound) / objective: 0 when proven."""
        return max(0.0, (self.objective - self.bound) / self.objective) if self.objective else 0.0


def work_bound(p: int, m: int, costs: AutoCosts, objective: str = "makespan") -> float:
    """Seconds no order goes under: a stage's own work (span), plus the forwards and hops above it (makespan)."""
    out = 0.0
    for r in range(p):
        head = 0.0 if objective == "span" else sum(costs.forward[s] + costs.comm[s] for s in range(r))
        out = max(out, head + m * (costs.forward[r] + costs.backward_input[r] + costs.backward_weight[r]))
    return out


def measure(p: int, programs: Programs, costs: AutoCosts, objective: str) -> float:
    first, last = stage_spans(p, programs, costs)
    return max(last) if objective == "makespan" else max(b - a for a, b in zip(first, last))


def solve(p: int, m: int, costs: AutoCosts, start: Programs, *, time_limit: float = 10.0,
          objective: str = "makespan", seed: int = 0) -> IlpResult:
    """The best order HiGHS finds within `time_limit` seconds, warm-started from `start` (a valid order)."""
    check_objective(objective)
    warm = measure(p, start, costs, objective)
    floor = work_bound(p, m, costs, objective)
    if warm <= floor * (1 + 1e-12):  # the warm start meets the work bound: proven without a solve
        return IlpResult(start, warm, warm, warm, True, 0.0, "Optimal (meets the work bound)")
    model = _Model(p, m, costs, horizon=warm + 1e-9 * max(1.0, warm), objective=objective, floor=floor)
    return run_search(model, start, warm, floor, lambda progs: measure(p, progs, costs, objective),
                      time_limit=time_limit, seed=seed)


def check_objective(objective: str) -> None:
    if objective not in ("makespan", "span"):
        raise PipesimError(f"unknown ILP objective {objective!r}: makespan or span")


def run_search(model, start: Programs, warm: float, floor: float, value_of: Callable[[Programs], float], *,
               time_limit: float, seed: int, accept: Callable[[Programs], bool] = lambda programs: True
               ) -> IlpResult:
    """Solve `model` (build, warm_start, programs: _Model or schedules.placed_ilp.PlacedModel) on HiGHS,
    single-threaded with `seed` and `time_limit`; keep its order only when `value_of` it is no worse than the warm
    start's `warm` and `accept` takes it (a memory check), else the warm start."""
    import highspy  # local import: HiGHS is loaded only when an exact search runs

    h = _quiet(highspy.Highs)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", seed)
    h.setOptionValue("time_limit", float(time_limit))
    model.build(h, highspy)
    model.warm_start(h, highspy, start)
    t0 = time.perf_counter()
    h.run()
    seconds = time.perf_counter() - t0
    status = h.getModelStatus()
    programs = start
    if h.getInfo().primal_solution_status == 2:  # a feasible solution
        candidate = model.programs(h.getSolution().col_value)
        try:
            if value_of(candidate) <= warm and accept(candidate):
                programs = candidate
        except ValueError:  # ties of zero-length actions read back in a deadlocking order: keep the warm start
            pass
    value = value_of(programs)
    bound = max(floor, min(value, h.getInfo().mip_dual_bound))
    optimal = status == highspy.HighsModelStatus.kOptimal
    return IlpResult(programs, value, warm, value if optimal else bound, optimal, seconds,
                     h.modelStatusToString(status))


def add_columns(h, highspy, model, seconds: Callable[[tuple[int, Kind, int]], float]) -> None:
    """`model`'s columns (`col`, `pairs`, `z`, `horizon`, `floor`): each action's end time, at least its own
    `seconds`, at most the horizon; each open pair's binary; the objective's variable, at least the floor,
    minimised."""
    n = model.z + 1
    lower, upper = [0.0] * n, [model.horizon] * n
    for key, i in model.col.items():
        lower[i] = seconds(key)
    for i in model.pairs.values():
        upper[i] = 1.0
    lower[model.z] = model.floor
    cost = [0.0] * n
    cost[model.z] = 1.0
    h.addVars(n, lower, upper)
    h.changeColsCost(n, list(range(n)), cost)
    h.changeColsIntegrality(len(model.pairs), list(model.pairs.values()),
                            [highspy.HighsVarType.kInteger] * len(model.pairs))


def set_warm_start(h, highspy, model, programs: Programs, ends: dict, first: list[float], last: list[float]) -> None:
    """Hand HiGHS `programs` as its first solution: each action's end time, each open pair's order, and the
    objective's variable (`model.col`, `model.pairs`, `model.z`, `model.objective`)."""
    pos = {(a.stage, a.kind, a.microbatch): n for prog in programs for n, a in enumerate(prog)}
    values = [0.0] * (model.z + 1)
    for key, i in model.col.items():
        values[i] = ends[key]
    for (a, b), x in model.pairs.items():
        values[x] = 1.0 if pos[a] < pos[b] else 0.0
    values[model.z] = max(last) if model.objective == "makespan" else max(b - a for a, b in zip(first, last))
    sol = highspy.HighsSolution()
    sol.col_value = values
    sol.value_valid = True
    h.setSolution(sol)


class _Model:
    """Columns: one end time per action, then the binaries, then the objective's variable."""

    def __init__(self, p: int, m: int, costs: AutoCosts, horizon: float, objective: str, floor: float) -> None:
        self.p, self.m, self.c, self.horizon, self.objective = p, m, costs, horizon, objective
        self.floor = floor  # seconds: the work bound, the objective's lower bound
        self.col: dict[tuple[int, Kind, int], int] = {}
        for r in range(p):
            for k in KINDS:
                for j in range(m):
                    self.col[(r, k, j)] = len(self.col)
        self.pairs: dict[tuple, int] = {}  # ((r, k, j), (r, k2, j2)) -> binary column: 1 = first before second
        for r in range(p):
            for j in range(m):
                for k in range(j):
                    for a, b in (((r, Kind.F, j), (r, Kind.I, k)), ((r, Kind.F, j), (r, Kind.W, k)),
                                 ((r, Kind.I, j), (r, Kind.W, k))):
                        self.pairs[(a, b)] = len(self.col) + len(self.pairs)
        self.z = len(self.col) + len(self.pairs)

    def t(self, key: tuple[int, Kind, int]) -> float:
        r, k, _ = key
        return {Kind.F: self.c.forward, Kind.I: self.c.backward_input, Kind.W: self.c.backward_weight}[k][r]

    def build(self, h, highspy) -> None:
        inf = highspy.kHighsInf
        add_columns(h, highspy, self, self.t)
        rows: list[tuple[dict[int, float], float, float]] = []

        def after(b: int, a: int, gap: float) -> None:  # E_b - E_a >= gap
            rows.append(({b: 1.0, a: -1.0}, gap, inf))

        p, m, c, col = self.p, self.m, self.c, self.col
        for r in range(p):
            for j in range(m):
                f, i, w = col[(r, Kind.F, j)], col[(r, Kind.I, j)], col[(r, Kind.W, j)]
                after(i, f, c.backward_input[r])
                after(w, i, c.backward_weight[r])
                if j:
                    for k in KINDS:
                        after(col[(r, k, j)], col[(r, k, j - 1)], self.t((r, k, j)))
                if r:
                    after(f, col[(r - 1, Kind.F, j)], c.comm[r - 1] + c.forward[r])
                if r < p - 1:
                    after(i, col[(r + 1, Kind.I, j)], c.comm[r] + c.backward_input[r])
        big = self.horizon
        for (a, b), x in self.pairs.items():  # x = 1: a before b (E_b >= E_a + T_b), else b before a
            rows.append(({col[b]: 1.0, col[a]: -1.0, x: -big}, self.t(b) - big, inf))
            rows.append(({col[a]: 1.0, col[b]: -1.0, x: big}, self.t(a), inf))
        for r in range(p):
            mb, mw, limit = c.activation[r], c.weight_bytes(r), c.limit[r]
            if limit == float("inf"):
                continue
            for j in range(m):
                if (j + 1) * mb <= limit:
                    continue  # cannot bind: at most j + 1 stashes after F_j
                coef: dict[int, float] = {}
                for k in range(j):  # an I_k or W_k before F_j: pair (F_j, .) with x = 0
                    xi, xw = self.pairs[((r, Kind.F, j), (r, Kind.I, k))], self.pairs[((r, Kind.F, j), (r, Kind.W, k))]
                    coef[xi] = -(mw - mb)  # (1 - x)(mw - mb)
                    coef[xw] = mw  # (1 - x)(-mw)
                const = (j + 1) * mb + j * (mw - mb) - j * mw
                rows.append((coef, -inf, limit - const))
        for r in range(p):
            last = col[(r, Kind.W, m - 1)]
            if self.objective == "makespan":
                rows.append(({self.z: 1.0, last: -1.0}, 0.0, inf))
            else:
                first = col[(r, Kind.F, 0)]
                rows.append(({self.z: 1.0, last: -1.0, first: 1.0}, c.forward[r], inf))
        for coef, lo, hi in rows:
            h.addRow(lo, hi, len(coef), list(coef), list(coef.values()))

    def warm_start(self, h, highspy, programs: Programs) -> None:
        set_warm_start(h, highspy, self, programs, *end_times(self.p, programs, self.c))

    def programs(self, values: list[float]) -> Programs:
        """Each stage's actions by start time (then end, then the binaries' kinds order F, I, W)."""
        out = []
        for r in range(self.p):
            keys = [(r, k, j) for k in KINDS for j in range(self.m)]
            keys.sort(key=lambda key: (round(values[self.col[key]] - self.t(key), 9), round(values[self.col[key]], 9),
                                       KINDS.index(key[1]), key[2]))
            out.append(tuple(Action(r, k, j) for _, k, j in keys))
        return tuple(out)


def _quiet(make):
    """`make()` with the process's stdout closed: HiGHS's C++ constructor prints a banner there, which would
    corrupt `--format json` and CSV output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            return make()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
