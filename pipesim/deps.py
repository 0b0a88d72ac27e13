"""Data dependencies between actions: which compute produces what another consumes.

Kept free of networkx so the executor's ranks (which only lower programs) import nothing heavy.
"""

from __future__ import annotations

from collections.abc import Container

from pipesim.ir import Action, Kind, Schedule


def producers(action: Action, schedule: Schedule, split: bool | Container[tuple[int, int]]) -> list[Action]:
    """Compute actions whose outputs `action` (a compute action) consumes.

    `split` says which (stage, microbatch) run split backward (I + W): True for all, False for
    none, or the set from `Schedule.split_pairs()` (schedules such as DualPipeV mix both).
    """
    s, mb, last = action.stage, action.microbatch, schedule.num_stages - 1
    if action.kind == Kind.F:
        return [Action(s - 1, Kind.F, mb)] if s > 0 else []
    if action.kind in (Kind.B, Kind.I):
        deps = [Action(s, Kind.F, mb)]
        if s < last:
            is_split = split if isinstance(split, bool) else (s + 1, mb) in split
            deps.append(Action(s + 1, Kind.I if is_split else Kind.B, mb))
        return deps
    if action.kind == Kind.W:
        return [Action(s, Kind.I, mb)]
    return []


def transfer_actions(producer: Action, consumer: Action) -> tuple[Action, Action]:
    """The SEND (on the producer's rank) and RECV (on the consumer's) that carry one tensor."""
    if consumer.kind == Kind.F:
        return Action(producer.stage, Kind.SEND_F, producer.microbatch), Action(
            consumer.stage, Kind.RECV_F, consumer.microbatch
        )
    return Action(producer.stage, Kind.SEND_B, producer.microbatch), Action(
        consumer.stage, Kind.RECV_B, consumer.microbatch
    )
