"""ZB-auto: the Zero Bubble paper's automatic scheduler (Qi et al., ICLR 2024, section 3.1), a heuristic.

Given each stage's F, I and W seconds, the P2P time across each boundary and a per-rank memory
limit, it list-schedules one stage per rank in time order, each rank choosing at every free
moment: a ready I (it is on the critical path); else a ready F if the activations it would stash
fit under the limit (warm-up fills with as many F's as memory allows); else a pending W if the limit
forces it (W frees the stash) or if the next input cannot arrive before the W would end (W fills
a gap without delaying anything); else it waits for the next arrival. The result is an ordinary
Schedule (the order is kept; any costs may time it later). F's and I's keep microbatch order, so
every link's send order equals its receive order.

`zb-auto` here times it with unit costs and 1F1B's memory (p microbatches per rank); `zb-2p` is
the paper's ZB-2p, the same with twice that. `pipesim.cost.zb_auto_costs` builds it from a cost table.
"""

from __future__ import annotations

from itertools import product

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action, Kind, Schedule, loop_placement
from schedules import register
from schedules.zb_heuristic import NoFit, end_times, paper_heuristic
from schedules.zb_inputs import AutoCosts
from schedules.zero_bubble import zb_h1


class _Stuck(Exception):
    """The list scheduler left a rank with nothing it may run and nothing to wait for."""


def zb_auto_programs(p: int, m: int, costs: AutoCosts) -> tuple[tuple[Action, ...], ...]:
    """Per-rank orders from the heuristic (one stage per rank, stage r on rank r).

    As in the paper, the heuristic runs with several settings and the shortest result is kept: here
    the warm-up depth, rank r stashing at most p - r + extra microbatches (extra = 0 is 1F1B's depth;
    no cap last), always under the memory limit, then ZB-H1's order, then the same depths with an
    eager W (a pending W whenever no F or I is ready, instead of only where it ends before the next
    input: better when W is long, as on a GPT's first stage, whose I is empty), then the paper's own
    heuristic as written (schedules.zb_heuristic, its grid of three hyperparameters); ties keep the earlier.
    """
    for r in range(p):
        if costs.limit[r] < costs.activation[r]:
            raise PipesimError(f"--memory-limit {costs.limit[r]:g} B on rank {r} is below one microbatch's "
                               f"activations ({costs.activation[r]:g} B): nothing can run")
    extras = sorted({0, 1, 2, *(2 ** k for k in range(2, (2 * p).bit_length() + 1))}) + [None]
    h1 = zb_h1(p, m).programs  # ZB-H1's hand-written order stashes min(p, m) microbatches per rank: a candidate too
    h1_fits = all(min(p, m) * costs.activation[r] <= costs.limit[r] for r in range(p))
    settings = [*product(("gap",), extras), ("h1", None), *product(("eager",), extras), ("paper", None)]
    best = None
    for rule, extra in settings:  # (W rule, depth)
        if rule == "h1":
            candidate = (_time_fixed(p, m, costs, h1), h1) if h1_fits else None
        elif rule == "paper":  # the paper's own heuristic (its grid of three hyperparameters), last: ties keep ours
            try:
                order = paper_heuristic(p, m, costs)[1]
                candidate = (_time_fixed(p, m, costs, order), order)
            except NoFit:
                candidate = None
        else:
            depth = tuple(costs.limit[r] if extra is None else
                          min(costs.limit[r], (p - r + extra) * costs.activation[r]) for r in range(p))
            try:
                candidate = _list_schedule(p, m, costs, depth, eager_w=rule == "eager")
            except _Stuck:  # this setting strands a rank (seen at m = 1); the others, or ZB-H1's order, remain
                candidate = None
        if candidate is not None and (best is None or candidate[0] < best[0]):
            best = candidate
    if best is None:
        raise PipesimError(f"zb-auto found no order for p={p}, m={m} within the memory limit "
                           "(every warm-up depth strands a rank, and ZB-H1's order does not fit)")
    return best[1]


def _time_fixed(p: int, m: int, costs: AutoCosts, programs: tuple[tuple[Action, ...], ...]) -> float:
    """Makespan of fixed per-rank orders under the same timing rules (one stage per rank)."""
    return max(end_times(p, programs, costs)[2])


def _list_schedule(p: int, m: int, costs: AutoCosts, depth: tuple[float, ...], eager_w: bool = False
                   ) -> tuple[float, tuple[tuple[Action, ...], ...]]:
    """One run of the heuristic with per-rank stash caps `depth` (bytes): (makespan, programs).
    `eager_w`: a pending W runs whenever no F or I is ready (else only where it ends before the next input)."""
    f_end: list[list[float | None]] = [[None] * m for _ in range(p)]
    i_end: list[list[float | None]] = [[None] * m for _ in range(p)]
    next_f, next_i = [0] * p, [0] * p
    pending_w: list[list[int]] = [[] for _ in range(p)]
    held = [0.0] * p  # bytes stashed
    free = [0.0] * p  # seconds: when the rank is next free
    programs: list[list[Action]] = [[] for _ in range(p)]
    left = [3 * m] * p
    waited = [False] * p  # waited at its free time for another rank free at the same time

    def f_ready(r: int, j: int) -> float | None:
        if r == 0:
            return 0.0
        end = f_end[r - 1][j]
        return None if end is None else end + costs.comm[r - 1]

    def i_ready(r: int, j: int) -> float | None:
        own = f_end[r][j]
        if own is None:
            return None
        if r == p - 1:
            return own
        down = i_end[r + 1][j]
        return None if down is None else max(own, down + costs.comm[r])

    def earliest_input(r: int) -> float:
        """A lower bound on when rank r's next F or I can start (inf when it has none left)."""
        bounds = []
        if next_i[r] < m:
            known = i_ready(r, next_i[r])
            if known is not None:
                bounds.append(known)
            elif f_end[r][next_i[r]] is not None:  # waits on rank r + 1's I, not scheduled yet
                bounds.append(free[r + 1] + costs.backward_input[r + 1] + costs.comm[r])
        if next_f[r] < m and held[r] + costs.activation[r] <= depth[r]:
            known = f_ready(r, next_f[r])
            bounds.append(known if known is not None else free[r - 1] + costs.forward[r - 1] + costs.comm[r - 1])
        return min(bounds, default=float("inf"))

    while any(left):
        r = min((q for q in range(p) if left[q]), key=lambda q: (free[q], waited[q], q))
        t = free[r]
        j_i, j_f = next_i[r], next_f[r]
        ready_i = j_i < m and (ti := i_ready(r, j_i)) is not None and ti <= t
        fits = held[r] + costs.activation[r] <= depth[r]
        ready_f = j_f < m and fits and (tf := f_ready(r, j_f)) is not None and tf <= t
        if ready_i:
            programs[r].append(Action(r, Kind.I, j_i))
            i_end[r][j_i] = free[r] = t + costs.backward_input[r]
            next_i[r] += 1
            pending_w[r].append(j_i)
            held[r] += costs.weight_bytes(r) - costs.activation[r]  # I keeps only what W needs (M_W)
        elif ready_f:
            programs[r].append(Action(r, Kind.F, j_f))
            f_end[r][j_f] = free[r] = t + costs.forward[r]
            next_f[r] += 1
            held[r] += costs.activation[r]
        elif pending_w[r] and (not fits or eager_w or earliest_input(r) >= t + costs.backward_weight[r]
                               or (next_i[r] == m and next_f[r] == m)):
            j = pending_w[r].pop(0)
            programs[r].append(Action(r, Kind.W, j))
            free[r] = t + costs.backward_weight[r]
            held[r] -= costs.weight_bytes(r)
        else:  # wait for the next arrival, or for another rank to move
            if any(q != r and left[q] and free[q] == t and not waited[q] for q in range(p)):
                waited[r] = True  # let the others free now move first
                continue
            later = [x for x in (i_ready(r, j_i) if j_i < m else None, f_ready(r, j_f) if j_f < m and fits else None)
                     if x is not None and x > t]
            later += [free[q] for q in range(p) if q != r and left[q] and free[q] > t]
            if not later:
                raise _Stuck(f"zb-auto: rank {r} cannot progress at t={t}")
            free[r], waited[r] = min(later), False
            continue
        left[r] -= 1
        waited = [False] * p
    return max(free), tuple(tuple(prog) for prog in programs)


def zb_auto_schedule(p: int, m: int, costs: AutoCosts, name: str = "zb-auto") -> Schedule:
    sched = Schedule(name, m, loop_placement(p, 1), zb_auto_programs(p, m, costs))
    sched.meta["memory_limit_bytes"] = list(costs.limit)
    return sched


@register("zb-auto", "zero bubble automatic (heuristic) scheduler; unit costs, 1F1B's memory per rank", order=47)
def zb_auto(p: int, m: int, v: int = 1) -> Schedule:
    return zb_auto_schedule(p, m, AutoCosts.uniform(p, 1.0, 1.0, 1.0, limit_microbatches=p))


@register("zb-2p", "zero bubble ZB-2p: the automatic scheduler with 2x 1F1B's activation memory", order=46)
def zb_2p(p: int, m: int, v: int = 1) -> Schedule:
    return zb_auto_schedule(p, m, AutoCosts.uniform(p, 1.0, 1.0, 1.0, limit_microbatches=2 * p), "zb-2p")
