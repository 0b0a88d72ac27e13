"""Lowering: insert the point-to-point actions into a compute-only program.

A SEND goes right after the compute that produces the tensor (posted as an isend); the RECV
goes right before the compute that consumes it. Stages on the same rank exchange nothing. An
overlapped pair (torch's OVERLAP_F_B) is one action: both halves' RECVs go before it and both SENDs
after it, so the two halves stay adjacent.
"""

from __future__ import annotations

from pipesim.ir.deps import consumer_stage, producers, transfer_actions
from pipesim.ir.schedule import Action, Kind, Schedule


def needs_send(action: Action, schedule: Schedule) -> Action | None:
    """The SEND that must follow compute `action` (its consumer lives on another rank), or None."""
    consumer = consumer_stage(action, schedule)
    if consumer is None or schedule.rank_of(consumer) == schedule.rank_of(action.stage):
        return None
    return Action(action.stage, Kind.SEND_F if action.kind == Kind.F else Kind.SEND_B, action.microbatch)


def add_p2p(schedule: Schedule) -> Schedule:
    """Return `schedule` with SEND/RECV actions; a schedule that has them is returned unchanged."""
    if schedule.has_comms:
        return schedule
    split = schedule.split_pairs()
    pairs = schedule.overlaps
    programs = []
    for rank, prog in enumerate(schedule.programs):
        out: list[Action] = []
        i = 0
        while i < len(prog):
            group = prog[i:i + 2] if i + 1 < len(prog) and (prog[i], prog[i + 1]) in pairs else prog[i:i + 1]
            for action in group:
                for prod in producers(action, schedule, split):
                    if schedule.rank_of(prod.stage) != rank:
                        out.append(transfer_actions(prod, action)[1])
            out.extend(group)
            for action in group:
                send = needs_send(action, schedule)
                if send is not None:
                    out.append(send)
            i += len(group)
        programs.append(tuple(out))
    return schedule.with_programs(tuple(programs))
