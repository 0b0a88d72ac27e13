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
    check_interleaved("interleaved-1f1b", p, m, v, "(use 1f1b)")
    programs, _ = interleaved_programs(p, m, v)
    sched = Schedule("interleaved-1f1b", m, loop_placement(p, v), programs)
    sched.meta["virtual"] = v
    return sched


def check_interleaved(name: str, p: int, m: int, v: int, hint: str) -> None:
    """Megatron's conditions on an interleaved order: v >= 2 chunks per rank, m a multiple of p."""
    if v < 2:
        raise PipesimError(f"{name} needs --virtual >= 2 chunks per rank, got {v} {hint}")
    if m % p:
        raise PipesimError(f"{name} needs microbatches to be a multiple of stages: m={m} is not a multiple of p={p}")


def interleaved_programs(p: int, m: int, v: int, extra_warmup: int = 0) -> tuple[tuple, set[tuple[Action, Action]]]:
    """Every rank's program in Megatron's interleaved order, with `extra_warmup` more warmup forwards per rank
    (combined 1F1B's one), and the steady state's (forward, backward that follows it) pairs."""
    total = m * v
    programs, pairs = [], set()
    for r in range(p):
        warmup = total if m == p else min(total, (p - r - 1) * 2 + (v - 1) * p + extra_warmup)
        prog = [virtual_action(k, p, v, r, True) for k in range(warmup)]
        for i in range(total - warmup):
            fwd, bwd = virtual_action(warmup + i, p, v, r, True), virtual_action(i, p, v, r, False)
            prog += [fwd, bwd]
            pairs.add((fwd, bwd))
        prog += [virtual_action(k, p, v, r, False) for k in range(total - warmup, total)]
        programs.append(tuple(prog))
    return tuple(programs), pairs
