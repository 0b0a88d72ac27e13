"""The critical path of a simulated step: the chain of compute, transfers and collectives that ends at the makespan,
walked back from the last thing to finish (what pipesim.sim.result.SimResult.critical_path reports)."""

from __future__ import annotations

from collections.abc import Callable

from pipesim.ir.schedule import COMPUTE, RECVS, Action, Schedule
from pipesim.sim.links import Transfer
from pipesim.sim.records import CollectiveRecord
from pipesim.sim.step import AFTER_PIPELINE


def critical_path(sched: Schedule, starts: list[list[float]], ends: list[list[float]],
                  collectives: list[CollectiveRecord], recv_transfer: Callable[[Action], Transfer]) -> list[dict]:
    """The chain of compute, transfers and collectives that ends at the makespan, first to last.

    Each entry starts when the one before it ends (a transfer that waited for a busy link is
    preceded by the transfer that held it); zero-length messages are left out.
    """
    node: tuple | None = None  # ("rank", r, i), ("coll", record) or ("xfer", transfer)
    best = -1.0
    for r in range(sched.num_ranks):
        if ends[r] and ends[r][-1] > best:
            node, best = ("rank", r, len(ends[r]) - 1), ends[r][-1]
    for c in collectives:
        if c.end > best and c.phase not in AFTER_PIPELINE:
            node, best = ("coll", c), c.end
    # ZeRO-3: a compute that started late because it waited for its prefetched all-gather follows that gather
    gates = {(c.rank, c.end): c for c in collectives if c.phase in ("forward", "backward")}
    chain: list[dict] = []
    while node is not None:
        if node[0] == "coll":
            c = node[1]
            chain.append({"name": f"{c.kind}(stage {c.stage})", "kind": "collective", "rank": c.rank,
                          "start": c.start, "end": c.end, "bytes": c.nbytes})
            if c.prev is not None and c.prev.end == c.start:
                node = ("coll", c.prev)
            else:  # released by a compute's end, or issued at the step's start (ZeRO-3 prefetch)
                node = ("rank", c.rank, c.after) if c.after >= 0 else None
            continue
        if node[0] == "xfer":
            t = node[1]
            if t.end > t.start:
                chain.append({"name": str(t.send), "kind": "transfer", "rank": t.src, "peer": t.dst,
                              "start": t.start, "end": t.end, "bytes": t.nbytes})
            node = ("xfer", t.blocker) if t.start > t.post and t.blocker is not None else ("rank", t.src,
                                                                                             t.send_index)
            continue
        _, r, i = node
        a, s, e = sched.programs[r][i], starts[r][i], ends[r][i]
        if a.kind in COMPUTE:
            chain.append({"name": str(a), "kind": "compute", "rank": r, "start": s, "end": e})
            if gates and (r, s) in gates and (ends[r][i - 1] < s if i > 0 else s > 0.0):
                node = ("coll", gates[(r, s)])
                continue
        elif a.kind in RECVS and e > s:  # blocked: the message, not the wait, is on the path
            node = ("xfer", recv_transfer(a))
            continue
        node = ("rank", r, i - 1) if i > 0 else None
    chain.reverse()
    return chain


__all__ = ["critical_path"]
