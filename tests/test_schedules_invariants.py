"""Exhaustive small-parameter checks of every registered schedule (p <= 8, m <= 16, v <= 3)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

import schedules
from pipesim.errors import PipesimError
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Kind
from pipesim.ir.schedule_check import fifo_mismatches, validate


def all_configs():
    for name in schedules.names():
        virtuals = [2, 3] if schedules.spec(name).virtual else [1]
        for p in range(1, 9):
            for m in range(1, 17):
                for v in virtuals:
                    yield name, p, m, v


def _comms(sched) -> Counter:
    return Counter(a for prog in sched.programs for a in prog if a.is_comm)


def _compute_only(sched):
    return replace(sched, programs=tuple(tuple(a for a in prog if not a.is_comm) for prog in sched.programs))


def build_or_none(name, p, m, v):
    try:
        return schedules.build(name, p, m, v)
    except PipesimError:
        return None


@pytest.mark.parametrize("name", schedules.names())
def test_every_schedule_valid_for_all_small_sizes(name):
    built = 0
    for n, p, m, v in all_configs():
        if n != name:
            continue
        sched = build_or_none(name, p, m, v)
        if sched is None:
            continue
        built += 1
        validate(sched)
        lowered = add_p2p(sched)
        validate(lowered)
        # torch's DualPipeV and (at p = 2) InterleavedZeroBubble orders assume torch's early RECVs; with
        # pipesim's RECV-before-consumer lowering a message can overtake another between two ranks (fine on
        # tagged gloo, rejected before an NCCL run)
        torch_like = name in ("dualpipev", "dualpipe") or (name == "interleaved-zb" and p == 2)
        assert fifo_mismatches(lowered) == [] or torch_like
        # DualPipe: two chains of p stages (two model copies), each microbatch on one of them
        assert sched.num_ranks == p and sched.model_stages == p * v and sched.num_microbatches == m
        assert sched.num_stages == p * v * sched.chains
        counts = Counter((a.kind, a.stage, a.microbatch) for prog in sched.programs for a in prog if not a.is_comm)
        split = sched.split_pairs()  # DualPipeV splits only its drain's backwards into I and W
        assert set(counts.values()) == {1}
        assert len(counts) == 2 * p * v * m + len(split)  # every microbatch visits p * v stages
        # a schedule that spells out its exchanges (deepspeed-1f1b) has every one lowering would add, and no other
        assert not sched.has_comms or _comms(sched) == _comms(add_p2p(_compute_only(sched)))
        # F precedes its backward on the owning rank
        for prog in sched.programs:
            pos = {a: i for i, a in enumerate(prog)}
            for a, i in pos.items():
                if a.kind in (Kind.B, Kind.I):
                    assert pos[type(a)(a.stage, Kind.F, a.microbatch)] < i
                if a.kind == Kind.W:
                    assert pos[type(a)(a.stage, Kind.I, a.microbatch)] < i
    assert built > 0


def test_lowered_sends_follow_producer_and_recvs_precede_consumer():
    sched = add_p2p(schedules.build("1f1b", 3, 4))
    prog1 = [str(a) for a in sched.programs[1]]
    assert prog1[:6] == ["1RECV_F0", "1F0", "1SEND_F0", "1RECV_F1", "1F1", "1SEND_F1"]
    assert "1RECV_B0" in prog1 and prog1.index("1RECV_B0") + 1 == prog1.index("1B0")
    assert not any(a.is_comm for a in add_p2p(schedules.build("1f1b", 1, 4)).programs[0])


def test_interleaved_rejects_inadmissible_microbatches():
    with pytest.raises(PipesimError, match="m=6 is not a multiple of p=4"):
        schedules.build("interleaved-1f1b", 4, 6, 2)
    with pytest.raises(PipesimError, match="--virtual >= 2"):
        schedules.build("interleaved-1f1b", 4, 8, 1)


@pytest.mark.parametrize(
    "args, message",
    [
        (("nope", 2, 4), "unknown schedule 'nope'"),
        (("1f1b", 0, 4), "--stages must be a positive integer"),
        (("1f1b", 2, 0), "--microbatches must be a positive integer"),
        (("1f1b", 2, 4, 2), "has one stage per rank"),
    ],
)
def test_bad_sizes_are_user_errors(args, message):
    with pytest.raises(PipesimError, match=message):
        schedules.build(*args)


def test_exact_1f1b_order():
    sched = schedules.build("1f1b", 3, 4)
    assert [" ".join(map(str, prog)) for prog in sched.programs] == [
        "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
        "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3",
    ]


def test_exact_zb_h1_order():
    sched = schedules.build("zb-h1", 3, 4)
    assert [" ".join(map(str, prog)) for prog in sched.programs] == [
        "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3",
        "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3",
        "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3",
    ]
