"""Combined 1F1B: Megatron-core's interleaved 1F1B with each steady-state forward and backward run together.

Megatron-core's `--overlap-moe-expert-parallel-comm` (megatron/core/pipeline_parallel/combined_1f1b.py,
`combined_1f1b_schedule_for_interleaved_pipelining`) runs the forward of one virtual microbatch and the backward
of another as one step, layer by layer on two streams, so that each one's expert-parallel dispatch and combine
hide under the other's computation (the idea of DeepSeek-V3's DualPipe, in the order Megatron already had). The
order is interleaved 1F1B's (schedules.interleaved) with one more warmup forward per rank (schedules.py adds 1 to
`num_warmup_microbatches` when the option is on), so every steady-state forward is paired with the backward after
it: an `OVERLAP_F_B` action, timed by the simulator's overlapped-pair rule. Megatron requires virtual pipelining
for this with pp > 1 (v >= 2 here); m must be a multiple of p, as interleaved 1F1B's. It holds one microbatch's
activations per rank more than interleaved 1F1B.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Schedule, loop_placement, overlapped
from schedules import register
from schedules.interleaved import virtual_action


@register(
    "combined-1f1b",
    "interleaved 1F1B with each steady-state F and B overlapped, hiding MoE all-to-alls (Megatron-core)",
    virtual=True,
    default_virtual=2,
    order=32,
)
def combined_1f1b(p: int, m: int, v: int = 2) -> Schedule:
    if v < 2:
        raise PipesimError(f"combined-1f1b needs --virtual >= 2 chunks per rank, got {v} (Megatron-core overlaps "
                           "the all-to-alls under virtual pipelining only)")
    if m % p:
        raise PipesimError(
            f"combined-1f1b needs microbatches to be a multiple of stages: m={m} is not a multiple of p={p}"
        )
    total = m * v
    programs, pairs = [], set()
    for r in range(p):
        warmup = total if m == p else min(total, (p - r - 1) * 2 + (v - 1) * p + 1)
        prog = [virtual_action(k, p, v, r, True) for k in range(warmup)]
        for i in range(total - warmup):
            fwd, bwd = virtual_action(warmup + i, p, v, r, True), virtual_action(i, p, v, r, False)
            prog += [fwd, bwd]
            pairs.add((fwd, bwd))
        prog += [virtual_action(k, p, v, r, False) for k in range(total - warmup, total)]
        programs.append(tuple(prog))
    sched = Schedule("combined-1f1b", m, loop_placement(p, v), tuple(programs))
    sched.meta["virtual"] = v
    return overlapped(sched, pairs)
