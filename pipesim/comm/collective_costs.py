"""Collective costs: ring formulas (alpha-beta), nccl-tests bus-bandwidth factors, two-level all_reduce.

A ring collective on n ranks moves each byte over (n-1)/n of the ring per phase; all_reduce is a
reduce_scatter then an all_gather (two phases). Across nodes the slow links dominate, so all_reduce
goes hierarchically: reduce_scatter in each node, all_reduce across nodes on S/n_l, all_gather in
each node. Formulas and factors follow shared/reference/formulas.md; see docs/cost_model.md.
"""

from __future__ import annotations

from collections import Counter

from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware, LinkClass

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "send_recv")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise PipesimError(f"unknown collective {kind!r}; choose one of {', '.join(KINDS)}")


def ring_time(kind: str, n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds of one ring collective on n ranks over `nbytes` (the whole buffer, S).

    bandwidth: bytes/s per direction per link; latency: seconds per ring step. n = 1 costs 0.
    all_reduce 2(n-1)a + 2(n-1)/n S/B; reduce_scatter, all_gather (n-1)a + (n-1)/n S/B;
    all_to_all (n-1)a + (n-1)/n S/B; broadcast, reduce (pipelined) (n-1)a + S/B; send_recv a + S/B.
    """
    _check_kind(kind)
    if n < 1:
        raise PipesimError(f"a collective needs at least one rank, got n = {n}")
    if n == 1:
        return 0.0
    steps = n - 1
    if kind == "all_reduce":
        return 2 * steps * latency + 2 * steps / n * nbytes / bandwidth
    if kind in ("reduce_scatter", "all_gather", "all_to_all"):
        return steps * latency + steps / n * nbytes / bandwidth
    if kind in ("broadcast", "reduce"):
        return steps * latency + nbytes / bandwidth
    return latency + nbytes / bandwidth  # send_recv


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests factor f with busbw = algbw * f (algbw = S / t): the per-link bandwidth the ring reached."""
    _check_kind(kind)
    if n < 1:
        raise PipesimError(f"a collective needs at least one rank, got n = {n}")
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


def hierarchical_all_reduce_time(n_local: int, n_nodes: int, nbytes: float, intra_bw: float, intra_lat: float,
                                 inter_bw: float, inter_lat: float) -> float:
    """Two-level all_reduce: reduce_scatter in node, all_reduce across nodes on S/n_l, all_gather in node.

    The n_l cross-node all_reduces (one per local shard) run side by side, each over its own NIC.
    """
    rs = ring_time("reduce_scatter", n_local, nbytes, intra_bw, intra_lat)
    ar = ring_time("all_reduce", n_nodes, nbytes / n_local, inter_bw, inter_lat)
    ag = ring_time("all_gather", n_local, nbytes, intra_bw, intra_lat)
    return rs + ar + ag


def _ring_bandwidth(link: LinkClass, concurrent: int) -> float:
    """Bytes/s one ring transfer gets: the link's own, or a 1/concurrent share of a shared medium."""
    return link.bandwidth / concurrent if link.shared else link.bandwidth


def group_collective_time(hw: Hardware, kind: str, devices: list[int], nbytes: float) -> float:
    """Uncontended seconds of `kind` over `devices` (global device ids) on `nbytes` (whole buffer, S).

    One node: a flat ring over the intra link. Several nodes with the same number of devices each:
    all_reduce goes hierarchically; other collectives (and uneven groups) use a flat ring at
    min(intra, inter) bandwidth and max latency. A shared medium (PCIe through the host, loopback)
    carries all of a ring step's transfers at once, so each gets bandwidth / transfers.
    """
    _check_kind(kind)
    if len(set(devices)) != len(devices):
        raise PipesimError(f"collective group {devices} repeats a device")
    if not devices:
        raise PipesimError("a collective group needs at least one device")
    n = len(devices)
    if kind == "send_recv":
        if n != 2:
            raise PipesimError(f"send_recv is between two devices, got {devices}")
        return hw.p2p_time(devices[0], devices[1], int(nbytes))
    per_node = Counter(hw.node_of(d) for d in devices)
    if n == 1:
        return 0.0
    if len(per_node) == 1:
        # concurrent transfers on one shared node medium: n per ring step (one for broadcast/reduce pipelines too)
        return ring_time(kind, n, nbytes, _ring_bandwidth(hw.intra, n), hw.intra.latency)
    inter = hw.link_between(devices[0], next(d for d in devices if hw.node_of(d) != hw.node_of(devices[0])))
    counts = set(per_node.values())
    if kind == "all_reduce" and len(counts) == 1:
        n_local = counts.pop()
        n_nodes = len(per_node)
        # each node's n_local shards cross the network side by side: own NIC each, or a share of a shared one
        return hierarchical_all_reduce_time(n_local, n_nodes, nbytes, _ring_bandwidth(hw.intra, n_local),
                                            hw.intra.latency, _ring_bandwidth(inter, n_local), inter.latency)
    busiest = max(per_node.values())
    bandwidth = min(_ring_bandwidth(hw.intra, busiest), _ring_bandwidth(inter, 1))
    return ring_time(kind, n, nbytes, bandwidth, max(hw.intra.latency, inter.latency))


__all__ = ["KINDS", "busbw_factor", "group_collective_time", "hierarchical_all_reduce_time", "ring_time"]
