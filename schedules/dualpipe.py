"""DualPipe (DeepSeek-V3, 2024): bidirectional pipeline, two copies of the model fed from both ends.

The model has p stages; rank i holds stage i of the forward direction and stage p-1-i of the reverse
one, so every rank keeps two model stages' parameters (2x) and the two ranks holding one model stage
sum their gradients before the optimizer. In the IR this is a schedule with 2p stages in two chains
(`Schedule.chains`): chain 0 is stages 0..p-1 on ranks 0..p-1 and carries microbatches 0..m/2-1,
chain 1 is stages p..2p-1 (model stage j as stage p+j, on rank p-1-j) and carries m/2..m-1. The
placement is the V's (rank r holds stages r and 2p-1-r).

The order is the DualPipe repository's eight steps (`DualPipe.step`), which are DualPipeV's for p/2
ranks and m/2 microbatches: rank r runs the V program of half-rank min(r, p-1-r), its first phase on
the forward direction on the first half of the ranks and on the reverse direction on the second
half (`schedules.dualpipe_v.dualpipe_v_rank` builds those steps). Needs p even and m >= 2p, m even.
With F = I = W per stage and an F&B pair taking F + B, every rank idles (p/2 - 1)(F&B + B - 3W)
(the README's bubble) and stashes p + 1 stage activations (its PP + 1).
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action, Schedule, overlapped, v_placement
from schedules import register
from schedules.dualpipe_v import dualpipe_v_rank


def _to_chain(action: Action, rank: int, p: int, m: int) -> Action:
    """A half-size V action (V stage s in 0..p-1) as rank `rank`'s DualPipe action."""
    chain = int(action.stage >= p // 2) ^ int(rank >= p // 2)
    return Action(chain * p + action.stage, action.kind, action.microbatch + chain * (m // 2))


@register(
    "dualpipe",
    "DualPipe: two model copies fed from both ends, overlapped F&B, parameters 2x (DeepSeek-V3)",
    order=61,
)
def dualpipe(p: int, m: int, v: int = 1) -> Schedule:
    if p % 2:
        raise PipesimError(f"dualpipe needs an even number of stages (ranks), got {p}")
    if m % 2 or m < 2 * p:
        raise PipesimError(f"dualpipe needs an even number of microbatches >= 2 x stages: m={m}, 2p={2 * p}")
    programs, pairs = [], set()
    for rank in range(p):
        order = dualpipe_v_rank(min(rank, p - 1 - rank), p // 2, m // 2)
        while order.weights:  # as dualpipev: W's left queued after torch's step 8
            order.weight()
        programs.append(tuple(_to_chain(a, rank, p, m) for a in order.prog))
        pairs |= {(_to_chain(f, rank, p, m), _to_chain(b, rank, p, m)) for f, b in order.pairs}
    sched = Schedule("dualpipe", m, v_placement(p), tuple(programs), chains=2)
    return overlapped(sched, pairs)
