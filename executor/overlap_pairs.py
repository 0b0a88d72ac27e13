"""DualPipe's overlapped forward-and-backward pairs, run for real: one chunk's all-to-all hidden under the other's work.

The runtime (`executor.runtime`) turns each action of a rank's program into one closure. An OVERLAP_F_B pair
(DualPipeV, DualPipe, combined-1F1B: a forward and the backward right after it) is two actions that must run as
one: the forward chunk runs up to its first all-to-all and issues it with `async_op=True` (`Stage.forward_steps`
yields each exchange in flight), the paired backward runs whole, and only then does the forward wait for its
exchange and finish (`executor.experts.finish`). It is kept apart from the interpreter because it is the one
place where the one-action-one-op rule bends: the pair's op stands at the backward's index, the forward's index
runs nothing (`ran_with_its_pair`), and the op returns both actions' intervals itself (the forward's bar ends at
the issue, the backward's carries the forward's tail). `--no-a2a-overlap` leaves the ops alone, so the same
order runs back to back (bench/bench_moe_overlap.py's baseline).

What a pair needs of the runtime is `PairHost` (a Protocol, so this module does not import the runtime).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from time import perf_counter_ns
from typing import Protocol

import torch

from executor.experts import finish
from executor.stage import Stage
from pipesim.ir.schedule import Action, Schedule

Interval = tuple[int, int, int, int]  # (step, action index, start ns, end ns)


class PairHost(Protocol):
    """The runtime's state an overlapped pair reads and writes."""

    program: tuple[Action, ...]
    schedule: Schedule
    ops: list[Callable]
    stages: dict[int, Stage]
    acts: dict[tuple[int, int], torch.Tensor]
    x_mb: tuple[torch.Tensor, ...]
    y_mb: tuple[torch.Tensor, ...]
    step_index: int

    def passes(self, stage: int) -> bool: ...

    def local(self, stage: int) -> bool: ...

    def deliver(self, y: torch.Tensor, s: int, mb: int, last: bool, next_local: bool) -> None: ...


def install_pairs(rt: PairHost) -> None:
    """Each OVERLAP_F_B pair (adjacent: F then B) runs as one op at the B's index, the F's index doing nothing."""
    prog = rt.program
    for idx in range(len(prog) - 1):
        f, b = prog[idx], prog[idx + 1]
        if (f, b) not in rt.schedule.overlaps or rt.passes(f.stage):
            continue
        s, mb = f.stage, f.microbatch
        first, last = rt.schedule.chain_first(s), rt.schedule.chain_last(s)
        next_local = not last and rt.local(s + 1)
        rt.ops[idx + 1] = partial(run_pair, rt, s, mb, first, last, next_local, rt.ops[idx + 1], idx, idx + 1)
        rt.ops[idx] = ran_with_its_pair


def run_pair(rt: PairHost, s: int, mb: int, first: bool, last: bool, next_local: bool, backward: Callable,
             f_idx: int, b_idx: int) -> Sequence[Interval]:
    """F of (s, mb) up to its first all-to-all, issued async; the paired B whole; then F waits and finishes.

    Returns the two actions' intervals: F's up to the issue, B's from there to the end (the forward's tail runs
    after the backward, inside B's bar; the plots draw a pair as one bar)."""
    t0 = perf_counter_ns()
    x = rt.x_mb[mb] if first else rt.acts.pop((s, mb))
    steps = rt.stages[s].forward_steps(mb, x, rt.y_mb[mb] if last else None)
    try:
        pending = next(steps)
    except StopIteration as stop:  # no exchange in this chunk: nothing to overlap
        t1 = perf_counter_ns()
        rt.deliver(stop.value, s, mb, last, next_local)
        backward()
        return [(rt.step_index, f_idx, t0, t1), (rt.step_index, b_idx, t1, perf_counter_ns())]
    t1 = perf_counter_ns()
    backward()  # the other chunk's backward, while the forward's dispatch is in flight
    rt.deliver(finish(pending, steps), s, mb, last, next_local)
    return [(rt.step_index, f_idx, t0, t1), (rt.step_index, b_idx, t1, perf_counter_ns())]


def ran_with_its_pair() -> list:
    """The F of an overlapped pair: it runs inside its B's op (`run_pair`), which records both."""
    return []


__all__ = ["PairHost", "install_pairs", "ran_with_its_pair", "run_pair"]
