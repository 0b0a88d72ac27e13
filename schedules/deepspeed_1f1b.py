"""DeepSpeed's pipeline engine schedule (TrainSchedule): 1F1B in lockstep steps, each send deferred to the next step.

microsoft/DeepSpeed deepspeed/runtime/pipe/schedule.py (`TrainSchedule.steps`, the same since 2020): a batch is
2 (m + p - 1) steps; stage s runs a forward in the steps whose parity is its own and a backward in the others
(microbatch ids from `_even_step_forward_id` and its three siblings; an id outside [0, m) is an idle step). A
step's instructions are its exchanges, then its computation: a forward step first sends the input gradient of
the previous step's backward (SendGrad) and receives this microbatch's input (RecvActivation); a backward step
first receives this microbatch's output gradient (RecvGrad) and then sends the output of the previous step's
forward (SendActivation). So a forward's output leaves one step late, after the next output gradient has
arrived, which Megatron's 1F1B (schedules.one_f_one_b, the SEND right after its compute) does not do. The
engine's sends and receives block (deepspeed/runtime/pipe/p2p.py), which `--framework deepspeed` gives
(--blocking-p2p). The exchanges are spelled out here, so lowering keeps them where the engine issues them.
"""

from __future__ import annotations

from pipesim.ir.schedule import Action, Kind, Schedule, loop_placement
from schedules import register


def step_microbatch(step: int, stage: int, p: int) -> tuple[int, bool]:
    """(microbatch id, is forward) of `stage` at `step`: TrainSchedule._step_to_micro_batch."""
    if step % 2 == stage % 2:  # the stage's own parity: a forward
        return (step - step % 2) // 2 - stage // 2, True
    if step % 2 == 0:  # even step, odd stage
        return step // 2 - p + (stage + 1) // 2, False
    return (step - 1) // 2 - p + 1 + stage // 2, False  # odd step, even stage


def deepspeed_program(stage: int, p: int, m: int) -> tuple[Action, ...]:
    """The instructions of `stage` (one per rank) as actions, exchanges before each step's computation."""
    out: list[Action] = []
    prev = -1
    for step in range(2 * (m + p - 1)):
        mb, forward = step_microbatch(step, stage, p)
        valid, prev_valid = 0 <= mb < m, 0 <= prev < m
        if forward:
            if prev_valid and stage > 0:
                out.append(Action(stage, Kind.SEND_B, prev))
            if valid and stage > 0:
                out.append(Action(stage, Kind.RECV_F, mb))
        else:
            if valid and stage < p - 1:
                out.append(Action(stage, Kind.RECV_B, mb))
            if prev_valid and stage < p - 1:
                out.append(Action(stage, Kind.SEND_F, prev))
        if valid:
            out.append(Action(stage, Kind.F if forward else Kind.B, mb))
        prev = mb
    return tuple(out)


@register("deepspeed-1f1b", "DeepSpeed's pipeline engine: 1F1B in lockstep steps, sends deferred a step", order=22)
def deepspeed_1f1b(p: int, m: int, v: int = 1) -> Schedule:
    return Schedule("deepspeed-1f1b", m, loop_placement(p, 1), tuple(deepspeed_program(r, p, m) for r in range(p)))
