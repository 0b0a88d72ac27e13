"""Controllable-memory V schedules (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory",
arXiv:2405.15362): `v-half` and `v-min`, about 1/2 and 1/3 of 1F1B's activation memory.

The paper's construction: V placement (rank r holds stages r and 2p-1-r), split backward (I then W),
one microbatch's building block of four actions per rank (F of chunk 0, F of chunk 1, I of chunk 1,
I of chunk 0) at fixed time offsets, repeated every 6 unit slots (each rank's six unit actions per
microbatch), the W's put in the idle slots; then the warm-up and cool-down are squeezed: each action
outside the steady state moves to the earliest free slot its inputs allow that does not raise the
rank's peak memory. The block's lifespan fixes the peak memory; its offsets are the paper's (V-Min:
every hop one slot; V-Half: chunk-0 forwards and chunk-1 input grads two slots per hop), with the
padding the authors' repository adds when the offsets collide modulo 6 (p % 3 == 0 for V-Min, p even
for V-Half). The order is built for unit costs and used with any costs.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action, Kind, Schedule, v_placement
from schedules import register

PERIOD = 6  # slots per microbatch in the block's repetition: F, F, I, I, W, W of one rank
F0, F1, I1, I0, W = range(5)  # block action types: F chunk 0, F chunk 1, I chunk 1, I chunk 0, W (any chunk)

Slots = list[list[int]]  # [type][microbatch] -> time slot, one rank


def v_min_offsets(p: int) -> list[list[int]]:
    """Per rank: slots of F0, F1, I1, I0 of microbatch 0. Every hop of the V takes one slot."""
    pad = 2 if p % 3 == 0 else 0
    return [[r, 2 * p - 1 - r, 2 * p + pad + r, 4 * p + pad - 1 - r] for r in range(p)]


def v_half_offsets(p: int) -> list[list[int]]:
    """As v_min_offsets; chunk-0 forwards and chunk-1 input grads take two slots per hop, which
    lengthens the block's lifespan on every rank to about half of 1F1B's."""
    pad = 3 if p % 2 == 0 else 0
    return [[2 * r, 3 * p - 2 - r, 3 * p + pad + 2 * r - 1, 6 * p + pad - 2 - r] for r in range(p)]


def peak_memory(slots: Slots) -> int:
    """Peak chunk activations of one rank: +1 at each F, -1 at each W; without a W list, every idle
    slot runs a pending W."""
    at = {t: k for k, times in enumerate(slots) for t in times}
    explicit = len(slots) > W
    live = peak = pending = 0
    for t in range(max(at) + 1):
        kind = at.get(t)
        if kind in (F0, F1):
            live += 1
        elif kind in (I1, I0):
            pending += 1
        elif kind == W:
            live -= 1
        elif not explicit and pending:
            live, pending = live - 1, pending - 1
        peak = max(peak, live)
    return peak


def place_w(slots: Slots, split: bool) -> list[list[int]]:
    """The W slots, one list (in I order) or two (chunk 1's, then chunk 0's): each idle slot runs a
    pending W, chunk 1's first; the rest follow the last action."""
    at = {t: k for k, times in enumerate(slots[:W]) for t in times}
    pending, ws = [0, 0], [[], []]
    end = max(at)
    for t in range(end + 1):
        kind = at.get(t)
        if kind in (I1, I0):
            pending[kind - I1 if split else 0] += 1
        elif kind is None:
            for w in (0, 1):
                if pending[w]:
                    ws[w].append(t)
                    pending[w] -= 1
                    break
    for w in (0, 1):
        for _ in range(pending[w]):
            end += 1
            ws[w].append(end)
    return ws if split else ws[:1]


def _earliest(ranks: list[Slots], r: int, kind: int, mb: int) -> int:
    """First slot after every input of (rank r, kind, mb) and the same kind's previous microbatch."""
    p, done = len(ranks), -1
    if kind in (F0, I1) and r > 0:  # down the V: from rank r-1
        done = ranks[r - 1][kind][mb]
    if kind in (F1, I0) and r < p - 1:  # up the V: from rank r+1
        done = ranks[r + 1][kind][mb]
    if kind in (F1, I1, I0):  # the block's previous action on this rank (the V's turn at the ends)
        done = max(done, ranks[r][kind - 1][mb])
    if kind == W:
        done = max(done, sorted(ranks[r][I1] + ranks[r][I0])[mb])
    if mb > 0:
        done = max(done, ranks[r][kind][mb - 1])
    return done + 1


def _links_in_order(ranks: list[Slots], r: int, kind: int) -> bool:
    """Whether the links that (rank r, kind) receives on and sends on deliver in send order (what NCCL
    needs: pipesim posts each RECV right before its consumer)."""
    p = len(ranks)
    down = kind in (F0, I1)  # these travel rank r -> r+1; F1 and I0 travel r -> r-1
    into = {r, r + 1} if down else {r, r - 1}
    for dst in into:
        src = dst - 1 if down else dst + 1
        if not (0 <= src < p and 0 <= dst < p):
            continue
        kinds = (F0, I1) if down else (F1, I0)
        pairs = sorted((ranks[src][k][mb], ranks[dst][k][mb]) for k in kinds for mb in range(len(ranks[dst][k])))
        if any(a[1] > b[1] for a, b in zip(pairs, pairs[1:])):
            return False
    return True


def squeeze(ranks: list[Slots], m: int, warmup_too: bool) -> None:
    """Move each action before the steady state (when `warmup_too`) and after it to the earliest free
    slot its inputs allow that keeps its rank within the block's peak memory. The steady state runs
    from rank 0's first I of chunk 0 to rank 0's last F of chunk 0 and is kept."""
    cap = max(peak_memory(s) for s in ranks)
    nodes = sorted((t, r, k, mb) for r, s in enumerate(ranks) for k, times in enumerate(s)
                   for mb, t in enumerate(times))
    busy: list[set[int]] = [set() for _ in ranks]
    phase, fed = 0, False  # phase 0 warm-up, 1 steady state, 2 cool-down; fed: rank 0's last F0 passed
    for t, r, k, mb in nodes:
        if phase == 0 and k == I0 and r == 0:
            phase = 2 if fed else 1  # m too small for a steady state: cool-down from here
        fed = fed or (r == 0 and k == F0 and mb == m - 1)
        if phase == 1 and fed:
            phase = 2
        elif phase == 2 or (phase == 0 and warmup_too):
            for slot in range(_earliest(ranks, r, k, mb), t):
                if slot in busy[r]:
                    continue
                ranks[r][k][mb] = slot
                if peak_memory(ranks[r]) <= cap and (k == W or _links_in_order(ranks, r, k)):
                    break
            else:
                ranks[r][k][mb] = t
        busy[r].add(ranks[r][k][mb])


def block_slots(offsets: list[list[int]], m: int) -> list[Slots]:
    """The building block repeated every PERIOD slots, squeezed twice as the paper does: with the W's
    placed (warm-up and cool-down), then without them (cool-down); the W's are then placed per chunk."""
    ranks = [[[t + PERIOD * mb for mb in range(m)] for t in block] for block in offsets]
    ranks = [s + place_w(s, split=False) for s in ranks]
    squeeze(ranks, m, warmup_too=True)
    ranks = [s[:W] for s in ranks]
    squeeze(ranks, m, warmup_too=False)
    return [s + place_w(s, split=True) for s in ranks]


def v_block_schedule(name: str, p: int, m: int, offsets: list[list[int]]) -> Schedule:
    """Per-rank programs in slot order; W's as chunk 1's then chunk 0's lists, each in I order."""
    last = 2 * p - 1
    programs = []
    for r, s in enumerate(block_slots(offsets, m)):
        stage_kind = {F0: (r, Kind.F), F1: (last - r, Kind.F), I1: (last - r, Kind.I), I0: (r, Kind.I),
                      W: (last - r, Kind.W), W + 1: (r, Kind.W)}
        timed = sorted((t, k, mb) for k, times in enumerate(s) for mb, t in enumerate(times))
        programs.append(tuple(Action(*stage_kind[k], mb) for _, k, mb in timed))
    sched = Schedule(name, m, v_placement(p), tuple(programs))
    sched.meta["virtual"] = 2
    return sched


def _check_v(name: str, v: int) -> None:
    if v != 2:
        raise PipesimError(f"{name} needs exactly --virtual 2 chunks per rank (V placement), got {v}")


@register("v-half", "controllable-memory V: split I/W, half of 1F1B's activation memory (Qi et al. 2024)",
          virtual=True, default_virtual=2, order=52)
def v_half(p: int, m: int, v: int = 2) -> Schedule:
    _check_v("v-half", v)
    return v_block_schedule("v-half", p, m, v_half_offsets(p))


@register("v-min", "controllable-memory V: split I/W, a third of 1F1B's activation memory (Qi et al. 2024)",
          virtual=True, default_virtual=2, order=53)
def v_min(p: int, m: int, v: int = 2) -> Schedule:
    _check_v("v-min", v)
    return v_block_schedule("v-min", p, m, v_min_offsets(p))
