"""Interleaved 1F1B (Narayanan et al., SC'21): v model chunks per rank, looped placement.

Stage c*p + r lives on rank r. Microbatches advance in groups of p through the chunks, which
divides the bubble by v at the cost of v times the P2P volume. Like Megatron, m must be a
multiple of p.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action, Kind, Schedule, loop_placement
from schedules import register


def virtual_action(k: int, p: int, v: int, rank: int, forward: bool) -> Action:
    """The k-th forward (or backward) of `rank` in Megatron's virtual-microbatch order."""
    chunk = (k % (p * v)) // p
    if not forward:
        chunk = v - 1 - chunk
    mb = (k // (p * v)) * p + k % p
    return Action(chunk * p + rank, Kind.F if forward else Kind.B, mb)


@register(
    "interleaved-1f1b",
    "v chunks per rank, looped placement; bubble divided by v (Megatron)",
    virtual=True,
    default_virtual=2,
    order=30,
)
def interleaved_1f1b(p: int, m: int, v: int = 2) -> Schedule:
    if v < 2:
        raise PipesimError(f"interleaved-1f1b needs --virtual >= 2 chunks per rank, got {v} (use 1f1b)")
    if m % p:
        raise PipesimError(
            f"interleaved-1f1b needs microbatches to be a multiple of stages: m={m} is not a multiple of p={p}"
        )
    total = m * v
    programs = []
    for r in range(p):
        warmup = total if m == p else min(total, (p - r - 1) * 2 + (v - 1) * p)
        prog = [virtual_action(k, p, v, r, True) for k in range(warmup)]
        for i in range(total - warmup):
            prog.append(virtual_action(warmup + i, p, v, r, True))
            prog.append(virtual_action(i, p, v, r, False))
        prog += [virtual_action(k, p, v, r, False) for k in range(total - warmup, total)]
        programs.append(tuple(prog))
    sched = Schedule("interleaved-1f1b", m, loop_placement(p, v), tuple(programs))
    sched.meta["virtual"] = v
    return sched
