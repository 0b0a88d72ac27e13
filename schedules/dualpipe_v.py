"""DualPipeV (DeepSeek-V3, 2024; torch's ScheduleDualPipeV): V placement with overlapped forward + backward.

Rank r holds stages r and 2p-1-r (as ZB-V). After a warm-up of forwards, each rank's steady state
runs the forward of one chunk overlapped with the full backward of the other (OVERLAP_F_B), so
one's communication hides behind the other's compute; the drain splits backwards into I and W to
fill the tail. The order is torch's (`_calculate_single_rank_operations`), step by step; it needs
m >= 2p. With F = I = W per chunk and an F&B pair taking F + B, every rank idles
(p - 1)(F&B + B - 3W), the DualPipe README's bubble for 2p chunks, and stashes 2p + 1 chunk
activations (its PP + 1); docs/schedule_library.md has the measured figures otherwise.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action, Kind, Schedule, overlapped, v_placement
from schedules import register


class _RankOrder:
    """Builds one rank's program with torch's counters: next microbatch per (stage, kind)."""

    def __init__(self) -> None:
        self.prog: list[Action] = []
        self.pairs: set[tuple[Action, Action]] = set()
        self.next: dict[tuple[int, str], int] = {}
        self.weights: list[Action] = []  # W's whose I ran, oldest first

    def _take(self, stage: int, key: str) -> int:
        mb = self.next.get((stage, key), 0)
        self.next[(stage, key)] = mb + 1
        return mb

    def add(self, stage: int, kind: Kind) -> Action:
        mb = self._take(stage, "F" if kind == Kind.F else "BI")  # B and I share torch's input counter
        action = Action(stage, kind, mb)
        self.prog.append(action)
        if kind == Kind.I:
            self.weights.append(Action(stage, Kind.W, mb))
        return action

    def overlap(self, forward_stage: int, backward_stage: int) -> None:
        fwd = self.add(forward_stage, Kind.F)
        bwd = self.add(backward_stage, Kind.B)
        self.pairs.add((fwd, bwd))

    def weight(self) -> None:
        if self.weights:
            self.prog.append(self.weights.pop(0))


def dualpipe_v_rank(rank: int, p: int, m: int) -> _RankOrder:
    """Rank `rank`'s order, torch's eight steps."""
    s0, s1 = rank, 2 * p - 1 - rank
    o = _RankOrder()
    for _ in range((p - rank - 1) * 2):  # 1: F0
        o.add(s0, Kind.F)
    for _ in range(rank + 1):  # 2: F0 F1
        o.add(s0, Kind.F)
        o.add(s1, Kind.F)
    for _ in range(p - rank - 1):  # 3: I1 W1 F1 (zero bubble)
        o.add(s1, Kind.I)
        o.weight()
        o.add(s1, Kind.F)
    for i in range(m - 2 * p + rank + 1):  # 4: (F0;B1) (F1;B0), the last rank's first pair not overlapped
        if i == 0 and rank == p - 1:
            o.add(s0, Kind.F)
            o.add(s1, Kind.B)
        else:
            o.overlap(s0, s1)
        o.overlap(s1, s0)
    for _ in range(p - rank - 1):  # 5: B1 (F1;B0)
        o.add(s1, Kind.B)
        o.overlap(s1, s0)
    zb = False
    steps = rank + 1
    for i in range(steps):  # 6: B1 B0, the second half split into I and W
        if i == steps // 2 and rank % 2 == 1:
            zb = True
        o.add(s1, Kind.I if zb else Kind.B)
        if i == steps // 2 and rank % 2 == 0:
            zb = True
        o.add(s0, Kind.I if zb else Kind.B)
    for _ in range(p - rank - 1):  # 7: W0 B0
        o.weight()
        o.add(s0, Kind.I if zb else Kind.B)
    for _ in range(rank + 1):  # 8: W0
        o.weight()
    return o


@register(
    "dualpipev",
    "DualPipeV: V placement, overlapped F&B in steady state, zero-bubble drain (DeepSeek; torch)",
    virtual=True,
    default_virtual=2,
    order=60,
)
def dualpipev(p: int, m: int, v: int = 2) -> Schedule:
    if v != 2:
        raise PipesimError(f"dualpipev needs exactly --virtual 2 chunks per rank (V placement), got {v}")
    if m < 2 * p:
        raise PipesimError(f"dualpipev needs microbatches >= 2 x stages: m={m} < 2p={2 * p}")
    orders = [dualpipe_v_rank(r, p, m) for r in range(p)]
    # torch's step 7 may leave W's queued after step 8 ran out (rank-dependent); flush them in order
    for o in orders:
        while o.weights:
            o.weight()
    sched = Schedule("dualpipev", m, v_placement(p), tuple(tuple(o.prog) for o in orders))
    sched = overlapped(sched, {pair for o in orders for pair in o.pairs})
    sched.meta["virtual"] = 2
    return sched
