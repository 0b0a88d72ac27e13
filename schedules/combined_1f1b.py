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

from pipesim.ir.schedule import Schedule, loop_placement, overlapped
from schedules import register
from schedules.interleaved import check_interleaved, interleaved_programs


@register(
    "combined-1f1b",
    "interleaved 1F1B with each steady-state F and B overlapped, hiding MoE all-to-alls (Megatron-core)",
    virtual=True,
    default_virtual=2,
    order=32,
)
def combined_1f1b(p: int, m: int, v: int = 2) -> Schedule:
    check_interleaved("combined-1f1b", p, m, v, "(Megatron-core overlaps all-to-alls with virtual pipelining only)")
    programs, pairs = interleaved_programs(p, m, v, extra_warmup=1)
    sched = Schedule("combined-1f1b", m, loop_placement(p, v), programs)
    sched.meta["virtual"] = v
    return overlapped(sched, pairs)
