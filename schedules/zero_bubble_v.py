"""ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024): V placement, split I/W.

Rank r holds stages r and 2p-1-r, so the first and last stage share rank 0 and a microbatch goes
down the ranks and back up. Between neighbouring ranks two kinds of message share each direction
(chunk-0 activations with chunk-1 input grads one way, chunk-1 activations with chunk-0 input grads
the other), so every rank uses the same two sequences:

    down: F of chunk 0 and I of chunk 1,  up: F of chunk 1 and I of chunk 0,

each being p forwards, then alternately one backward and one forward, then the remaining
backwards (1F1B-like). Sharing them keeps every link's send order equal to its receive order.
A unit-time merge (schedules.unit_time) interleaves the two and fills gaps with W's, holding at most
2p chunk activations per rank (1F1B's p full stages). With unit costs per chunk action and
m >= p the makespan is 6m + p - 1: rank p-1 cannot start before p-1 and owns 6m of work.
The order is tuned to equal costs: with t_I != t_F the I's of the two bottom ranks form a cycle
that paces the steady state (see docs/schedule_library.md).
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action, Kind, Schedule, v_placement
from schedules import register
from schedules.unit_time import merge_unit_time


def one_f_one_b_sequence(forward_stage: int, backward_stage: int, warmup: int, m: int) -> list[Action]:
    """`warmup` forwards, then backward j / forward warmup+j pairs, then the remaining backwards."""
    warmup = min(warmup, m)
    seq = [Action(forward_stage, Kind.F, mb) for mb in range(warmup)]
    for j in range(m - warmup):
        seq += [Action(backward_stage, Kind.I, j), Action(forward_stage, Kind.F, warmup + j)]
    seq += [Action(backward_stage, Kind.I, j) for j in range(m - warmup, m)]
    return seq


@register(
    "zb-v",
    "zero bubble V: V placement, 2 chunks per rank, split I/W, 1F1B memory",
    virtual=True,
    default_virtual=2,
    order=50,
)
def zb_v(p: int, m: int, v: int = 2) -> Schedule:
    if v != 2:
        raise PipesimError(f"zb-v needs exactly --virtual 2 chunks per rank (V placement), got {v}")
    last = 2 * p - 1
    queues = []
    for r in range(p):
        up = one_f_one_b_sequence(last - r, r, p, m)  # chunk-1 forwards with chunk-0 input grads
        down = one_f_one_b_sequence(r, last - r, p, m)  # chunk-0 forwards with chunk-1 input grads
        queues.append((up, down))
    programs = merge_unit_time(queues, 2 * p, cap=2 * p)
    sched = Schedule("zb-v", m, v_placement(p), programs)
    sched.meta["virtual"] = 2
    return sched
