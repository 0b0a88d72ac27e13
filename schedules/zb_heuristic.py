"""The Zero Bubble paper's heuristic as written (Qi et al., ICLR 2024, arXiv 2401.10241, section 3.1).

Its steps, one microbatch round at a time, one stage per rank:
- warm-up: as many F's as the memory limit admits before the first I arrives; a binary
  hyperparameter says whether one more F may overrun that arrival (a bubble under t_F before the first
  I) or must end before it; stage r then keeps strictly fewer warm-up F's than stage r - 1;
- steady state: each round one F per stage (stage r always at least one F ahead of r + 1; a second
  hyperparameter lets a stage two or more ahead skip its F when it would delay the next I), then the
  round's I from the last stage to the first; W's fill a gap before an input when they end in it; in a
  shorter gap a W runs when leaving the gap idle would grow the largest cumulative bubble of all
  stages (a third hyperparameter: whether it also runs when the gap would not); W's run first when the
  memory limit forces them;
- when F's and I's are used up, the remaining W's one by one.
The grid of the three hyperparameters is searched and the shortest result kept, by the paper's cost:
the longest stage's span (its first F's start to its last W's end; section 5.3), with t_comm a latency
between stages that occupies no rank. Memory (appendix G): F adds M_B, I adds M_W - M_B, W removes M_W.

This module is the paper's; `schedules.zb_auto` adds it to the settings zb-auto and zb-2p search.
"""

from __future__ import annotations

from itertools import product

from pipesim.ir.schedule import Action, Kind
from schedules.placed_graph import placed_end_times
from schedules.zb_inputs import AutoCosts

Programs = tuple[tuple[Action, ...], ...]


class NoFit(Exception):
    """The memory limit leaves a stage no F to run and no W to free memory with."""


def paper_heuristic(p: int, m: int, costs: AutoCosts) -> tuple[float, Programs]:
    """(span, programs): the best of the paper's hyperparameter grid, by the longest stage span (seconds)."""
    best = None
    for overrun, skip_f, greedy_w in product((True, False), repeat=3):
        try:
            run = _Run(p, m, costs, overrun=overrun, skip_f=skip_f, greedy_w=greedy_w).schedule()
        except NoFit:
            continue
        if best is None or run[0] < best[0]:
            best = run
    if best is None:
        raise NoFit(f"the paper's heuristic fits no order for p={p}, m={m} under the memory limit")
    return best


def end_times(p: int, programs: Programs, costs: AutoCosts
              ) -> tuple[dict[tuple[int, Kind, int], float], list[float], list[float]]:
    """(end of every action keyed (stage, F|I|W, microbatch), first start and last end per stage) of fixed
    per-rank orders, one stage per rank: schedules.placed_graph.placed_end_times on that placement (F waits for
    the stage above plus the hop, I or a full B, keyed as I, for the stage below plus the hop). ValueError if the
    orders deadlock."""
    return placed_end_times(range(p), programs, costs)


def stage_spans(p: int, programs: Programs, costs: AutoCosts) -> tuple[list[float], list[float]]:
    """(first start, last end) per stage of fixed per-rank orders (`end_times`)."""
    _, first, last = end_times(p, programs, costs)
    return first, last


def span(p: int, programs: Programs, costs: AutoCosts) -> float:
    """The paper's cost of a schedule (section 5.3): the longest stage's first start to last end, seconds."""
    first, last = stage_spans(p, programs, costs)
    return max(b - a for a, b in zip(first, last))


def _seconds(costs: AutoCosts, r: int, kind: Kind) -> float:
    if kind == Kind.B:
        return costs.backward_input[r] + costs.backward_weight[r]
    return {Kind.F: costs.forward, Kind.I: costs.backward_input, Kind.W: costs.backward_weight}[kind][r]


class _Run:
    """One run of the heuristic with one setting of the three hyperparameters."""

    def __init__(self, p: int, m: int, costs: AutoCosts, *, overrun: bool, skip_f: bool, greedy_w: bool) -> None:
        self.p, self.m, self.c = p, m, costs
        self.overrun, self.skip_f, self.greedy_w = overrun, skip_f, greedy_w
        self.count = {k: [0] * p for k in (Kind.F, Kind.I, Kind.W)}
        self.end: dict[tuple[int, Kind, int], float] = {}
        self.free = [0.0] * p  # seconds: when each stage's last placed action ends
        self.mem = [0.0] * p  # bytes held
        self.bubble = [0.0] * p  # seconds idle since the stage's first action
        self.worst = 0.0  # seconds: the largest of `bubble` (they only grow)
        self.first = [0.0] * p  # seconds: when each stage's first action starts
        self.programs: list[list[Action]] = [[] for _ in range(p)]

    def delta(self, r: int, kind: Kind) -> float:
        """Bytes an action adds on stage r (appendix G: F +M_B, I M_W - M_B, W -M_W)."""
        mb, mw = self.c.activation[r], self.c.weight_bytes(r)
        return {Kind.F: mb, Kind.I: mw - mb, Kind.W: -mw}[kind]

    def ready(self, r: int, kind: Kind) -> float:
        """When the input of stage r's next `kind` arrives (0 when it has none from another stage)."""
        j = self.count[kind][r]
        if kind == Kind.F and r > 0:
            return self.end[(r - 1, Kind.F, j)] + self.c.comm[r - 1]
        if kind == Kind.I and r < self.p - 1:
            return self.end[(r + 1, Kind.I, j)] + self.c.comm[r]
        return 0.0

    def put(self, r: int, kind: Kind) -> None:
        j = self.count[kind][r]
        start = max(self.free[r], self.ready(r, kind) if kind != Kind.W else 0.0)
        if not self.programs[r]:
            self.first[r] = start
        else:
            self.bubble[r] += start - self.free[r]
            self.worst = max(self.worst, self.bubble[r])
        self.end[(r, kind, j)] = self.free[r] = start + _seconds(self.c, r, kind)
        self.mem[r] += self.delta(r, kind)
        self.count[kind][r] += 1
        self.programs[r].append(Action(r, kind, j))

    def pending_w(self, r: int) -> bool:
        return self.count[Kind.W][r] < self.count[Kind.I][r]

    def fits(self, r: int, kind: Kind, extra: float = 0.0) -> bool:
        return self.mem[r] + extra + self.delta(r, kind) <= self.c.limit[r] * (1 + 1e-12)

    def make_room(self, r: int, kind: Kind) -> None:
        """W's until `kind` fits under the limit (NoFit when none is left to run)."""
        while not self.fits(r, kind):
            if not self.pending_w(r):
                raise NoFit(f"stage {r}: no W left to free memory for {kind.name}")
            self.put(r, Kind.W)

    def fill(self, r: int, arrival: float) -> None:
        """W's into the gap before `arrival`: every W that ends in it, then one more when the gap would
        grow the largest cumulative bubble (or always, with greedy_w)."""
        w = self.c.backward_weight[r]
        while self.pending_w(r) and self.free[r] + w <= arrival:
            self.put(r, Kind.W)
        if self.pending_w(r) and self.free[r] < arrival:
            if arrival - self.free[r] > self.worst - self.bubble[r] or self.greedy_w:
                self.put(r, Kind.W)

    def warm_up(self) -> None:
        """Round 0: one F per stage, the warm-up F's counted from the last stage up, then the first I's."""
        p, m, c = self.p, self.m, self.c
        for r in range(p):
            self.put(r, Kind.F)
        extra = [0] * p
        arrival = self.end[(p - 1, Kind.F, 0)] + c.backward_input[p - 1]  # when the last stage's first I ends
        for r in range(p - 2, -1, -1):
            mem, t = self.mem[r], self.free[r]
            limit_t = arrival + c.comm[r]  # the first I's input reaches stage r
            while self.count[Kind.F][r] + extra[r] < m and mem + self.delta(r, Kind.F) <= c.limit[r] * (1 + 1e-12):
                # overrun: F's until the input arrives, the last may end after it; else only F's that end before
                if t >= limit_t or (not self.overrun and t + c.forward[r] > limit_t):
                    break
                mem += self.delta(r, Kind.F)
                t += c.forward[r]
                extra[r] += 1
            arrival = max(t, limit_t) + c.backward_input[r]
        for r in range(1, p):  # stage r keeps fewer warm-up F's than stage r - 1
            while extra[r] > 0 and extra[r] >= extra[r - 1]:
                extra[r] -= 1
        for r in range(p):
            for _ in range(extra[r]):
                self.put(r, Kind.F)
        for r in range(p - 1, -1, -1):
            self.make_room(r, Kind.I)
            self.put(r, Kind.I)

    def wants_f(self, r: int) -> bool:
        """Whether stage r runs an F this round (before the stage below is considered)."""
        p, c, f = self.p, self.c, self.count[Kind.F]
        if f[r] >= self.m:
            return False
        if not (self.skip_f and r + 1 < p and f[r] >= f[r + 1] + 2):
            return True
        # the next I's input to stage r: stage r + 1 runs its F and its I, then the hop
        next_input = self.free[r + 1] + c.forward[r + 1] + c.backward_input[r + 1] + c.comm[r]
        if self.free[r] >= next_input:
            return False  # an F now would only delay the I
        w_needed, mem, w = 0.0, self.mem[r] + self.delta(r, Kind.F), self.count[Kind.W][r]
        while mem > c.limit[r] and w < self.count[Kind.I][r]:
            w_needed += c.backward_weight[r]
            mem -= c.weight_bytes(r)
            w += 1
        if self.free[r] + c.forward[r] + w_needed <= next_input:
            return True  # it fits before the I's input
        return next_input - self.free[r] > self.worst - self.bubble[r]  # skipping would grow the worst bubble

    def steady(self, i: int) -> None:
        """Round i: F's stage by stage from the first, then microbatch i's I from the last stage up."""
        p = self.p
        want = [self.wants_f(r) for r in range(p)]
        for r in range(p - 2, -1, -1):  # a stage runs its F only if the stage below runs one
            want[r] = want[r] and want[r + 1]
        for r in range(p):
            if want[r]:
                self.make_room(r, Kind.F)
                if r > 0:
                    self.fill(r, self.ready(r, Kind.F))
                self.put(r, Kind.F)
        for r in range(p - 1, -1, -1):
            self.make_room(r, Kind.I)
            if r + 1 < p:
                self.fill(r, self.ready(r, Kind.I))
            if r == 0 and self.count[Kind.F][0] == self.m:
                while self.pending_w(0):
                    self.put(0, Kind.W)
            self.put(r, Kind.I)

    def schedule(self) -> tuple[float, Programs]:
        self.warm_up()
        for i in range(1, self.m):
            self.steady(i)
        for r in range(self.p):
            while self.pending_w(r):
                self.put(r, Kind.W)
        programs = tuple(tuple(prog) for prog in self.programs)
        return max(b - a for a, b in zip(self.first, self.free)), programs  # each action as early as it can
