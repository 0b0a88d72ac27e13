"""Ranks that share a host's CPU cores: how much slower a compute action runs when others compute too.

Picture a kitchen with `host_cores` stoves and one cook per rank. While there are at least as many
stoves as cooks, each cook works at full speed, less a little for the shared fridge and sink
(memory bandwidth, caches, gloo's progress threads): `node_corun_slowdown` per other busy cook.
With more busy cooks than stoves, they take turns, so each runs at cores / busy speed. And a
kitchen with more cooks than stoves is slower even when few of them cook at once: every switch
between cooks on a stove refills the caches, and every message needs its cook to get a stove
back: `oversubscription_slowdown` per rank beyond the cores, on every compute action.

The simulator asks at the start of each compute action how many other ranks on the same node are
computing at that moment. Calibration fits `node_corun_slowdown` with the same rule on runs where
every rank has a core, and `oversubscription_slowdown` on one run with more ranks than cores; the
turn-taking factor is not fitted at all. Applies only to hardware with `host_cores` set.
"""

from __future__ import annotations

from typing import Any


def slowdown(others: int, cores: int, corun: float, extra_ranks: int = 0, oversub: float = 0.0) -> float:
    """Factor on a compute action's seconds when `others` other ranks on its node are computing.

    `extra_ranks`: ranks on the node beyond its cores (whether busy or not), each costing `oversub`.
    """
    busy = others + 1
    share = busy / cores if busy > cores else 1.0
    return (1.0 + corun * min(others, cores - 1)) * share * (1.0 + oversub * max(0, extra_ranks))


class HostContention:
    """Per-run state for the simulator: when each rank's current compute ends, and its node."""

    def __init__(self, nodes: list[int], cores: int, corun: float, oversub: float = 0.0) -> None:
        self.nodes = nodes  # node of each pipeline rank
        self.cores = cores
        self.corun = corun
        self.oversub = oversub
        self.extra = [max(0, nodes.count(n) - cores) for n in nodes]  # ranks beyond the cores, per rank's node
        self.busy_until = [0.0] * len(nodes)  # seconds

    @staticmethod
    def for_run(hw: Any, devices: list[int]) -> HostContention | None:
        """None unless the hardware's compute runs on host cores (`host_cores` set)."""
        if hw is None or getattr(hw, "host_cores", None) is None:
            return None
        return HostContention([hw.node_of(d) for d in devices], hw.host_cores, hw.node_corun_slowdown,
                              hw.oversubscription_slowdown)

    def others(self, rank: int, now: float) -> int:
        node, until = self.nodes[rank], self.busy_until
        return sum(1 for j, n in enumerate(self.nodes) if j != rank and n == node and until[j] > now)

    def scale(self, rank: int, now: float, seconds: float) -> float:
        """Seconds of a compute action starting at `now` on `rank`, after sharing; records its end."""
        f = slowdown(self.others(rank, now), self.cores, self.corun, self.extra[rank], self.oversub)
        d = seconds * f
        self.busy_until[rank] = now + d
        return d


__all__ = ["HostContention", "slowdown"]
