"""Lowering: insert the point-to-point actions into a compute-only program.

A SEND goes right after the compute that produces the tensor (posted as an isend); the RECV
goes right before the compute that consumes it. Stages on the same rank exchange nothing. An
overlapped pair (torch's OVERLAP_F_B) is one action: both halves' RECVs go before it and both SENDs
after it, so the two halves stay adjacent.

The rules are deps.py's (and `needs_send`); `add_p2p` asks them once per (stage, compute kind) rather
than once per action (`stage_transfers`), which is what keeps lowering p=64, m=1024 cheap.
"""

from __future__ import annotations

from operator import itemgetter

from pipesim.ir.deps import consumer_stage, producers, transfer_actions
from pipesim.ir.gc_pause import no_gc
from pipesim.ir.schedule import COMPUTE, Action, Kind, Schedule

# (RECV kinds posted before a compute action, SEND kinds posted after it), all on the action's own stage and microbatch
Transfers = tuple[tuple[Kind, ...], tuple[Kind, ...]]

_PROBE_MICROBATCH = 0  # any microbatch gives the same answer (see stage_transfers)
_stage_of = itemgetter(0)
_new_action = tuple.__new__  # Action(stage, kind, mb) without the NamedTuple's Python-level __new__


def needs_send(action: Action, schedule: Schedule) -> Action | None:
    """The SEND that must follow compute `action` (its consumer lives on another rank), or None."""
    consumer = consumer_stage(action, schedule)
    if consumer is None or schedule.rank_of(consumer) == schedule.rank_of(action.stage):
        return None
    return Action(action.stage, Kind.SEND_F if action.kind == Kind.F else Kind.SEND_B, action.microbatch)


def stage_transfers(stage: int, schedule: Schedule, rank: int) -> dict[Kind, Transfers]:
    """For each compute kind run at `stage` by rank `rank`'s program: the RECVs before it and the SENDs after it.

    Asked of the per-action rules on one probe microbatch: they read the microbatch only to pick a producer's
    kind (I or B under split backward), never its stage or rank, and a transfer action keeps its compute's
    stage and microbatch, so the kinds found here hold for every microbatch of the stage.
    """
    out: dict[Kind, Transfers] = {}
    for kind in COMPUTE:
        probe = Action(stage, kind, _PROBE_MICROBATCH)
        recvs = [transfer_actions(prod, probe)[1] for prod in producers(probe, schedule, False)
                 if schedule.rank_of(prod.stage) != rank]
        send = needs_send(probe, schedule)
        sends = [] if send is None else [send]
        assert all(t.stage == stage and t.microbatch == _PROBE_MICROBATCH for t in recvs + sends), (stage, kind)
        out[kind] = (tuple(t.kind for t in recvs), tuple(t.kind for t in sends))
    return out


def add_p2p(schedule: Schedule) -> Schedule:
    """Return `schedule` with SEND/RECV actions; a schedule that has them is returned unchanged."""
    if schedule.has_comms:
        return schedule
    programs = []
    with no_gc():  # two new actions per compute at most: 260k tuples at GPipe p=64, m=1024
        for rank, prog in enumerate(schedule.programs):
            table = {s: stage_transfers(s, schedule, rank) for s in set(map(_stage_of, prog))}
            lowered = _lower_overlapped(prog, table, schedule.overlaps) if schedule.overlaps else _lower(prog, table)
            programs.append(tuple(lowered))
    return schedule.with_programs(tuple(programs))


def _lower(prog: tuple[Action, ...], table: dict[int, dict[Kind, Transfers]]) -> list[Action]:
    """One rank's program with each action's RECVs before it and SENDs after it (no overlapped pairs)."""
    out: list[Action] = []
    append, new = out.append, _new_action
    for action in prog:
        stage, kind, mb = action
        recvs, sends = table[stage][kind]
        for recv in recvs:
            append(new(Action, (stage, recv, mb)))
        append(action)
        for send in sends:
            append(new(Action, (stage, send, mb)))
    return out


def _lower_overlapped(prog: tuple[Action, ...], table: dict[int, dict[Kind, Transfers]],
                      pairs: frozenset[tuple[Action, Action]]) -> list[Action]:
    """`_lower` for a program with overlapped pairs: a pair's RECVs all go before it and its SENDs all after it."""
    out: list[Action] = []
    i = 0
    while i < len(prog):
        group = prog[i:i + 2] if i + 1 < len(prog) and (prog[i], prog[i + 1]) in pairs else prog[i:i + 1]
        for stage, kind, mb in group:
            out.extend(Action(stage, recv, mb) for recv in table[stage][kind][0])
        out.extend(group)
        for stage, kind, mb in group:
            out.extend(Action(stage, send, mb) for send in table[stage][kind][1])
        i += len(group)
    return out
