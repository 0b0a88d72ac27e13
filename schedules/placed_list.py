"""A list scheduler over any placement (v chunks per rank): the Zero Bubble paper's heuristic rules (section
3.1: I as early as possible, F's while memory admits them, W's filling the gaps or freeing memory) applied
to every stage of a rank, so the V search has a start under limits no handcrafted V order keeps.

Each rank, when free, runs: a ready I (the earliest ready, the later stage on ties: it is on the critical
path); else a ready F whose stash fits under the rank's cap with room left for the microbatch's later
stages on the same rank (so a rank never fills with chunk-0 forwards and strands the chunk-1 forward that
would let them drain), the later stage first; else the oldest pending W when the cap forces it, when
nothing else is left, or when the next input cannot arrive before the W would end (always, with
`eager_w`); else it waits for the next arrival. Several caps (k times the rank's one-microbatch
stash, k = 2, 3 and the powers of two to 2p, from V-Min's (p+4)//3 up, then the limit) and both W rules
are tried and the shortest order kept. Deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipesim.ir.schedule import Action, Kind
from schedules.placed_graph import Key, Programs, delta, deps, placed_measure, seconds_of
from schedules.zb_inputs import AutoCosts


class Stuck(Exception):
    """A setting left a rank with nothing it may run and nothing to wait for."""


def list_orders(placement: Sequence[int], m: int, costs: AutoCosts) -> Programs | None:
    """The shortest order over the settings (None when every setting strands a rank)."""
    p = max(placement) + 1
    per_rank = [sum(costs.activation[s] for s in range(len(placement)) if placement[s] == r) for r in range(p)]
    best, caps = None, []
    shallowest = (p + 4) // 3  # V-Min's microbatches (Qi et al. 2024): shallower caps mostly wait, and cost time
    depths = sorted({2, 3, *(2 ** i for i in range(2, (2 * p).bit_length() + 1))})
    for k in [k for k in depths if k >= shallowest] + [None]:
        cap = tuple(costs.limit[r] if k is None else min(costs.limit[r], k * per_rank[r]) for r in range(p))
        if cap not in caps:
            caps.append(cap)
    for eager in (False, True):
        for cap in caps:
            try:
                programs = _run(placement, m, costs, cap, eager)
            except Stuck:
                continue
            value = placed_measure(placement, programs, costs)
            if best is None or value < best[0]:
                best = (value, programs)
    return None if best is None else best[1]


def _run(placement: Sequence[int], m: int, costs: AutoCosts, cap: tuple[float, ...], eager_w: bool) -> Programs:
    stages, p = len(placement), max(placement) + 1
    mine = [[s for s in range(stages) if placement[s] == r] for r in range(p)]
    later = {s: sum(costs.activation[q] for q in mine[placement[s]] if q > s) for s in range(stages)}
    end: dict[Key, float] = {}
    nxt = {(s, k): 0 for s in range(stages) for k in (Kind.F, Kind.I, Kind.W)}
    held, free = [0.0] * p, [0.0] * p
    programs: list[list[Action]] = [[] for _ in range(p)]
    left = [3 * m * len(mine[r]) for r in range(p)]
    # the ranks whose actions feed rank r's (holding a stage next to one of r's): only they can bring it new inputs
    feeders = [sorted({placement[q] for s in mine[r] for q in (s - 1, s + 1) if 0 <= q < stages} - {r})
               for r in range(p)]

    def ready_at(key: Key) -> float | None:
        """When `key`'s inputs are in (None: not all placed yet)."""
        need = deps(costs, key)
        if any(d not in end for d, _ in need):
            return None
        return max([0.0, *(end[d] + c for d, c in need)])

    def nexts(r: int, kind: Kind) -> list[tuple[float, int, Key]]:
        out = []
        for s in mine[r]:
            j = nxt[(s, kind)]
            if j < m and (kind != Kind.W or j < nxt[(s, Kind.I)]):
                key = (s, kind, j)
                at = ready_at(key)
                if at is not None:
                    out.append((at, -s, key))
        return sorted(out)

    waited = [False] * p  # waited at its free time for another rank free as early

    def put(r: int, key: Key, t: float) -> None:
        waited[:] = [False] * p
        end[key] = free[r] = t + seconds_of(costs, key)
        held[r] += delta(costs, key)
        nxt[(key[0], key[1])] += 1
        left[r] -= 1
        programs[r].append(Action(*key))

    while any(left):
        r = min((q for q in range(p) if left[q]), key=lambda q: (free[q], waited[q], q))
        t = free[r]
        i_next, f_next = nexts(r, Kind.I), nexts(r, Kind.F)
        ins = [x for x in i_next if x[0] <= t]
        if ins:
            put(r, ins[0][2], t)
            continue
        room = [x for x in f_next if held[r] + delta(costs, x[2]) + later[x[2][0]] <= cap[r] * (1 + 1e-12)]
        fs = [x for x in room if x[0] <= t]
        if fs:
            put(r, sorted(fs, key=lambda x: (-x[2][0], x[0]))[0][2], t)
            continue
        ws = sorted(((end[(key[0], Kind.I, key[2])], key) for _, _, key in nexts(r, Kind.W)))
        arrivals = [x[0] for x in i_next + f_next if x[0] > t]  # inputs known to come
        pending_inputs = any(nxt[(s, k)] < m for s in mine[r] for k in (Kind.F, Kind.I))
        if ws:
            key = ws[0][1]
            fills = not arrivals or min(arrivals) >= t + seconds_of(costs, key)
            if eager_w or not room or fills or not pending_inputs:  # no room: the cap forces the W
                put(r, key, t)
                continue
        if any(q != r and left[q] and free[q] <= t and not waited[q] for q in range(p)):
            waited[r] = True  # let the others free as early move first
            continue
        idle = [q for q in range(p) if left[q] and free[q] <= t]  # r and every rank that waited for it at t
        moved = False
        for q in idle:
            events = [x[0] for x in nexts(q, Kind.I) + nexts(q, Kind.F) if x[0] > t]
            events += [free[o] for o in feeders[q] if left[o] and free[o] > t]
            if events:
                free[q], waited[q], moved = min(events), False, True
        if not moved:
            raise Stuck(f"rank {r} cannot progress at t={t}")
    return tuple(tuple(prog) for prog in programs)
