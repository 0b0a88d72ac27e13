"""Interleaved zero bubble (torch's ScheduleInterleavedZeroBubble; the ZB1P order of Qi et al. on
looped placement): interleaved 1F1B's order with the backward split into I and W.

Stage c*p + r lives on rank r. Rank r runs (v - 1) * g + p - 1 - r warm-up forwards (g =
microbatches per round), then F + I pairs, each followed (after r steady steps) by the oldest
pending W, then the remaining I's and W's: torch's `_get_1f1b_rank_ops(enable_zero_bubble=True)`,
action for action (its spacing dropped). Like torch, m must be a multiple of max(1, m // p)
rounds.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action, Kind, Schedule, loop_placement
from schedules import register


def interleaved_zb_program(rank: int, p: int, m: int, v: int) -> tuple[Action, ...]:
    """Rank `rank`'s order, as torch builds it."""
    rounds = max(1, m // p)
    per_round = m // rounds
    warmup = min((v - 1) * per_round + (p - 1 - rank), m * v)
    total = m * v

    def fwd_stage(step: int) -> int:
        return ((step // per_round) % v) * p + rank

    def bwd_stage(step: int) -> int:
        return (v - 1 - ((step - warmup) // per_round) % v) * p + rank

    counters: dict[tuple[int, Kind], int] = {}

    def take(stage: int, kind: Kind) -> Action:
        mb = counters.get((stage, kind), 0)
        counters[(stage, kind)] = mb + 1
        return Action(stage, kind, mb)

    prog: list[Action] = []
    backward_steps: list[int] = []  # steps whose I ran, in order: the W's follow them
    weights = 0

    def weight() -> None:
        nonlocal weights
        prog.append(take(bwd_stage(backward_steps[weights]), Kind.W))
        weights += 1

    for step in range(total + warmup):  # warm-up forwards, steady F + I (+ W), cool-down I (+ W)
        if step < warmup:
            prog.append(take(fwd_stage(step), Kind.F))
            continue
        if step < total:
            prog.append(take(fwd_stage(step), Kind.F))
        prog.append(take(bwd_stage(step), Kind.I))
        backward_steps.append(step)
        if step - warmup >= rank:  # W's trail their I's by `rank` steps
            weight()
    while weights < len(backward_steps):
        weight()
    return tuple(prog)


@register(
    "interleaved-zb",
    "interleaved 1F1B with split I/W, W's delayed by r steps (ZB1P on looped placement; torch)",
    virtual=True,
    default_virtual=2,
    order=55,
)
def interleaved_zb(p: int, m: int, v: int = 2) -> Schedule:
    if v < 2:
        raise PipesimError(f"interleaved-zb needs --virtual >= 2 chunks per rank, got {v} (use zb-h1)")
    rounds = max(1, m // p)
    if m % rounds:
        raise PipesimError(f"interleaved-zb needs microbatches to be a multiple of its {rounds} rounds "
                           f"(max(1, m // p)), got m={m}")
    programs = tuple(interleaved_zb_program(r, p, m, v) for r in range(p))
    sched = Schedule("interleaved-zb", m, loop_placement(p, v), programs)
    sched.meta["virtual"] = v
    return sched
