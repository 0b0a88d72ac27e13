"""Data dependencies between actions: which compute produces what another consumes, and the rules
that follow from it (which message carries it, which backward piece frees a stash).

Every consumer (lowering, the task graph, the simulator, its results, the analysis) calls these;
none spells the rules again. Kept free of networkx so the executor's ranks (which only lower
programs) import nothing heavy.
"""

from __future__ import annotations

from collections.abc import Container

from pipesim.ir.schedule import BACKWARD_FIRST, Action, Kind, Schedule


def producers(action: Action, schedule: Schedule, split: bool | Container[tuple[int, int]]) -> list[Action]:
    """Compute actions whose outputs `action` (a compute action) consumes.

    `split` says which (stage, microbatch) run split backward (I + W): True for all, False for
    none, or the set from `Schedule.split_pairs()` (schedules such as DualPipeV mix both).
    """
    s, mb = action.stage, action.microbatch
    if action.kind == Kind.F:
        return [Action(s - 1, Kind.F, mb)] if not schedule.chain_first(s) else []
    if action.kind in (Kind.B, Kind.I):
        deps = [Action(s, Kind.F, mb)]
        if not schedule.chain_last(s):
            is_split = split if isinstance(split, bool) else (s + 1, mb) in split
            deps.append(Action(s + 1, Kind.I if is_split else Kind.B, mb))
        return deps
    if action.kind == Kind.W:
        return [Action(s, Kind.I, mb)]
    return []


def consumer_stage(action: Action, schedule: Schedule) -> int | None:
    """The other stage that consumes what compute `action` produces (the inverse of `producers`): F feeds
    stage + 1, the input-gradient piece (B or I) feeds stage - 1; None for the ends of a chain and for W."""
    s = action.stage
    if action.kind == Kind.F:
        return s + 1 if not schedule.chain_last(s) else None
    if action.kind in BACKWARD_FIRST:
        return s - 1 if not schedule.chain_first(s) else None
    return None


def releases_activations(kind: Kind) -> bool:
    """The backward piece after which a stage may drop a microbatch's stashed activations.

    With split backward the weight gradient still needs the stashed inputs, so W (not I) releases them.
    """
    return kind == Kind.B or kind == Kind.W


def produces_weight_grad(kind: Kind) -> bool:
    """The backward piece that finishes a weight gradient (after a stage's last one, DP can all-reduce)."""
    return kind == Kind.B or kind == Kind.W


def message_slot(stage: int, kind: Kind, microbatch: int, stride: int) -> int:
    """Number of the message a SEND posts or a RECV takes, the same on both ends.

    One slot per (receiving stage, direction, microbatch): (2 * receiving stage + 1 for a gradient)
    * stride + microbatch, where `stride` is at least the number of microbatches.
    """
    if kind == Kind.SEND_F:
        return 2 * (stage + 1) * stride + microbatch
    if kind == Kind.SEND_B:
        return (2 * (stage - 1) + 1) * stride + microbatch
    if kind == Kind.RECV_F:
        return 2 * stage * stride + microbatch
    if kind == Kind.RECV_B:
        return (2 * stage + 1) * stride + microbatch
    raise ValueError(f"{kind} is not a P2P kind")


def transfer_actions(producer: Action, consumer: Action) -> tuple[Action, Action]:
    """The SEND (on the producer's rank) and RECV (on the consumer's) that carry one tensor."""
    if consumer.kind == Kind.F:
        return Action(producer.stage, Kind.SEND_F, producer.microbatch), Action(
            consumer.stage, Kind.RECV_F, consumer.microbatch
        )
    return Action(producer.stage, Kind.SEND_B, producer.microbatch), Action(
        consumer.stage, Kind.RECV_B, consumer.microbatch
    )
