"""Linear-time deadlock check: run every rank's program under blocking-receive semantics.

Each rank advances while its next action's inputs are done (a RECV needs its SEND posted, a
compute needs its inputs, a SEND needs the tensor it sends). Ranks that cannot advance wait on
the one action they need and are woken when it completes, so the check is O(actions); only a
stuck schedule pays for building the task graph to name the cycle.
"""

from __future__ import annotations

from collections import deque

from pipesim.ir.deps import producers, transfer_actions
from pipesim.ir.schedule import Action, Kind, Schedule


def blocking_inputs(action: Action, schedule: Schedule, split: frozenset, rank_of: tuple[int, ...]) -> list[Action]:
    """Actions that must be done before `action` may run (besides its rank's program order)."""
    if action.kind in (Kind.RECV_F, Kind.RECV_B):
        return [action.matching()]
    if action.kind == Kind.SEND_F:
        return [Action(action.stage, Kind.F, action.microbatch)]
    if action.kind == Kind.SEND_B:
        kind = Kind.I if (action.stage, action.microbatch) in split else Kind.B
        return [Action(action.stage, kind, action.microbatch)]
    out = []
    for prod in producers(action, schedule, split):
        if rank_of[prod.stage] == rank_of[action.stage]:
            out.append(prod)
        else:
            out.append(transfer_actions(prod, action)[1])  # the RECV on this rank
    return out


def stalled_ranks(schedule: Schedule) -> dict[int, Action]:
    """Run the lowered `schedule`; return {rank: action it is stuck on} (empty when it completes)."""
    split = schedule.split_pairs()
    rank_of = schedule.placement
    present = {a for prog in schedule.programs for a in prog}
    done: set[Action] = set()
    waiting: dict[Action, list[int]] = {}
    pos = [0] * schedule.num_ranks
    ready = deque(range(schedule.num_ranks))
    while ready:
        rank = ready.popleft()
        prog = schedule.programs[rank]
        while pos[rank] < len(prog):
            action = prog[pos[rank]]
            needed = [a for a in blocking_inputs(action, schedule, split, rank_of) if a in present and a not in done]
            if needed:
                waiting.setdefault(needed[0], []).append(rank)
                break
            done.add(action)
            pos[rank] += 1
            ready.extend(waiting.pop(action, ()))
    return {r: prog[pos[r]] for r, prog in enumerate(schedule.programs) if pos[r] < len(prog)}


