"""ZB-H2 (Qi et al., ICLR 2024): split I/W with about twice 1F1B's activation memory.

Extra warm-up forwards fill the start-up bubble and deferred W's fill the drain, so each rank is
busy from its first forward to the end. Built by the unit-time merge of schedules.unit_time on one
stage per rank: input grads first, then forwards while fewer than 2p microbatches are stashed,
W's in the gaps (1F1B stashes at most p). With t_W <= t_I <= 2 t_W the contention-free makespan is
m(t_F + t_I + t_W) + (p - 1) t_F + max(0, (p - 1) t_I - (m - 1) t_W): the last rank cannot start
before (p - 1) t_F, and for m >= 2p - 1 (or t_I = t_W, m >= p) nothing else is lost. ZB-H1 loses
(p - 1)(t_I - t_W) more, so H2 wins whenever t_W < t_I and m is large enough.
"""

from __future__ import annotations

from pipesim.ir.schedule import Action, Kind, Schedule, loop_placement
from schedules import register
from schedules.unit_time import merge_unit_time


@register("zb-h2", "zero bubble H2: split I/W, extra warm-up forwards, 2x 1F1B memory", order=45)
def zb_h2(p: int, m: int, v: int = 1) -> Schedule:
    queues = [
        ([Action(r, Kind.I, mb) for mb in range(m)], [Action(r, Kind.F, mb) for mb in range(m)]) for r in range(p)
    ]
    return Schedule("zb-h2", m, loop_placement(p, 1), merge_unit_time(queues, p, cap=2 * p))
