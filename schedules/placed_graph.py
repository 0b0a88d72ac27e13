"""What the exact search over a placement (v chunks per rank) reasons about: the actions' dependency graph, the
timing of fixed per-rank orders, each rank's stash in bytes, and the bounds no order goes under.

Why a graph and not schedules.zb_ilp's enumeration: with several stages on a rank, the orders the
dependencies leave open are not only F_j against I_k / W_k of one stage but every pair of the rank's
actions with no path between them (F of chunk 0 against I of chunk 1, ...). The graph: F after the stage
above plus the hop, I after its F and the stage below plus the hop, W after its I; each stage's F's, I's
and W's in microbatch order (as the Zero Bubble paper keeps them). `costs` (schedules.zb_inputs.AutoCosts)
is read per stage for seconds and bytes, per boundary s -> s + 1 for hops (0 where both stages share a
rank) and per rank for the limit. Shared by schedules.placed_ilp (the ILP) and its tests' brute force.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipesim.ir.schedule import Action, Kind
from schedules.zb_inputs import AutoCosts

Programs = tuple[tuple[Action, ...], ...]
Key = tuple[int, Kind, int]  # (stage, F|I|W, microbatch)
KINDS = (Kind.F, Kind.I, Kind.W)


def seconds_of(costs: AutoCosts, key: Key) -> float:
    s, k, _ = key
    return {Kind.F: costs.forward, Kind.I: costs.backward_input, Kind.W: costs.backward_weight}[k][s]


def delta(costs: AutoCosts, key: Key) -> float:
    """Bytes an action adds to its rank's stash (appendix G: F +M_B, I M_W - M_B, W -M_W)."""
    s, k, _ = key
    mb, mw = costs.activation[s], costs.weight_bytes(s)
    return {Kind.F: mb, Kind.I: mw - mb, Kind.W: -mw}[k]


def deps(costs: AutoCosts, key: Key) -> list[tuple[Key, float]]:
    """The actions `key` waits for, with the seconds of the hop after each (F: the stage above; I: its F and the
    stage below; W: its I). `costs.comm[s]` is boundary s -> s + 1 (0 where both stages share a rank)."""
    s, k, j = key
    last = len(costs.forward) - 1
    if k == Kind.F:
        return [] if s == 0 else [((s - 1, Kind.F, j), costs.comm[s - 1])]
    if k == Kind.I:
        return [((s, Kind.F, j), 0.0)] + ([] if s == last else [((s + 1, Kind.I, j), costs.comm[s])])
    return [((s, Kind.I, j), 0.0)]


def placed_end_times(placement: Sequence[int], programs: Programs, costs: AutoCosts
                     ) -> tuple[dict[Key, float], list[float], list[float]]:
    """(end of every action, first start and last end per rank) of fixed per-rank orders, each action as
    early as its inputs and its rank allow (seconds); a full backward B is keyed and waited on as its I.
    ValueError if the orders deadlock."""
    p = len(programs)
    end: dict[Key, float] = {}
    pos, free = [0] * p, [0.0] * p
    first: list[float | None] = [None] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while pos[r] < len(programs[r]):
                a = programs[r][pos[r]]
                full = a.kind == Kind.B  # a full backward: waits and feeds the stage above as I does, then runs W too
                key = (a.stage, Kind.I if full else a.kind, a.microbatch)
                need = deps(costs, key)
                if any(d not in end for d, _ in need):
                    break
                start = max([free[r], *(end[d] + c for d, c in need)])
                first[r] = start if first[r] is None else first[r]
                seconds = seconds_of(costs, key) + (costs.backward_weight[a.stage] if full else 0.0)
                end[key] = free[r] = start + seconds
                pos[r] += 1
                moved = True
    if any(pos[r] < len(programs[r]) for r in range(p)):
        raise ValueError("the orders deadlock")
    return end, [f or 0.0 for f in first], free


def placed_measure(placement: Sequence[int], programs: Programs, costs: AutoCosts, objective: str = "makespan"
                   ) -> float:
    """Seconds: the last end of any rank (makespan), or the longest rank's first start to last end (span)."""
    _, first, last = placed_end_times(placement, programs, costs)
    return max(last) if objective == "makespan" else max(b - a for a, b in zip(first, last))


def peak_stash(placement: Sequence[int], programs: Programs, costs: AutoCosts) -> list[float]:
    """Bytes: each rank's largest stash along its order."""
    out = []
    for prog in programs:
        held = peak = 0.0
        for a in prog:
            held += delta(costs, (a.stage, a.kind, a.microbatch))
            peak = max(peak, held)
        out.append(peak)
    return out


def fits(placement: Sequence[int], programs: Programs, costs: AutoCosts) -> bool:
    return all(peak <= costs.limit[r] * (1 + 1e-12) for r, peak in enumerate(peak_stash(placement, programs, costs)))


class Graph:
    """Every action of m microbatches over the placement's stages, and which pairs the dependencies order."""

    def __init__(self, placement: Sequence[int], m: int, costs: AutoCosts) -> None:
        self.placement, self.m, self.c = tuple(placement), m, costs
        stages = len(self.placement)
        self.keys: list[Key] = [(s, k, j) for s in range(stages) for k in KINDS for j in range(m)]
        self.index = {key: n for n, key in enumerate(self.keys)}
        self.edges: list[tuple[Key, Key, float]] = []  # (a, b, gap): E_b - E_a >= gap
        for key in self.keys:
            s, k, j = key
            for d, hop in deps(costs, key):
                self.edges.append((d, key, hop + seconds_of(costs, key)))
            if j:
                self.edges.append(((s, k, j - 1), key, seconds_of(costs, key)))
        self.before = self._closure()  # index -> bitset of the actions that must end before it starts

    def _closure(self) -> list[int]:
        preds: dict[int, list[int]] = {n: [] for n in range(len(self.keys))}
        succs: dict[int, list[int]] = {n: [] for n in range(len(self.keys))}
        for a, b, _ in self.edges:
            preds[self.index[b]].append(self.index[a])
            succs[self.index[a]].append(self.index[b])
        indeg = {n: len(v) for n, v in preds.items()}
        ready = [n for n, d in indeg.items() if d == 0]
        reach = [0] * len(self.keys)
        self.rank_in_order = [0] * len(self.keys)  # position of each action in a topological order
        seen = 0
        while ready:
            n = ready.pop()
            self.rank_in_order[n], seen = seen, seen + 1
            for q in preds[n]:
                reach[n] |= reach[q] | (1 << q)
            for q in succs[n]:
                indeg[q] -= 1
                if not indeg[q]:
                    ready.append(q)
        return reach

    def ordered(self, a: Key, b: Key) -> bool:
        """Whether the dependencies alone put `a` before `b`."""
        return bool(self.before[self.index[b]] >> self.index[a] & 1)

    def on_rank(self, r: int) -> list[Key]:
        return [key for key in self.keys if self.placement[key[0]] == r]

    def open_pairs(self) -> list[tuple[Key, Key]]:
        out = []
        for r in range(max(self.placement) + 1):
            keys = self.on_rank(r)
            for n, a in enumerate(keys):
                for b in keys[n + 1:]:
                    if not self.ordered(a, b) and not self.ordered(b, a):
                        out.append((a, b))
        return out

    def critical_path(self) -> float:
        """Seconds of the longest dependency chain (a makespan bound that ignores the ranks)."""
        done = {key: seconds_of(self.c, key) for key in self.keys}
        for a, b, gap in sorted(self.edges, key=lambda e: self.rank_in_order[self.index[e[1]]]):
            done[b] = max(done[b], done[a] + gap)
        return max(done.values())


def placed_work_bound(graph: Graph, objective: str = "makespan") -> float:
    """Seconds no order goes under: each rank's own work (after, for the makespan, the earliest its first
    action can start), and for the makespan the critical path."""
    c, out = graph.c, 0.0
    for r in range(max(graph.placement) + 1):
        keys = graph.on_rank(r)
        work = sum(seconds_of(c, key) for key in keys)
        head = 0.0
        if objective == "makespan":
            top = min(key[0] for key in keys)
            head = sum(c.forward[s] + c.comm[s] for s in range(top))
        out = max(out, head + work)
    return max(out, graph.critical_path()) if objective == "makespan" else out


