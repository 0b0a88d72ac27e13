"""1F1B (PipeDream-Flush): warmup forwards, then one forward / one backward, then cooldown.

Rank r runs min(p - r - 1, m) warmup forwards (Megatron, DeepSpeed), which caps the activations
it holds at min(p - r, m) microbatches instead of GPipe's m.
"""

from __future__ import annotations

from pipesim.ir.schedule import Action, Kind, Schedule, loop_placement
from schedules import register


def one_f_one_b_order(rank: int, p: int, m: int) -> list[tuple[Kind, int]]:
    """(kind, microbatch) order of rank `rank`; backward kind is B."""
    warmup = min(p - rank - 1, m)
    order = [(Kind.F, mb) for mb in range(warmup)]
    for i in range(m - warmup):
        order += [(Kind.F, warmup + i), (Kind.B, i)]
    order += [(Kind.B, mb) for mb in range(m - warmup, m)]
    return order


@register("1f1b", "one forward, one backward in steady state (PipeDream-Flush)", order=20)
def one_f_one_b(p: int, m: int, v: int = 1) -> Schedule:
    programs = tuple(
        tuple(Action(r, kind, mb) for kind, mb in one_f_one_b_order(r, p, m)) for r in range(p)
    )
    return Schedule("1f1b", m, loop_placement(p, 1), programs)
