"""deepspeed-1f1b: DeepSpeed's TrainSchedule instruction stream, exchanges first, each forward's output a step late."""

from __future__ import annotations

import json

import schedules
from pipesim.cli import main
from pipesim.ir.graph import critical_path
from pipesim.ir.schedule_check import validate
from schedules.deepspeed_1f1b import step_microbatch


def test_rank_1_of_3_runs_deepspeeds_instructions_in_their_order():
    # deepspeed/runtime/pipe/schedule.py TrainSchedule.steps for stage 1 of 3, 4 microbatches (12 steps): odd steps
    # forward (RecvActivation, ForwardPass; SendGrad of the step before first), even steps backward (RecvGrad,
    # SendActivation of the step before, BackwardPass); steps 0 and 2 have no valid backward yet
    sched = schedules.build("deepspeed-1f1b", 3, 4)
    validate(sched)
    assert [str(a) for a in sched.programs[1]] == [
        "1RECV_F0", "1F0", "1SEND_F0", "1RECV_F1", "1F1", "1RECV_B0", "1SEND_F1", "1B0", "1SEND_B0", "1RECV_F2",
        "1F2", "1RECV_B1", "1SEND_F2", "1B1", "1SEND_B1", "1RECV_F3", "1F3", "1RECV_B2", "1SEND_F3", "1B2", "1SEND_B2",
        "1RECV_B3", "1B3", "1SEND_B3"]
    # the first stage sends each forward's output only after receiving the next output gradient (from step 5 on)
    assert [str(a) for a in sched.programs[0]][4:8] == ["0F2", "0RECV_B0", "0SEND_F2", "0B0"]


def test_step_ids_are_deepspeeds_formulas():
    p = 4  # _even_step_forward_id, _odd_step_forward_id, _even_step_backward_id, _odd_step_backward_id
    assert step_microbatch(6, 0, p) == (3, True) and step_microbatch(7, 1, p) == (3, True)
    assert step_microbatch(6, 1, p) == (6 // 2 - p + 1, False) and step_microbatch(7, 0, p) == (3 - p + 1, False)
    assert step_microbatch(7, 2, p) == (3 - p + 1 + 1, False)


def test_with_free_messages_it_is_1f1b_in_time_and_memory():
    def unit(a):
        return {"F": 1.0, "B": 2.0}.get(a.kind.value, 0.0)

    for p, m in ((2, 4), (4, 8), (3, 7)):
        ds, ref = schedules.build("deepspeed-1f1b", p, m), schedules.build("1f1b", p, m)
        assert critical_path(ds, unit).makespan == critical_path(ref, unit).makespan == 3 * (m + p - 1)


def test_with_timed_messages_the_late_sends_cost(capsys):
    spans = {}
    for name in ("1f1b", "deepspeed-1f1b"):
        assert main(["simulate", name, "-p", "4", "-m", "8", "--cost", "F=1,B=2", "--boundary-bytes", "4000000000",
                     "--hardware", "pcie-4gpu", "--blocking-p2p", "--json"]) == 0
        spans[name] = json.loads(capsys.readouterr().out)["makespan"]
    assert spans["1f1b"] > 33.0 and spans["deepspeed-1f1b"] > spans["1f1b"]
