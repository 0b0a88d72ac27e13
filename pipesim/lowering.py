"""Lowering: insert the point-to-point actions into a compute-only program.

A SEND goes right after the compute that produces the tensor (posted as an isend); the RECV
goes right before the compute that consumes it. Stages on the same rank exchange nothing.
"""

from __future__ import annotations

from pipesim.deps import consumer_stage, producers, transfer_actions
from pipesim.ir import Action, Kind, Schedule


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
    programs = []
    for rank, prog in enumerate(schedule.programs):
        out: list[Action] = []
        for action in prog:
            for prod in producers(action, schedule, split):
                if schedule.rank_of(prod.stage) != rank:
                    out.append(transfer_actions(prod, action)[1])
            out.append(action)
            send = needs_send(action, schedule)
            if send is not None:
                out.append(send)
        programs.append(tuple(out))
    return schedule.with_programs(tuple(programs))
