"""Looped BFS (breadth-first pipeline parallelism, Lamy-Poirier 2022; torch's ScheduleLoopedBFS).

Looped placement like interleaved 1F1B (stage c*p + r on rank r), but each rank runs every
microbatch through one chunk before moving to the next: all forwards chunk by chunk, then all
backwards with chunks and microbatches reversed. The bubble equals interleaved 1F1B's,
(p - 1) chunk steps, while every rank holds all v*m chunk activations at the end of the forwards
(GPipe-like memory), which is what the order buys: long same-chunk runs that overlap
data-parallel gradient reduction chunk by chunk.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action, Kind, Schedule, loop_placement
from schedules import register


def looped_bfs_program(rank: int, p: int, m: int, v: int) -> tuple[Action, ...]:
    """Rank `rank`'s order: chunks ascending with microbatches ascending, then both descending."""
    stages = [chunk * p + rank for chunk in range(v)]
    forwards = [Action(s, Kind.F, mb) for s in stages for mb in range(m)]
    backwards = [Action(s, Kind.B, mb) for s in reversed(stages) for mb in reversed(range(m))]
    return tuple(forwards + backwards)


@register(
    "looped-bfs",
    "v chunks per rank, looped placement; each chunk runs all microbatches (breadth-first)",
    virtual=True,
    default_virtual=2,
    order=35,
)
def looped_bfs(p: int, m: int, v: int = 2) -> Schedule:
    if v < 2:
        raise PipesimError(f"looped-bfs needs --virtual >= 2 chunks per rank, got {v} (use gpipe)")
    programs = tuple(looped_bfs_program(r, p, m, v) for r in range(p))
    sched = Schedule("looped-bfs", m, loop_placement(p, v), programs)
    sched.meta["virtual"] = v
    return sched
