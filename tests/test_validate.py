"""Validation: named causes for malformed schedules and deadlocks; mutants never crash it."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import schedules
from pipesim.errors import PipesimError, ScheduleError
from pipesim.ir import torch_csv
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Action, Kind, Schedule
from pipesim.ir.schedule_check import fifo_mismatches, validate


def rows(*lines: str) -> Schedule:
    return torch_csv.loads("\n".join(lines) + "\n", "test.csv")


def test_deadlock_names_ranks_actions_and_cycle():
    # rank 1 posts its receive for mb 1 ahead of mb 0's backward
    sched = rows(
        "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1",
        "1RECV_F0,1F0,1B0,1RECV_F1,1F1,1SEND_B0,1B1,1SEND_B1",
    )
    validate(sched)  # valid: SEND_B0 is late but nothing waits in a cycle
    bad = rows(
        "0F0,0SEND_F0,0RECV_B0,0F1,0SEND_F1,0B0,0RECV_B1,0B1",
        "1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,1SEND_B1",
    )
    with pytest.raises(ScheduleError) as err:
        validate(bad)
    assert str(err.value) == (
        "deadlock: rank 0 blocks on RECV_B(stage 0, mb 0) from rank 1, "
        "which blocks on RECV_F(stage 1, mb 1) from rank 0"
    )
    assert "[0RECV_B0]" in err.value.grid and "[1RECV_F1]" in err.value.grid
    assert err.value.grid.splitlines()[0].startswith("step")


def test_backward_before_forward_on_one_rank():
    sched = Schedule("x", 1, (0,), ((Action(0, Kind.B, 0), Action(0, Kind.F, 0)),))
    with pytest.raises(ScheduleError, match=r"rank 0 runs F\(stage 0, mb 0\) after B\(stage 0, mb 0\)"):
        validate(sched)


@pytest.mark.parametrize(
    "lines, message",
    [
        (["0F0,0B0,0F0"], r"F\(stage 0, mb 0\) appears 2 times"),
        (["0F0,0F1,0B0"], r"B\(stage 0, mb 1\) is missing"),
        (["0F0,0I0,0W0,0B0"], "both a full backward B and a split I/W"),
        (["0F0,0SEND_F0,0RECV_B0,0B0", "1F0,1B0,1SEND_B0"], r"RECV_F\(stage 1, mb 0\) is missing on rank 1"),
        (
            ["0F0,0SEND_F0,0RECV_B0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0,1SEND_F0"],
            r"SEND_F\(stage 1, mb 0\) on rank 1 is not needed",
        ),
    ],
)
def test_malformed_named(lines, message):
    with pytest.raises(ScheduleError, match=message):
        validate(rows(*lines))


def test_fifo_mismatch_detected_for_out_of_order_receives():
    sched = rows(
        "0F0,0F1,0SEND_F0,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1",
        "1RECV_F1,1RECV_F0,1F0,1F1,1B0,1SEND_B0,1B1,1SEND_B1",
    )
    validate(sched)
    assert fifo_mismatches(sched) == [(0, 1)]


# --- mutation testing: every mutant is valid or rejected with a named cause -------------------


def mutate(sched: Schedule, data) -> Schedule:
    progs = [list(p) for p in sched.programs]
    op = data.draw(st.sampled_from(["drop", "duplicate", "move", "swap", "reorder_pair"]))
    r = data.draw(st.integers(0, len(progs) - 1))
    if not progs[r]:
        return sched
    i = data.draw(st.integers(0, len(progs[r]) - 1))
    if op == "drop":
        progs[r].pop(i)
    elif op == "duplicate":
        progs[r].insert(data.draw(st.integers(0, len(progs[r]))), progs[r][i])
    elif op == "move":
        a = progs[r].pop(i)
        r2 = data.draw(st.integers(0, len(progs) - 1))
        progs[r2].insert(data.draw(st.integers(0, len(progs[r2]))), a)
    elif op == "swap":
        j = data.draw(st.integers(0, len(progs[r]) - 1))
        progs[r][i], progs[r][j] = progs[r][j], progs[r][i]
    else:  # move a SEND/RECV to another position on its rank
        comms = [k for k, a in enumerate(progs[r]) if a.is_comm]
        if comms:
            a = progs[r].pop(data.draw(st.sampled_from(comms)))
            progs[r].insert(data.draw(st.integers(0, len(progs[r]))), a)
    return sched.with_programs(tuple(tuple(p) for p in progs))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(schedules.names()), st.integers(1, 4), st.integers(1, 6), st.booleans(), st.data())
def test_mutants_are_valid_or_named(name, p, m, lowered, data):
    spec = schedules.spec(name)
    if spec.virtual:
        m = p * m
    try:
        sched = schedules.build(name, p, m)
    except PipesimError:  # sizes a schedule does not admit (dualpipev needs m >= 2p)
        assume(False)
    sched = add_p2p(sched) if lowered else sched
    for _ in range(data.draw(st.integers(1, 3))):
        sched = mutate(sched, data)
    try:
        validate(sched)
    except ScheduleError as err:
        message = str(err)
        assert message and "\n" not in message
        assert any(word in message for word in ("rank", "stage", "mb", "deadlock", "microbatches"))


def test_weight_grad_without_input_grad():
    with pytest.raises(ScheduleError, match=r"W\(stage 0, mb 0\) has no matching I\(stage 0, mb 0\)"):
        validate(rows("0F0,0B0,0W0"))
