"""The lecture's naive pipeline and GPipe: the baselines every other schedule is measured against."""

from __future__ import annotations

from pipesim.ir.schedule import Action, Kind, Schedule, actions_for, loop_placement
from schedules import register


@register("naive", "microbatches strictly one after another through all stages (no overlap)", order=0)
def naive(p: int, m: int, v: int = 1) -> Schedule:
    programs = tuple(
        tuple(a for mb in range(m) for a in (Action(r, Kind.F, mb), Action(r, Kind.B, mb)))
        for r in range(p)
    )
    return Schedule("naive", m, loop_placement(p, 1), programs)


@register("gpipe", "all forwards, then all backwards (Huang et al. 2019)", order=10)
def gpipe(p: int, m: int, v: int = 1) -> Schedule:
    programs = tuple(actions_for(r, Kind.F, range(m)) + actions_for(r, Kind.B, range(m)) for r in range(p))
    return Schedule("gpipe", m, loop_placement(p, 1), programs)
