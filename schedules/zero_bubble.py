"""Zero-bubble schedules (Qi et al., ICLR 2024): backward split into input-grad I and weight-grad W.

ZB-H1 keeps 1F1B's activation memory and fills the cooldown bubble with deferred W's: rank r runs
the 1F1B warmup, then per microbatch k: F, I_k and W_(k-r), then the remaining W's.
"""

from __future__ import annotations

from pipesim.ir.schedule import Action, Kind, Schedule, loop_placement
from schedules import register


@register("zb-h1", "zero bubble H1: split I/W, W delayed by r microbatches, 1F1B memory", order=40)
def zb_h1(p: int, m: int, v: int = 1) -> Schedule:
    programs = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        prog = [Action(r, Kind.F, mb) for mb in range(warmup)]
        next_f, next_w = warmup, 0
        for k in range(m):
            if next_f < m:
                prog.append(Action(r, Kind.F, next_f))
                next_f += 1
            prog.append(Action(r, Kind.I, k))
            if k - r >= 0:
                prog.append(Action(r, Kind.W, k - r))
                next_w = k - r + 1
        prog += [Action(r, Kind.W, mb) for mb in range(next_w, m)]
        programs.append(tuple(prog))
    return Schedule("zb-h1", m, loop_placement(p, 1), tuple(programs))
