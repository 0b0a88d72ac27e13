"""Collectives as NCCL runs them on a node/network hierarchy: ring and tree, three protocols, latency + bandwidth.

NCCL times each (algorithm, protocol) pair with a latency (a base cost plus a per-step cost for
each link the steps cross) and a bus bandwidth (the link's, scaled by what the protocol wastes),
then runs the fastest (src/graph/tuning.cc). A ring all_reduce takes 2(n-1) steps and moves
2(n-1)/n of the buffer over every link; a tree all_reduce takes 2 (ranks per node - 1) steps in
a node and 2 log2(nodes) across, and moves the buffer up and down (algbw = busbw / 2). Small
messages are latency-bound (the tree and the LL protocol win), large ones bandwidth-bound (the
ring and Simple win). Across nodes on a rail-optimised network every GPU has its own NIC, so a
ring with p ranks per node crosses the network on p NICs at once. Formulas and constants:
docs/gpu_model.md. Hardware without NCCL links (CPU processes on loopback) keeps
`pipesim.comm.collective_costs.group_collective_time`, the model the CPU calibration was fitted with.
`collective_seconds` is the simulator's one dispatch for every collective it times; `scatter_gather`
times Megatron's split pipeline messages (docs/simulator.md).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass

from pipesim.comm.collective_costs import KINDS, group_collective_time
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware, LinkClass

ALGOS = ("ring", "tree")
PROTOCOLS = ("LL", "LL128", "Simple")
US = 1e-6  # seconds per microsecond (NCCL's tables are in us)

# NVIDIA/nccl src/graph/tuning.cc (baseLat, hwLat; microseconds), algorithm x protocol (LL, LL128, Simple)
BASE_LATENCY = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
HW_LATENCY = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
NET_OVERHEAD = 1.0  # us per network step of a ring (getNetOverhead on x86 Intel; x3 with Simple)
# bus bandwidth kept by each protocol (tuning.cc "model refinements"): ring LL x0.5, LL128 x0.92;
# tree all_reduce x0.92, then LL x1/3.8, LL128 x7/9 in one node or x120/128 across nodes
RING_PROTOCOL_BW = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
TREE_ALLREDUCE_BW = 0.92
LINK_KINDS = {"nvlink": "nvlink", "nvswitch": "nvlink", "pcie": "pci", "infiniband": "net", "ethernet": "net",
              "roce": "net", "omnipath": "net"}  # LinkClass.name -> NCCL's hardware class; others have no NCCL model


@dataclass(frozen=True)
class CollectiveTime:
    """One collective's predicted seconds and how NCCL would run it."""

    seconds: float
    algo: str  # "ring" | "tree" | "p2p" | "comm_costs" (no NCCL links: comm_costs' model)
    protocol: str  # "LL" | "LL128" | "Simple" | "" (not an NCCL choice)
    latency: float  # seconds of the latency term
    bus_bandwidth: float  # bytes/s per rank the bandwidth term runs at (after the protocol's factor)


@dataclass(frozen=True)
class GroupShape:
    """Where a collective's ranks sit: n ranks on `nodes` nodes, `per_node` on the busiest."""

    n: int
    nodes: int
    per_node: int
    intra: LinkClass
    inter: LinkClass | None


def link_kind(link: LinkClass) -> str | None:
    """NCCL's hardware class of a link ("nvlink", "pci", "net"), or None for links NCCL does not model."""
    return LINK_KINDS.get(link.name)


def group_shape(hw: Hardware, devices: list[int]) -> GroupShape:
    if not devices:
        raise PipesimError("a collective group needs at least one device")
    if len(set(devices)) != len(devices):
        raise PipesimError(f"collective group {devices} repeats a device")
    per_node = Counter(hw.node_of(d) for d in devices)
    inter = hw.inter if len(per_node) > 1 else None
    if len(per_node) > 1 and inter is None:
        raise PipesimError(f"hardware {hw.name!r} has no [inter] link for a group across nodes")
    return GroupShape(len(devices), len(per_node), max(per_node.values()), hw.intra, inter)


def bus_bandwidth(shape: GroupShape, kind: str = "all_reduce") -> float:
    """Bytes/s per rank a ring or tree of collective `kind` over the group sustains before protocol factors.

    One node: the intra link (a shared medium carries all n ranks' transfers at once: / n).
    Across nodes every byte leaves each node once per ring pass, so the node's NICs must carry a
    rank's whole bus bandwidth: rail-optimised (one NIC per GPU) gives per_node NICs; a shared
    NIC one. The ring runs at min(intra link, NICs x NIC bandwidth); with one rank per node
    there is no intra hop. Each link at its bandwidth for `kind` (LinkClass.kind_bandwidth: a measured
    hardware file's factor per collective, 1 in the presets).
    """
    link = shape.intra.kind_bandwidth(kind)
    intra = link / shape.per_node if shape.intra.shared else link
    if shape.inter is None:
        return intra
    nics = 1 if shape.inter.shared else shape.per_node
    network = nics * shape.inter.kind_bandwidth(kind)
    return network if shape.per_node == 1 else min(intra, network)


def _steps(kind: str, n: int) -> int:
    return 2 * (n - 1) if kind == "all_reduce" else n - 1 if kind in ("reduce_scatter", "all_gather") else n


def ring_latency(kind: str, shape: GroupShape, protocol: str) -> float:
    """Seconds: base + (steps - network steps) x intra latency + network steps x network latency."""
    p = PROTOCOLS.index(protocol)
    intra_kind = link_kind(shape.intra)
    base = BASE_LATENCY["ring"][p]
    steps = _steps(kind, shape.n)
    if kind in ("broadcast", "reduce"):
        hw_kind = intra_kind if shape.inter is None else link_kind(shape.inter)
        return (base + steps * HW_LATENCY[hw_kind]["ring"][p]) * US  # type: ignore[index]
    intra = HW_LATENCY[intra_kind]["ring"][p]  # type: ignore[index]
    if shape.inter is None:
        return (base + steps * intra) * US
    net_algo = "tree" if shape.per_node == 1 else "ring"  # one rank per node: latencies fully exposed
    inter = HW_LATENCY[link_kind(shape.inter)][net_algo][p]  # type: ignore[index]
    intra = max(intra, NET_OVERHEAD * (3 if protocol == "Simple" else 1))
    net_steps = 2 * (shape.nodes - 1) if kind == "all_reduce" else shape.nodes - 1
    return (base + (steps - net_steps) * intra + net_steps * inter) * US


def tree_latency(shape: GroupShape, protocol: str) -> float:
    """Seconds of a tree all_reduce: base + 2 ((ranks per node - 1) intra + floor(log2 nodes) network)."""
    p = PROTOCOLS.index(protocol)
    intra = HW_LATENCY[link_kind(shape.intra)]["tree"][p]  # type: ignore[index]
    inter = HW_LATENCY[link_kind(shape.inter)]["tree"][p] if shape.inter is not None else 0.0  # type: ignore[index]
    depth = int(math.log2(shape.nodes)) if shape.nodes > 1 else 0
    return (BASE_LATENCY["tree"][p] + 2 * ((shape.per_node - 1) * intra + depth * inter)) * US


def algo_time(kind: str, nbytes: float, shape: GroupShape, algo: str, protocol: str) -> CollectiveTime:
    """Seconds of `kind` on S = nbytes with one (algorithm, protocol) pair (tree: all_reduce only)."""
    bus = bus_bandwidth(shape, kind)
    if algo == "ring":
        bw = bus * RING_PROTOCOL_BW[protocol]
        moved = 2 * (shape.n - 1) / shape.n if kind == "all_reduce" else \
            (shape.n - 1) / shape.n if kind in ("reduce_scatter", "all_gather") else 1.0  # x S over each link
        latency = ring_latency(kind, shape, protocol)
        return CollectiveTime(latency + moved * nbytes / bw, "ring", protocol, latency, bw)
    if algo != "tree" or kind != "all_reduce":
        raise PipesimError(f"NCCL runs {kind} as a ring, not a {algo}")
    bw = bus * TREE_ALLREDUCE_BW
    if protocol == "LL":
        bw /= 3.8
    elif protocol == "LL128":
        bw *= 7 / 9 if shape.inter is None else 120 / 128
    latency = tree_latency(shape, protocol)
    return CollectiveTime(latency + 2 * nbytes / bw, "tree", protocol, latency, bw)  # algbw = busbw / 2


def _all_to_all(nbytes: float, shape: GroupShape) -> CollectiveTime:
    """Each rank sends S/n to every other rank at once: node-local parts over the intra link, the rest over its NIC."""
    local = nbytes * (shape.per_node - 1) / shape.n
    remote = nbytes * (shape.n - shape.per_node) / shape.n
    intra = shape.intra.bandwidth / shape.per_node if shape.intra.shared else shape.intra.bandwidth
    times = [local / intra]
    latency = BASE_LATENCY["ring"][2] * US
    if shape.inter is not None:
        nic = shape.inter.bandwidth / shape.per_node if shape.inter.shared else shape.inter.bandwidth
        times.append(remote / nic)
        latency += HW_LATENCY[link_kind(shape.inter)]["ring"][2] * US  # type: ignore[index]
    else:
        latency += HW_LATENCY[link_kind(shape.intra)]["ring"][2] * US  # type: ignore[index]
    return CollectiveTime(latency + max(times), "p2p", "Simple", latency, nbytes / max(max(times), 1e-30))


def collective_time(kind: str, nbytes: float, group_devices: list[int], hw: Hardware, algo: str = "auto",
                    protocol: str = "auto") -> CollectiveTime:
    """Seconds of collective `kind` over `group_devices` (global ids) on S = `nbytes` (nccl-tests' whole buffer).

    algo "auto" (the fastest ring or tree, as NCCL's tuner picks), "ring" or "tree"; protocol
    "auto", "LL", "LL128" or "Simple". send_recv is one transfer (Hardware.p2p_time); all_to_all
    concurrent transfers. On hardware whose links NCCL does not model (CPU loopback) the result
    is pipesim.comm.collective_costs' (algo "comm_costs"), unchanged.
    """
    if kind not in KINDS:
        raise PipesimError(f"unknown collective {kind!r}; choose one of {', '.join(KINDS)}")
    if algo not in ("auto", *ALGOS):
        raise PipesimError(f"unknown algorithm {algo!r}; choose auto, {', '.join(ALGOS)}")
    if protocol not in ("auto", *PROTOCOLS):
        raise PipesimError(f"unknown protocol {protocol!r}; choose auto, {', '.join(PROTOCOLS)}")
    if nbytes < 0:
        raise PipesimError(f"a collective moves bytes >= 0, got {nbytes}")
    return _collective_time(kind, nbytes, tuple(group_devices), hw, algo, protocol)


@functools.lru_cache(maxsize=1 << 16)
def _collective_time(kind: str, nbytes: float, group_devices: tuple[int, ...], hw: Hardware, algo: str,
                     protocol: str) -> CollectiveTime:
    """`collective_time` once its arguments are checked; cached, since a simulation asks the same question for
    every action of a stage and the planner for every candidate (the result is immutable)."""
    group = list(group_devices)
    shape = group_shape(hw, group)
    links = [shape.intra] + ([shape.inter] if shape.inter is not None else [])
    if any(link_kind(link) is None for link in links) or hw.host is not None:
        seconds = group_collective_time(hw, kind, group, nbytes)
        return CollectiveTime(seconds, "comm_costs", "", 0.0, 0.0)
    if kind == "send_recv":
        if shape.n != 2:
            raise PipesimError(f"send_recv is between two devices, got {group}")
        link = hw.link_between(group_devices[0], group_devices[1])
        return CollectiveTime(hw.p2p_time(group_devices[0], group_devices[1], int(nbytes)), "p2p", "", link.latency,
                              link.bandwidth)
    if shape.n == 1:
        return CollectiveTime(0.0, "ring", "Simple", 0.0, bus_bandwidth(shape))
    if kind == "all_to_all":
        return _all_to_all(nbytes, shape)
    algos = [algo] if algo != "auto" else (list(ALGOS) if kind == "all_reduce" else ["ring"])
    protocols = [protocol] if protocol != "auto" else list(PROTOCOLS)
    return min((algo_time(kind, nbytes, shape, a, p) for a in algos for p in protocols), key=lambda c: c.seconds)


def collective_seconds(hw: Hardware, kind: str, devices: list[int], nbytes: float) -> float:
    """Seconds of `kind` over `devices` on S = `nbytes`: the simulator's one dispatch for every collective.

    NCCL's fastest (algorithm, protocol) on hardware whose links NCCL models (GPU presets);
    `pipesim.comm.collective_costs.group_collective_time`, bit for bit, on the others (CPU processes on loopback).
    """
    return collective_time(kind, nbytes, devices, hw).seconds


@dataclass(frozen=True)
class ScatterGather:
    """One pipeline message sent Megatron's way: split over the t ranks of the sending stage, each part over
    its own link (rail), then all-gathered by the t ranks of the receiving stage."""

    rail_bytes: int  # bytes one held link carries: S / t (a shared medium carries all t parts: S)
    send: float  # seconds the parts take on their links (they move side by side)
    gather: float  # seconds of the receiving stage's all_gather of S inside its tp group


def scatter_gather(hw: Hardware, src: list[int], dst: list[int], nbytes: int) -> ScatterGather:
    """Megatron's `scatter_gather_tensors_in_pipeline` for an S = `nbytes` message from tp group `src` to `dst`
    (tp rank j sends to tp rank j). Each rank sends S / t (Megatron splits the flattened tensor in t equal
    chunks) in latency + S / (t B); on a shared medium the t parts queue on it: latency + S / B. Then
    all_gather(S) over `dst` (`collective_seconds`)."""
    if len(src) != len(dst) or not src:
        raise PipesimError(f"scatter/gather needs tp groups of one size, got {src} and {dst}")
    t = len(src)
    part = nbytes // t  # bytes per tp rank
    link = hw.link_between(src[0], dst[0])
    rail = part * t if link.shared else part
    return ScatterGather(rail, hw.p2p_time(src[0], dst[0], rail), collective_seconds(hw, "all_gather", dst,
                                                                                       part * t))


__all__ = ["ALGOS", "BASE_LATENCY", "HW_LATENCY", "PROTOCOLS", "CollectiveTime", "GroupShape", "ScatterGather",
           "algo_time", "bus_bandwidth", "collective_seconds", "collective_time", "group_shape", "link_kind",
           "ring_latency", "scatter_gather", "tree_latency"]
