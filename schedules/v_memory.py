"""Controllable-memory V schedules (after Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"):
`v-half` and `v-min` hold about 1/2 and 1/3 of 1F1B's activation memory.

V placement (rank r holds stages r and 2p-1-r) and split I/W as in ZB-V, with the same two
1F1B-like sequences per rank (down: chunk-0 F with chunk-1 I; up: chunk-1 F with chunk-0 I), but
fewer warm-up forwards and a lower cap on stashed chunk activations in the unit-time merge
(schedules.unit_time): 1F1B stashes p stages = 2p chunks on rank 0, v-half at most p chunks,
v-min at most ceil(2p/3). This is pipesim's construction under the paper's memory budgets, not the
paper's building blocks: the warm-up depths are the best of a few around cap/2 under unit costs
(each chunk action one unit), and every link keeps its send order equal to its receive order.
Their measured makespans and bubbles are in docs/schedule_library.md.
"""

from __future__ import annotations

from pipesim.deps import producers
from pipesim.errors import PipesimError
from pipesim.ir import Action, Schedule, v_placement
from schedules import register
from schedules.unit_time import merge_unit_time
from schedules.zero_bubble_v import one_f_one_b_sequence


def _unit_makespan(sched: Schedule) -> int:
    """Makespan with every compute action one unit (no communication): each action as soon as its rank and
    inputs allow, in program order."""
    end: dict[Action, int] = {}
    pos, free = [0] * sched.num_ranks, [0] * sched.num_ranks
    split = sched.split_pairs()
    moved = True
    while moved:
        moved = False
        for r, prog in enumerate(sched.programs):
            while pos[r] < len(prog):
                deps = producers(prog[pos[r]], sched, split)
                if any(d not in end for d in deps):
                    break
                end[prog[pos[r]]] = free[r] = max([free[r], *(end[d] for d in deps)]) + 1
                pos[r] += 1
                moved = True
    if any(pos[r] < len(prog) for r, prog in enumerate(sched.programs)):
        raise RuntimeError("v schedule order cannot finish")  # a bug, not user input
    return max(free, default=0)


def v_capped(name: str, p: int, m: int, cap: int) -> Schedule:
    """The V order stashing at most `cap` chunk activations per rank, warm-up depths tried around cap/2."""
    last = 2 * p - 1
    best: tuple[int, Schedule] | None = None
    half = max(1, cap // 2)
    for up_w, down_w in sorted({(w, x) for w in (half - 1, half, half + 1) for x in (w - 1, w, w + 1)
                                if 1 <= w and 1 <= x and w + x <= cap}):
        queues = [(one_f_one_b_sequence(last - r, r, up_w, m), one_f_one_b_sequence(r, last - r, down_w, m))
                  for r in range(p)]
        try:
            programs = merge_unit_time(queues, 2 * p, cap)
        except RuntimeError:  # these depths deadlock under the cap
            continue
        sched = Schedule(name, m, v_placement(p), programs)
        span = _unit_makespan(sched)
        if best is None or span < best[0]:
            best = (span, sched)
    if best is None:
        raise PipesimError(f"{name}: no order found for p={p}, m={m} under {cap} chunk activations")
    best[1].meta["virtual"] = 2
    best[1].meta["activation_cap_chunks"] = cap
    return best[1]


def _check_v(name: str, v: int) -> None:
    if v != 2:
        raise PipesimError(f"{name} needs exactly --virtual 2 chunks per rank (V placement), got {v}")


@register("v-half", "controllable-memory V: split I/W, half of 1F1B's activation memory (Qi et al. 2024)",
          virtual=True, default_virtual=2, order=52)
def v_half(p: int, m: int, v: int = 2) -> Schedule:
    _check_v("v-half", v)
    return v_capped("v-half", p, m, max(2, p))


@register("v-min", "controllable-memory V: split I/W, a third of 1F1B's activation memory (Qi et al. 2024)",
          virtual=True, default_virtual=2, order=53)
def v_min(p: int, m: int, v: int = 2) -> Schedule:
    _check_v("v-min", v)
    return v_capped("v-min", p, m, max(2, -(-2 * p // 3)))
