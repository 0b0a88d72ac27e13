"""Validation: a schedule runs to completion under blocking-receive semantics, or is rejected.

Checks, in order: placement, exact action counts, P2P pairing, and deadlock freedom (a cycle in
the task graph). Every rejection names the ranks and actions involved and shows a rank x step grid
with the offending actions marked.
"""

from __future__ import annotations

from collections import Counter

import networkx as nx

from pipesim.errors import ScheduleError
from pipesim.ir.deadlock import stalled_ranks
from pipesim.ir.deps import producers, transfer_actions
from pipesim.ir.graph import task_graph
from pipesim.ir.lowering import add_p2p, needs_send
from pipesim.ir.schedule import COMPUTE, RECVS, SENDS, Action, Kind, Schedule


def render_grid(schedule: Schedule, marked: frozenset[Action] = frozenset(), width: int = 0) -> str:
    """Rank x step text grid; marked actions are wrapped in brackets, an overlapped pair shares a step."""
    def cell(a: Action) -> str:
        return f"[{a}]" if a in marked else str(a)

    cells = []
    for prog in schedule.programs:
        row, i = [], 0
        while i < len(prog):  # an overlapped pair (OVERLAP_F_B) is one step: `0F3;3B1`
            pair = i + 1 < len(prog) and (prog[i], prog[i + 1]) in schedule.overlaps
            row.append(f"{cell(prog[i])};{cell(prog[i + 1])}" if pair else cell(prog[i]))
            i += 2 if pair else 1
        cells.append(row)
    width = width or max((len(c) for row in cells for c in row), default=4)
    steps = max((len(r) for r in cells), default=0)
    head = "step   | " + " ".join(f"{i:<{width}}" for i in range(steps))
    rows = [f"rank {r:<2}| " + " ".join(f"{c:<{width}}" for c in row) for r, row in enumerate(cells)]
    return "\n".join([head, *rows])


def _fail(schedule: Schedule, message: str, marked: set[Action] | None = None) -> ScheduleError:
    return ScheduleError(message, render_grid(schedule, frozenset(marked or ())))


def check_placement(schedule: Schedule) -> None:
    ranks = schedule.num_ranks
    if ranks < 1 or schedule.num_stages < 1:
        raise ScheduleError("a schedule needs at least one rank and one stage")
    if schedule.num_microbatches < 1:
        raise ScheduleError(f"microbatches must be >= 1, got {schedule.num_microbatches}")
    chains = schedule.chains
    if chains < 1 or schedule.num_stages % chains or schedule.num_microbatches % chains:
        raise ScheduleError(f"{chains} stage chains must split {schedule.num_stages} stages and "
                            f"{schedule.num_microbatches} microbatches evenly")
    for stage, rank in enumerate(schedule.placement):
        if not 0 <= rank < ranks:
            raise ScheduleError(f"stage {stage} is placed on rank {rank}, but ranks are 0..{ranks - 1}")
    for rank, prog in enumerate(schedule.programs):
        for a in prog:
            if not 0 <= a.stage < schedule.num_stages:
                raise _fail(schedule, f"rank {rank} runs {a.describe()}: stages are 0..{schedule.num_stages - 1}", {a})
            if not 0 <= a.microbatch < schedule.num_microbatches:
                raise _fail(
                    schedule,
                    f"rank {rank} runs {a.describe()}: microbatches are 0..{schedule.num_microbatches - 1}",
                    {a},
                )
            if not schedule.visits(a.stage, a.microbatch):
                path = schedule.microbatch_stages(a.microbatch)
                raise _fail(schedule, f"rank {rank} runs {a.describe()}, but microbatch {a.microbatch} visits "
                                      f"stages {path.start}..{path.stop - 1} only", {a})
            if schedule.rank_of(a.stage) != rank:
                raise _fail(
                    schedule,
                    f"rank {rank} runs {a.describe()}, but stage {a.stage} is placed on rank "
                    f"{schedule.rank_of(a.stage)}",
                    {a},
                )


def check_counts(schedule: Schedule) -> None:
    """Every F once; per (stage, mb) either one B or one I plus one W; no duplicates.

    Whether (stage, mb) is split is read off the I actions; a W without its I is an error.
    """
    counts = Counter(a for prog in schedule.programs for a in prog)
    dup = sorted(a for a, n in counts.items() if n > 1)
    if dup:
        raise _fail(schedule, f"{dup[0].describe()} appears {counts[dup[0]]} times", set(dup))
    split = schedule.split_pairs()
    for a in sorted(counts):
        if a.kind == Kind.W and (a.stage, a.microbatch) not in split:
            raise _fail(schedule, f"{a.describe()} has no matching I(stage {a.stage}, mb {a.microbatch})", {a})
    for s in range(schedule.num_stages):
        for mb in range(schedule.num_microbatches):
            if not schedule.visits(s, mb):  # another chain's microbatch (DualPipe's other direction)
                continue
            needed = [Kind.F, Kind.I, Kind.W] if (s, mb) in split else [Kind.F, Kind.B]
            for kind in needed:
                if Action(s, kind, mb) not in counts:
                    what = Action(s, kind, mb).describe()
                    raise _fail(schedule, f"{what} is missing (on rank {schedule.rank_of(s)})")
            if (s, mb) in split and Action(s, Kind.B, mb) in counts:
                raise _fail(
                    schedule,
                    f"stage {s} mb {mb} has both a full backward B and a split I/W",
                    {Action(s, Kind.B, mb)},
                )


def check_overlaps(schedule: Schedule) -> None:
    """Each overlapped pair is a forward then a backward (B or I), adjacent on one rank, and the
    backward does not consume the forward it overlaps (it would have to wait for it)."""
    where = {a: (r, i) for r, prog in enumerate(schedule.programs) for i, a in enumerate(prog)}
    split = schedule.split_pairs()
    for fwd, bwd in sorted(schedule.overlaps):
        name = f"overlapped ({fwd};{bwd})"
        if fwd.kind != Kind.F or bwd.kind not in (Kind.B, Kind.I):
            raise _fail(schedule, f"{name} must be a forward then a backward (B or I)", {fwd, bwd})
        if fwd not in where or bwd not in where:
            raise _fail(schedule, f"{name}: {(fwd if fwd not in where else bwd).describe()} is not in any program")
        (rf, i_f), (rb, i_b) = where[fwd], where[bwd]
        if rf != rb or i_b != i_f + 1:
            raise _fail(schedule, f"{name} must be two adjacent actions of one rank's program", {fwd, bwd})
        if fwd in producers(bwd, schedule, split):
            raise _fail(schedule, f"{name}: {bwd.describe()} needs {fwd.describe()}, so they cannot overlap",
                        {fwd, bwd})


def expected_transfers(schedule: Schedule) -> set[Action]:
    """Every SEND and RECV that a lowered form of this schedule must contain."""
    out: set[Action] = set()
    split = schedule.split_pairs()
    for prog in schedule.programs:
        for a in prog:
            if a.kind not in COMPUTE:
                continue
            send = needs_send(a, schedule)
            if send is not None:
                out.add(send)
            for prod in producers(a, schedule, split):
                if schedule.rank_of(prod.stage) != schedule.rank_of(a.stage):
                    out.add(transfer_actions(prod, a)[1])
    return out


def check_transfers(schedule: Schedule) -> None:
    """A lowered schedule has exactly the SEND/RECV pairs its stage boundaries need."""
    present = {a for prog in schedule.programs for a in prog if a.kind in SENDS | RECVS}
    if not present:
        return
    expected = expected_transfers(schedule)
    for a in sorted(present - expected):
        where = f"on rank {schedule.rank_of(a.stage)}"
        raise _fail(schedule, f"{a.describe()} {where} is not needed: no such transfer", {a})
    for a in sorted(expected - present):
        peer = a.matching()
        raise _fail(
            schedule,
            f"{a.describe()} is missing on rank {schedule.rank_of(a.stage)} "
            f"(it pairs with {peer.describe()} on rank {schedule.rank_of(peer.stage)})",
            {peer} if peer in present else set(),
        )


def check_order_and_deadlock(schedule: Schedule) -> None:
    """Every rank runs to the end; otherwise the cycle of waits is reported rank by rank.

    The run itself is linear (pipesim.ir.deadlock); the task graph is built only to name a cycle.
    """
    stuck = stalled_ranks(schedule)
    if not stuck:
        return
    graph = task_graph(schedule)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:  # cannot happen once counts and transfers are checked; say what is stuck
        waits = ", ".join(f"rank {r} at {a.describe()}" for r, a in sorted(stuck.items()))
        raise _fail(schedule, f"schedule cannot finish: {waits}", set(stuck.values())) from None
    raise _fail(schedule, describe_cycle(schedule, graph, cycle), {u for u, _ in cycle})


def describe_cycle(schedule: Schedule, graph: nx.DiGraph, cycle: list) -> str:
    """'rank 1 blocks on RECV_F(stage 1, mb 3) from rank 0, which blocks on ...'."""
    rank = graph.nodes
    hops = [(u, v) for u, v in cycle if rank[u]["rank"] != rank[v]["rank"]]
    if not hops:  # a cycle inside one rank: an action runs before its own input
        u, v = next((u, v) for u, v in cycle if graph.edges[u, v]["why"] == "data")
        return (
            f"rank {rank[v]['rank']} runs {u.describe()} after {v.describe()}, "
            f"but {v.describe()} needs {u.describe()} first"
        )
    # narrate against the edges (a waiter, then whom it waits for), from the lowest rank's hop
    hops = [(u, v) for u, v in reversed(hops)]
    first = min(range(len(hops)), key=lambda i: (rank[hops[i][1]]["rank"], rank[hops[i][1]]["index"]))
    hops = hops[first:] + hops[:first]
    parts = [f"{v.describe()} from rank {rank[u]['rank']}" for u, v in hops]
    head = f"deadlock: rank {rank[hops[0][1]]['rank']} blocks on "
    return head + ", which blocks on ".join(parts)


def validate(schedule: Schedule) -> Schedule:
    """Raise ScheduleError naming the first problem; return the lowered schedule when valid.

    A compute-only schedule is checked in its lowered form, so deadlocks are named by RECVs.
    """
    check_placement(schedule)
    check_counts(schedule)
    check_overlaps(schedule)
    lowered = add_p2p(schedule)
    check_transfers(lowered)
    check_order_and_deadlock(lowered)
    return lowered


def fifo_mismatches(schedule: Schedule) -> list[tuple[int, int]]:
    """Rank pairs (src, dst) whose SEND order differs from the RECV order.

    Tagged transports (gloo here) match messages by tag and do not care; NCCL matches in
    issue order, so such a schedule would pair the wrong tensors there.
    """
    sends: dict[tuple[int, int], list[Action]] = {}
    recvs: dict[tuple[int, int], list[Action]] = {}
    for rank, prog in enumerate(schedule.programs):
        for a in prog:
            if a.kind in SENDS:
                sends.setdefault((rank, schedule.rank_of(a.peer_stage)), []).append(a.matching())
            elif a.kind in RECVS:
                recvs.setdefault((schedule.rank_of(a.peer_stage), rank), []).append(a)
    return sorted(pair for pair in sends if sends[pair] != recvs.get(pair))
