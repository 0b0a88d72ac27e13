"""The ranks of the replicas the simulator does not draw, on the cores they share with the ones it does.

The simulator runs one pipeline: pp ranks, replica 0 of the data-parallel (and tensor- and context-parallel)
axes. Every other replica runs the same program at the same time (DP replicas differ only in their data; TP
and CP shards and the expert all-to-alls hold them in step within each action), so on a GPU drawing one
pipeline is enough: each rank has a device of its own. On a CPU host the replicas' processes compete for
the same cores: 2 ranks of dp 2 on 2 cores run side by side (each paying the co-run slowdown), and 4 ranks
of pp 2 x dp 2 take turns on them. A host model that counts only the drawn pipeline's ranks sees a core
each and predicts the step of a host with twice the cores.

Here each pipeline rank stands for its copies, one per replica (its own first), every copy placed on its
own rank's node (`Hardware.node_of` of its world rank). When the rank starts an action, every copy starts
the same work on its node's host model (`HostSharing` or `HostTimeSlices`, which then see all the
processes the host really runs), and the action is done when the last copy is: the replicas' lockstep
(the all-to-alls inside an expert-parallel action, the data-parallel all-reduce at the end of the step) makes
the slowest copy the one everyone waits for. `started` is the drawn copy's (replica 0's), the one a measured
run is compared through (`pipesim.plots.compare.first_replica`). With one copy per rank nothing is wrapped,
so a pipeline without replicas is timed as before, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pipesim.sim.host.sharing import HostSharing
from pipesim.sim.host.slices import HostTimeSlices


class _Started:
    """`started[rank]` of the wrapped model, read through the drawn copy's id."""

    def __init__(self, inner: HostSharing | HostTimeSlices, first: list[int]) -> None:
        self.inner, self.first = inner, first

    def __getitem__(self, rank: int) -> float | None:
        return self.inner.started[self.first[rank]]


class HostCopies:
    """A host model over every copy of every pipeline rank, seen by the simulator as one rank per pipeline rank."""

    def __init__(self, inner: HostSharing | HostTimeSlices, copies: Sequence[Sequence[int]]) -> None:
        self.inner = inner
        self.copies = [list(c) for c in copies]  # pipeline rank -> the inner model's ids of its copies, drawn first
        self.left = [0] * len(copies)  # copies of the rank's current work still running
        self.started = _Started(inner, [c[0] for c in self.copies])

    def start(self, rank: int, seconds: float, done: Callable[[], None]) -> None:
        """Every copy of `rank` becomes runnable with `seconds` of work; `done()` once the last has finished."""
        self.left[rank] = len(self.copies[rank])

        def one_done() -> None:
            self.left[rank] -= 1
            if self.left[rank] == 0:
                done()

        for copy in self.copies[rank]:  # the drawn copy first: a FIFO queue grants it a core first
            self.inner.start(copy, seconds, one_done)


def expand(nodes: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """(node of each copy, flat; each pipeline rank's copy ids) from each pipeline rank's copies' nodes."""
    flat: list[int] = []
    ids: list[list[int]] = []
    for rank_nodes in nodes:
        ids.append(list(range(len(flat), len(flat) + len(rank_nodes))))
        flat.extend(rank_nodes)
    return flat, ids


__all__ = ["HostCopies", "expand"]
