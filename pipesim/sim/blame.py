"""Who waited on whom: each blocked RECV's wait attributed to the rank (or link) that caused it, and a what-if's
loss of time against the unperturbed run.

A rank waits in a RECV for one of two reasons. Either the message was not yet posted when the RECV began
(the sender was late): that part of the wait goes to the sender, or further upstream when the sender was
itself late only because it had just waited (its send follows, within one compute, a RECV whose message
was late in turn: the chain is followed to the first rank that was not waiting, the root). Or the message
was posted and was still moving (or, on gloo, still being progressed): that part goes to the link.
A pipeline amplifies a straggler through every stage that waits on it; following the chain is what puts
rank 3's wait behind rank 2's wait behind slow rank 1 where it belongs, on rank 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.ir.schedule import COMPUTE, RECVS, SENDS
from pipesim.sim.result import SimResult


@dataclass(frozen=True)
class Wait:
    """Part of one RECV's blocked time, attributed."""

    rank: int  # the pipeline rank that waited
    index: int  # the RECV's position in its lowered program
    start: float  # seconds
    end: float  # seconds
    culprit: str  # "rank S" (the root of the late sender chain) or "link A-B" (A < B)
    culprit_rank: int  # S for a rank, -1 for a link

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _blocked_recvs(result: SimResult):
    """(rank, index, start, late, end, transfer) of every RECV that blocked: the sender-late part runs from start to
    `late` (when its message was posted, at most end), the in-flight part from max(start, late) to end."""
    starts, ends = result.starts, result.ends
    for r, prog in enumerate(result.schedule.programs):
        for i, a in enumerate(prog):
            s, e = starts[r][i], ends[r][i]
            if a.kind in RECVS and e > s:
                t = result.recv_transfer(a)
                yield r, i, s, min(t.post, e), e, t


def waits(result: SimResult) -> list[Wait]:
    """Every blocked RECV's time, split into the sender-late part (its root rank) and the in-flight part (link)."""
    out: list[Wait] = []
    roots: dict[tuple[int, int], int] = {}
    for r, i, s, late, e, t in _blocked_recvs(result):
        if late > s:
            root = _root(result, r, i, roots)
            out.append(Wait(r, i, s, late, f"rank {root}", root))
        if e > max(s, late):
            lo, hi = sorted((t.src, t.dst))
            out.append(Wait(r, i, max(s, late), e, f"link {lo}-{hi}", -1))
    return out


def _root(result: SimResult, rank: int, index: int, memo: dict[tuple[int, int], int]) -> int:
    """The first rank up the chain of late senders behind the RECV at (rank, index), whose message came late."""
    sched, starts = result.schedule, result.starts
    path = []
    key = (rank, index)
    root = -1
    while True:
        if key in memo:
            root = memo[key]
            break
        path.append(key)
        t = result.recv_transfer(sched.programs[key[0]][key[1]])
        src, k = t.src, t.send_index - 1
        prog, computes, nxt = sched.programs[src], 0, None
        while k >= 0:  # back from the SEND over messages and at most one compute
            b = prog[k]
            if b.kind in COMPUTE:
                computes += 1
                if computes > 1:
                    break
            elif b.kind in RECVS and result.recv_transfer(b).post > starts[src][k]:
                nxt = (src, k)  # the sender had waited for a late message just before: follow it
                break
            k -= 1
        if nxt is None:
            root = src
            break
        key = nxt
    for p in path:
        memo[p] = root
    return root


def blame_rows(result: SimResult) -> list[list]:
    """[rank, start, end, culprit] of every attributed wait, for a timeline's meta (the plots draw them)."""
    return [[w.rank, w.start, w.end, w.culprit] for w in waits(result)]


def exposed_comm(result: SimResult) -> list[float]:
    """Per pipeline rank, seconds held by messages themselves: the in-flight part of its RECVs' waits (`waits`' link
    part: the bytes posted and still queued or moving) and every SEND that held it (blocking p2p). The rest of a
    RECV's wait is its sender still computing (pipeline fill and drain, an unbalanced split): bubble, not
    communication."""
    out = [0.0] * result.schedule.num_ranks
    for r, _, s, late, e, _ in _blocked_recvs(result):  # `waits`' link part, without tracing the late senders
        out[r] += max(0.0, e - max(s, late))
    for r, prog in enumerate(result.schedule.programs):
        out[r] += sum(result.ends[r][i] - result.starts[r][i] for i, a in enumerate(prog) if a.kind in SENDS)
    return out


def blame_table(result: SimResult) -> dict[tuple[int, str], float]:
    """(waiting rank, culprit) -> seconds waited, summed over the step."""
    table: dict[tuple[int, str], float] = {}
    for w in waits(result):
        table[(w.rank, w.culprit)] = table.get((w.rank, w.culprit), 0.0) + w.seconds
    return table


def what_if(base: SimResult, perturbed: SimResult) -> dict:
    """The loss of time of `perturbed` against `base` (the same schedule and costs, unperturbed), and who waited on
    whom: per (waiting rank, culprit), the seconds waited in each run and the difference, largest first."""
    before, after = blame_table(base), blame_table(perturbed)
    rows = []
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key, 0.0), after.get(key, 0.0)
        rows.append({"rank": key[0], "waited_on": key[1], "seconds": a, "baseline_seconds": b, "extra": a - b})
    rows.sort(key=lambda row: (-row["extra"], row["rank"], row["waited_on"]))
    step0, step1 = base.step_time, perturbed.step_time
    culprits: dict[str, float] = {}
    for row in rows:
        culprits[row["waited_on"]] = culprits.get(row["waited_on"], 0.0) + row["extra"]
    return {"baseline_step_time": step0, "step_time": step1, "loss": step1 - step0,
            "loss_fraction": step1 / step0 - 1 if step0 > 0 else 0.0,
            "waits": rows,
            "extra_wait_by_culprit": dict(sorted(culprits.items(), key=lambda kv: (-kv[1], kv[0])))}


__all__ = ["Wait", "blame_rows", "blame_table", "exposed_comm", "waits", "what_if"]
