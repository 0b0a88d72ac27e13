"""`add_p2p` (rules asked once per stage) equals the per-action lowering it replaced, for every schedule."""

from __future__ import annotations

import pytest

import schedules
from pipesim.errors import PipesimError
from pipesim.ir.deps import consumer_stage, producers, transfer_actions
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Action, Kind, Schedule, loop_placement, overlapped

SIZES = [(1, 1), (1, 4), (2, 2), (2, 5), (3, 6), (4, 4), (4, 8), (5, 10), (6, 12), (8, 16)]  # (ranks p, microbatches m)


def reference_send(action: Action, schedule: Schedule) -> Action | None:
    """The SEND after compute `action`, asked of the rules per action (the former `needs_send`)."""
    consumer = consumer_stage(action, schedule)
    if consumer is None or schedule.rank_of(consumer) == schedule.rank_of(action.stage):
        return None
    return Action(action.stage, Kind.SEND_F if action.kind == Kind.F else Kind.SEND_B, action.microbatch)


def reference_add_p2p(schedule: Schedule) -> Schedule:
    """The former lowering, verbatim: every action asks producers/consumer_stage/transfer_actions itself."""
    if any(a.is_comm for prog in schedule.programs for a in prog):
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
                send = reference_send(action, schedule)
                if send is not None:
                    out.append(send)
            i += len(group)
        programs.append(tuple(out))
    return schedule.with_programs(tuple(programs))


def built_sizes(name: str):
    """Schedule `name` at every size of SIZES (and v = 2, 3 when it takes --virtual) that it admits."""
    virtuals = (2, 3) if schedules.spec(name).virtual else (1,)
    for p, m in SIZES:
        for v in virtuals:
            try:
                yield schedules.build(name, p, m, v)
            except PipesimError:
                continue


def assert_same_lowering(sched: Schedule) -> None:
    fast, ref = add_p2p(sched), reference_add_p2p(sched)
    assert fast.programs == ref.programs, sched.name
    assert (fast.placement, fast.overlaps, fast.chains, fast.num_microbatches) == (
        ref.placement, ref.overlaps, ref.chains, ref.num_microbatches)


@pytest.mark.parametrize("name", schedules.names())
def test_add_p2p_equals_reference_for_every_schedule(name):
    built = list(built_sizes(name))
    assert built, f"{name} admitted none of the sizes"
    for sched in built:
        assert_same_lowering(sched)
        assert add_p2p(add_p2p(sched)).programs == add_p2p(sched).programs  # a lowered schedule is returned as is


def test_overlapped_pairs_and_chains_are_covered():
    """DualPipe(V) carry overlapped pairs and DualPipe two chains: the lowering's other path is exercised."""
    assert any(s.overlaps for s in built_sizes("dualpipev"))
    assert any(s.chains > 1 and s.overlaps for s in built_sizes("dualpipe"))


def test_misplaced_and_overlapped_hand_made_schedule():
    """Actions on a program other than their stage's rank, and a pair overlapped by hand, lower as before."""
    sched = schedules.build("1f1b", 3, 4)
    moved = list(map(list, sched.programs))
    moved[0].append(moved[1].pop())  # 1B3 now sits on rank 0's program: its RECVs are judged by rank 0
    odd = Schedule("odd", 4, loop_placement(3, 1), tuple(map(tuple, moved)))
    assert_same_lowering(odd)
    prog1 = sched.programs[1]
    pair = next((a, b) for a, b in zip(prog1, prog1[1:]) if a.kind == Kind.F and b.kind == Kind.B)
    assert_same_lowering(overlapped(sched, {pair}))
