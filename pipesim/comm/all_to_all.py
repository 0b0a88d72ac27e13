"""Mixture-of-experts token dispatch and combine (the expert-parallel all-to-alls) timed on the node/network hierarchy.

Think of a sorting office: every rank holds T letters (tokens), each addressed to k of E desks (experts)
spread evenly over the ep ranks. How much mail crosses the building's corridors (NVLink/NVSwitch) and
how much leaves by each rank's own van (its InfiniBand NIC) depends on how the office bundles it:

- kernel "nccl": Megatron-core's `alltoall` token dispatcher over NCCL. It permutes each token's k
  copies (one per expert, `num_out_tokens = tokens x topk`) and sends each rank the copies for its
  experts (`input_splits` = tokens per expert summed per rank; NVIDIA/Megatron-LM
  megatron/core/transformer/moe/token_dispatcher.py, `MoEAlltoAllTokenDispatcher.preprocess`): no
  deduplication. Under uniform routing each copy lands on a given rank with chance 1/ep, so a rank
  receives T k / ep copies from every rank: (g - 1) of those senders share its node (NVLink), ep - g
  do not (NIC). The same split as `collective_algos`' all_to_all on S = T k h b bytes.
- kernel "deepep": DeepEP's normal (high-throughput) kernels (deepseek-ai/DeepEP, V1, docs/legacy.md).
  A token goes once to each rank that holds at least one of its experts (`is_token_in_rank`, one row
  per rank). Across nodes it crosses InfiniBand once per destination node, to the GPU with the same
  local index there, which forwards it over NVLink to the GPUs of that node that need it (DeepSeek-V3
  technical report, arXiv:2412.19437, section 3.2.2); the sender's own node is reached without the NIC.
- kernel "hybridep": NVIDIA's Hybrid-EP in DeepEP (its hybrid-ep branch, docs/README_Hybrid-EP.md and
  Hybrid-EP_Implementation.md), Megatron-core's flex dispatcher with `--moe-flex-dispatcher-backend hybridep`:
  the same hierarchy (RDMA across NVLink domains, TMA copies over NVLink inside one) and the same bytes as DeepEP's
  rule below, its bandwidth metric the received bytes too (`dispatched_hidden.numel() * 2` in its
  tests/test_hybrid_ep.py). Its kernels hold fewer SMs by default: 24 for dispatch and for combine inside one NVLink
  domain, 8 across domains (csrc/hybrid_ep/config.cuh, `num_sms_dispatch_api.value_or(...)`).

With p the chance that a token hits a given rank and q that it hits a given node (uniform routing,
`hit_probabilities`), g ranks per node on N nodes, h elements of b bytes, the slowest rank's bytes
(times `imbalance`, its received tokens over the mean) are

    nccl:    intra = (g - 1) T k h b / ep      inter = (ep - g) T k h b / ep      received = T k h b
    deepep:  intra = N (g - 1) T p h b         inter = (N - 1) T q h b            received = N g T p h b

and the time is latency + max(NVLink part, NIC part), both running at once. NCCL's NVLink part is
intra / B_intra; DeepEP's is received / B_intra: DeepEP moves a rank's own tokens through the same
buffers and counts them in the bandwidth it publishes (`recv_x.numel()` in tests/legacy/test_intranode.py;
its V2 README: "the results are logical bandwidth"). The NIC part is inter / B_inter (one NIC per GPU;
a shared NIC or medium divided by g). Combine is the dispatch reversed: the same bytes, in BF16 in
DeepEP even after an FP8 dispatch. DeepEP's published H800 table is reproduced within 15 % by this
rule on the links' effective figures (docs/moe.md, "Timing the all-to-alls"; tests/test_all_to_all.py).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from math import comb

from pipesim.comm.collective_algos import BASE_LATENCY, HW_LATENCY, PROTOCOLS, US, group_shape, link_kind
from pipesim.device.profile import device_profile
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware, LinkClass

KERNELS = ("nccl", "deepep", "hybridep")
# DeepEP's FP8 dispatch: one e4m3 byte per element plus a float32 scale per 128 elements (per_token_cast_to_fp8;
# its tests count FP8 bytes as BF16's x (1 + 4 / 128) / 2)
FP8_SCALED_BYTES = 1 + 4 / 128
# DeepEP V1 normal kernels: `Buffer.set_num_sms(24)` (docs/legacy.md), num_sms = 24 in tests/legacy/test_intranode.py
# and test_internode.py, the runs behind its published table
DEEPEP_SMS = 24
# Hybrid-EP's dispatch and combine kernels (deepseek-ai/DeepEP hybrid-ep csrc/hybrid_ep/config.cuh): 24 SMs inside one
# NVLink domain, 8 when the group spans several (its RDMA path)
HYBRIDEP_SMS, HYBRIDEP_SMS_ACROSS = 24, 8


@dataclass(frozen=True)
class AllToAllTime:
    """One dispatch or combine over an expert-parallel group, as its slowest rank sees it (bytes: expected values)."""

    what: str  # "dispatch" | "combine"
    kernel: str  # "nccl" | "deepep" | "hybridep"
    seconds: float  # latency + the slower of the NVLink and NIC parts (they run at once)
    latency: float  # seconds of the latency term
    intra_bytes: float  # over NVLink/NVSwitch from (combine: to) the other GPUs of its node
    inter_bytes: float  # over its NIC from (combine: to) other nodes
    received_bytes: float  # all the dispatch brings it, its own tokens included (the combine sends the same back)
    sms: int  # SMs the kernel holds while it runs (the GEMMs beside it lose them)


def hit_probabilities(experts_per_rank: int, ranks_per_node: int, nodes: int, top_k: int,
                      node_limit: int | None = None) -> tuple[float, float]:
    """(p, q): the chance that a token's top_k distinct experts, drawn uniformly, include one of a given rank's (p)
    and one of a given node's (q). Experts e per rank, g ranks per node, N nodes, E = e g N:

        p = 1 - C(E - e, k) / C(E, k)          q = 1 - C(E - g e, k) / C(E, k)

    Node-limited routing (DeepSeek-V3: at most M = `node_limit` nodes per token, M < min(N, k)): the router picks
    the M nodes by their experts' scores, so each picked node holds one of the token's experts at least and a token
    reaches exactly M nodes (DeepEP's benchmark gating does: 3.98 of 4 on EP 64); its k experts are uniform over the
    M nodes' P = M g e experts:

        q = M / N                              p = (M / N) (1 - C(P - e, k) / C(P, k))
    """
    e, g, n, k = experts_per_rank, ranks_per_node, nodes, top_k
    total = e * g * n
    if node_limit is not None and node_limit < min(n, k):
        pool = node_limit * g * e
        if k > pool:
            raise PipesimError(f"top_k {k} exceeds the {pool} experts on node_limit {node_limit} nodes of {g * e}")
        share = node_limit / n
        return share * (1 - comb(pool - e, k) / comb(pool, k)), share
    return 1 - comb(total - e, k) / comb(total, k), 1 - comb(total - g * e, k) / comb(total, k)


def dispatch_time(hw: Hardware, devices: list[int], tokens: int, hidden: int, top_k: int, experts: int, *,
                  dtype_bytes: float = 2.0, imbalance: float = 1.0, node_limit: int | None = None,
                  kernel: str = "nccl") -> AllToAllTime:
    """Seconds and bytes of one MoE dispatch over the ep group `devices` (global device ids, in ep-rank order).

    Each rank routes `tokens` tokens of `hidden` elements of `dtype_bytes` bytes (bf16 2; DeepEP's FP8 dispatch
    `FP8_SCALED_BYTES`) to `top_k` of `experts` experts, E / ep on each rank; `imbalance` is the most-loaded rank's
    received tokens over the mean (>= 1); `node_limit` caps the nodes a token reaches (DeepSeek-V3's 4; it changes
    DeepEP's bytes, not Megatron's k copies); `kernel` "nccl" or "deepep" (module docstring).
    """
    return _checked("dispatch", hw, devices, tokens, hidden, top_k, experts, dtype_bytes, imbalance, node_limit,
                    kernel)


def combine_time(hw: Hardware, devices: list[int], tokens: int, hidden: int, top_k: int, experts: int, *,
                 dtype_bytes: float = 2.0, imbalance: float = 1.0, node_limit: int | None = None,
                 kernel: str = "nccl") -> AllToAllTime:
    """Seconds and bytes of the combine that brings the dispatch's tokens back: the same bytes, reversed (DeepEP
    combines in BF16 after an FP8 dispatch, so `dtype_bytes` stays 2 there). Arguments as `dispatch_time`."""
    return _checked("combine", hw, devices, tokens, hidden, top_k, experts, dtype_bytes, imbalance, node_limit,
                    kernel)


def _checked(what: str, hw: Hardware, devices: list[int], tokens: int, hidden: int, top_k: int, experts: int,
             dtype_bytes: float, imbalance: float, node_limit: int | None, kernel: str) -> AllToAllTime:
    if kernel not in KERNELS:
        raise PipesimError(f"unknown all-to-all kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    for name, value, low in (("tokens", tokens, 0), ("hidden", hidden, 1), ("top_k", top_k, 1),
                             ("experts", experts, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise PipesimError(f"an all-to-all needs {name} an integer >= {low}, got {value!r}")
    if top_k > experts:
        raise PipesimError(f"top_k {top_k} exceeds the {experts} experts")
    group_shape(hw, list(devices))  # one-line errors: empty, repeated, off the machine, no [inter] link across nodes
    if experts % len(devices) != 0:
        raise PipesimError(f"{experts} experts do not shard evenly over ep {len(devices)} ranks")
    if not _finite(dtype_bytes) or not dtype_bytes > 0:
        raise PipesimError(f"dtype_bytes must be > 0, got {dtype_bytes!r}")
    if not _finite(imbalance) or not imbalance >= 1:
        raise PipesimError(f"imbalance is the most-loaded rank's tokens over the mean, >= 1, got {imbalance!r}")
    if node_limit is not None and (not isinstance(node_limit, int) or isinstance(node_limit, bool) or node_limit < 1):
        raise PipesimError(f"node_limit must be a positive integer or None, got {node_limit!r}")
    return _exchange(what, hw, tuple(devices), tokens, hidden, top_k, experts, float(dtype_bytes), float(imbalance),
                     node_limit, kernel)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@functools.lru_cache(maxsize=1 << 14)
def _exchange(what: str, hw: Hardware, devices: tuple[int, ...], tokens: int, hidden: int, top_k: int, experts: int,
              dtype_bytes: float, imbalance: float, node_limit: int | None, kernel: str) -> AllToAllTime:
    """The all-to-all once its arguments are checked; cached (the simulator asks it for every MoE action)."""
    ep = len(devices)
    if ep == 1:
        return AllToAllTime(what, kernel, 0.0, 0.0, 0.0, 0.0, 0.0, 0)  # Megatron skips the all-to-all with ep 1
    per_node = Counter(hw.node_of(d) for d in devices)
    nodes = len(per_node)
    token = hidden * dtype_bytes  # bytes per token on the wire
    if kernel == "nccl":
        g = _nccl_slowest(hw, per_node, ep)
        received = tokens * top_k * token  # each rank sends T k copies, 1 / ep of them to every rank
        intra, inter = (g - 1) * received / ep, (ep - g) * received / ep
        nvlink = intra
        latency = _nccl_latency(hw, nodes)
        sms = device_profile(hw.device.family).nccl_channels if hw.device.family else 0
    else:
        _check_deepep(hw, per_node, "Hybrid-EP" if kernel == "hybridep" else "DeepEP")
        g = ep // nodes
        p, q = hit_probabilities(experts // ep, g, nodes, top_k, node_limit)
        intra = nodes * (g - 1) * tokens * p * token
        inter = (nodes - 1) * tokens * q * token
        received = nodes * g * tokens * p * token
        nvlink = received  # DeepEP's buffers carry the rank's own tokens too (module docstring)
        latency = hw.intra.latency + (hw.inter.latency if nodes > 1 and hw.inter is not None else 0.0)
        sms = DEEPEP_SMS if kernel == "deepep" else HYBRIDEP_SMS if nodes == 1 else HYBRIDEP_SMS_ACROSS
    busy = _busy(hw, g, nvlink, inter) * imbalance
    return AllToAllTime(what, kernel, latency + busy, latency, intra * imbalance, inter * imbalance,
                        received * imbalance, sms)


def _per_rank(link: LinkClass, ranks_on_node: int) -> float:
    """Bytes/s one rank gets from a link: its own (switched, one NIC per GPU), or a shared medium's share."""
    return link.bandwidth / ranks_on_node if link.shared else link.bandwidth


def _busy(hw: Hardware, g: int, nvlink: float, inter: float) -> float:
    """Seconds of the slower part: `nvlink` bytes over the intra link, `inter` over the NIC, at once (g ranks on the
    rank's node share a shared medium)."""
    nic = inter / _per_rank(hw.inter, g) if inter and hw.inter is not None else 0.0
    return max(nvlink / _per_rank(hw.intra, g), nic)


def _nccl_slowest(hw: Hardware, per_node: Counter, ep: int) -> int:
    """Ranks on the node of the slowest rank under Megatron's k copies (each rank gets 1 / ep of every rank's):
    with nodes holding different numbers of the group's ranks, the one whose slower part takes longest."""
    return max((_busy(hw, g, g - 1, ep - g), g) for g in sorted(set(per_node.values())))[1]


def _nccl_latency(hw: Hardware, nodes: int) -> float:
    """NCCL's start-up of one all-to-all: base + one Simple-protocol hop of the farthest link (as collective_algos)."""
    far = hw.inter if nodes > 1 and hw.inter is not None else hw.intra
    kind = link_kind(far)
    if kind is None:  # links NCCL's tuner does not model (loopback): the link's own latency
        return far.latency
    simple = PROTOCOLS.index("Simple")
    return (BASE_LATENCY["ring"][simple] + HW_LATENCY[kind]["ring"][simple]) * US


def _check_deepep(hw: Hardware, per_node: Counter, name: str = "DeepEP") -> None:
    """DeepEP (and Hybrid-EP, `name`) needs NVLink inside a node and RDMA across nodes (its README), and a rail peer on
    every node."""
    if link_kind(hw.intra) != "nvlink" or hw.host is not None:
        raise PipesimError(f"{name}'s kernels need NVLink inside a node; hardware {hw.name!r} has {hw.intra.name}")
    if len(per_node) > 1:
        if hw.inter is None or link_kind(hw.inter) != "net":
            raise PipesimError(f"{name}'s kernels need an RDMA network across nodes; hardware {hw.name!r} has "
                               f"{hw.inter.name if hw.inter else 'none'}")
        if len(set(per_node.values())) > 1:
            raise PipesimError(f"{name} forwards through the same local rank on every node: the ep group needs as "
                               f"many ranks on each node, got {dict(sorted(per_node.items()))}")


__all__ = ["DEEPEP_SMS", "FP8_SCALED_BYTES", "HYBRIDEP_SMS", "HYBRIDEP_SMS_ACROSS", "KERNELS", "AllToAllTime",
           "combine_time", "dispatch_time", "hit_probabilities"]
