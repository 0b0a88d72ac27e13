"""Task-graph view of a schedule: data dependencies plus per-rank program order.

Validation finds deadlocks as cycles of this graph, and the contention-free makespan is its
longest path. SEND is non-blocking (an isend); a RECV blocks until its SEND has been posted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import networkx as nx

from pipesim.ir.deps import producers, transfer_actions
from pipesim.ir.schedule import Action, Schedule


def task_graph(schedule: Schedule) -> nx.DiGraph:
    """DiGraph over the schedule's actions; edge attribute `why` is 'order', 'data' or 'p2p'.

    Node attributes: rank and index (position in that rank's program). Dependencies whose
    producer is not in the schedule are skipped (validation reports them).
    """
    graph = nx.DiGraph()
    for rank, prog in enumerate(schedule.programs):
        for index, action in enumerate(prog):
            graph.add_node(action, rank=rank, index=index)
        for a, b in zip(prog, prog[1:]):
            graph.add_edge(a, b, why="order")
    split = schedule.split_pairs()
    lowered = schedule.has_comms
    for action in list(graph.nodes):
        if not action.is_compute:
            continue
        for prod in producers(action, schedule, split):
            if prod not in graph:
                continue
            same_rank = graph.nodes[prod]["rank"] == graph.nodes[action]["rank"]
            if same_rank or not lowered:
                graph.add_edge(prod, action, why="data")
                continue
            send, recv = transfer_actions(prod, action)
            if send in graph:
                graph.add_edge(prod, send, why="data")
            if recv in graph:
                graph.add_edge(recv, action, why="data")
            if send in graph and recv in graph:
                graph.add_edge(send, recv, why="p2p")
    _join_overlaps(graph, schedule)
    return graph


def _join_overlaps(graph: nx.DiGraph, schedule: Schedule) -> None:
    """An overlapped pair is one action: both halves wait for both inputs (edges into the forward) and
    both outputs leave at its end (edges out of the backward). Lowering already orders a lowered one so."""
    for fwd, bwd in schedule.overlaps:
        if fwd not in graph or bwd not in graph:
            continue
        for pred in list(graph.predecessors(bwd)):
            if pred != fwd and graph.edges[pred, bwd]["why"] == "data" and not graph.has_edge(pred, fwd):
                graph.add_edge(pred, fwd, why="data")
        for succ in list(graph.successors(fwd)):
            if succ != bwd and graph.edges[fwd, succ]["why"] == "data" and not graph.has_edge(bwd, succ):
                graph.add_edge(bwd, succ, why="data")


def overlap_durations(schedule: Schedule, duration: Callable[[Action], float],
                      forward_half: Callable[[float, float], float]) -> Callable[[Action], float]:
    """`duration` with each overlapped pair timed as one action: the backward half keeps its own time and
    the forward half takes `forward_half(F seconds, B seconds)` (`CostTable.overlap_forward_seconds`),
    so the pair's outputs leave at its end."""
    first = {fwd: bwd for fwd, bwd in schedule.overlaps}
    if not first:
        return duration

    def timed(action: Action) -> float:
        bwd = first.get(action)
        return duration(action) if bwd is None else forward_half(duration(action), duration(bwd))

    return timed


@dataclass(frozen=True)
class CriticalPath:
    """Contention-free timing of a schedule: every action starts when its inputs are ready."""

    makespan: float  # seconds (or the cost unit given)
    start: dict[Action, float]
    end: dict[Action, float]
    path: tuple[Action, ...]  # the chain of actions that sets the makespan


def critical_path(
    schedule: Schedule, duration: Callable[[Action], float], graph: nx.DiGraph | None = None
) -> CriticalPath:
    """Longest path through the task graph with node weights `duration(action)`."""
    graph = task_graph(schedule) if graph is None else graph
    start: dict[Action, float] = {}
    end: dict[Action, float] = {}
    via: dict[Action, Action | None] = {}
    for node in nx.topological_sort(graph):
        t0, best = 0, None
        for pred in graph.predecessors(node):
            if end[pred] > t0 or best is None and end[pred] == t0:
                t0, best = end[pred], pred
        start[node] = t0
        end[node] = t0 + duration(node)
        via[node] = best
    if not end:
        return CriticalPath(0, {}, {}, ())
    last = max(end, key=lambda a: (end[a], -graph.nodes[a]["rank"]))
    chain: list[Action] = []
    node: Action | None = last
    while node is not None:
        chain.append(node)
        node = via[node]
    return CriticalPath(end[last], start, end, tuple(reversed(chain)))


def rank_busy(schedule: Schedule, duration: Callable[[Action], float]) -> list[float]:
    """Total compute time of each rank's program."""
    return [sum(duration(a) for a in prog if a.is_compute) for prog in schedule.programs]


def edges_of(graph: nx.DiGraph, why: str) -> Iterable[tuple[Action, Action]]:
    return ((a, b) for a, b, w in graph.edges(data="why") if w == why)
