"""Records the simulator kernel writes besides per-action times (transfers: `pipesim.sim.links.Transfer`),
and the GC pause that big runs need while they create them."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass


@contextmanager
def no_gc():
    """Pause Python's cyclic GC: big runs hold ~1M small acyclic objects it would rescan repeatedly."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class CollectiveRecord:
    """A collective on a rank's collective stream (data-parallel / ZeRO, `pipesim.sim.step`)."""

    rank: int
    kind: str  # "all_reduce", "reduce_scatter", "all_gather"; "send_recv": DualPipe's swap of replicas' gradients
    stage: int
    start: float  # seconds
    end: float  # seconds
    nbytes: int  # bytes per device buffer
    after: int = -1  # index of the compute action whose end released it
    prev: CollectiveRecord | None = None  # the collective before it on the same stream
    # pipesim.cost.step_costs.PHASES: "grads", "forward"/"backward" (ZeRO-3 prefetch), "params"; or "replicas"
    # (pipesim.sim.step: the replicated stages' gradients swapped before the optimizer)
    phase: str = "grads"


__all__ = ["CollectiveRecord", "no_gc"]
