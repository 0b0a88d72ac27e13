"""A Timeline straight from a schedule's contention-free critical path (no simulator needed).

Handy for `pipesim schedule --plot`-style pictures and for tests of the plots: every action
starts when its inputs and its rank's previous action are done.
"""

from __future__ import annotations

from collections.abc import Callable

from pipesim.ir.graph import critical_path
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Action, Schedule
from pipesim.timeline import Event, Timeline


def _stream(action: Action) -> str:
    if action.is_compute:
        return "compute"
    return "send" if action.kind.value.startswith("SEND") else "recv"


def unit_timeline(schedule: Schedule, duration: Callable[[Action], float], *,
                  transfer_bytes: Callable[[Action], int] | None = None, source: str = "simulated") -> Timeline:
    """Events of the lowered schedule timed by `critical_path(schedule, duration)` (seconds)."""
    lowered = add_p2p(schedule)
    cp = critical_path(lowered, duration)
    events = []
    for rank, program in enumerate(lowered.programs):
        for action in program:
            peer_stage = action.peer_stage
            events.append(Event(
                rank=rank, stream=_stream(action), kind=action.kind.value, stage=action.stage,
                microbatch=action.microbatch, start=float(cp.start[action]), end=float(cp.end[action]),
                bytes=transfer_bytes(action) if transfer_bytes and action.is_comm else 0,
                peer=lowered.rank_of(peer_stage) if peer_stage is not None else -1,
            ))
    meta = {"p": schedule.num_ranks, "m": schedule.num_microbatches, "stages": schedule.num_stages,
            "timing": "critical path", **({"overlaps": schedule.overlap_labels()} if schedule.overlaps else {})}
    return Timeline(source, schedule.name, schedule.num_ranks, events, meta)
