"""MoE dispatch and combine timed on the machine hierarchy (pipesim/comm/all_to_all.py): closed forms on small
machines, what the kernels share and do not, and DeepEP's published H800 table."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations
from math import comb

import pytest

from pipesim.comm.all_to_all import (
    DEEPEP_SMS,
    FP8_SCALED_BYTES,
    KERNELS,
    combine_time,
    dispatch_time,
    hit_probabilities,
)
from pipesim.comm.collective_algos import collective_time
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware

US = 1e-6
DGX = load_hardware("dgx-h100")  # one node of 8: NVSwitch 370 GB/s effective per direction
TWO = load_hardware("2x-dgx-h100")  # 2 nodes, one 47.5 GB/s NIC per GPU
SMALL = replace(TWO, name="2x2", devices_per_node=2)  # 2 nodes x 2 GPUs, the same links
T, H, B = 1000, 10, 2  # tokens per rank, hidden, bytes per element: 20 bytes a token
NCCL_LATENCY = {"nvlink": (8.4 + 3.4) * US, "net": (8.4 + 14.0) * US}  # NCCL base + one Simple hop (tuning.cc)


def test_nccl_kernel_is_collective_algos_all_to_all_of_the_k_copies():
    for hw, devices in ((DGX, list(range(8))), (TWO, list(range(16))), (TWO, [0, 1, 8, 9])):
        got = dispatch_time(hw, devices, 4096, 7168, 8, 64)
        nccl = collective_time("all_to_all", 4096 * 8 * 7168 * 2, devices, hw)  # S = T k h b each rank sends
        assert got.seconds == pytest.approx(nccl.seconds, rel=1e-12) and got.latency == pytest.approx(nccl.latency)
        assert got.received_bytes == 4096 * 8 * 7168 * 2 and got.sms == 24  # H100's NCCL channels


def test_two_nodes_of_two_gpus_split_exactly_with_uniform_routing():
    devices = [0, 1, 2, 3]  # 4 experts, one per rank, top 2: a token hits a given rank with p = 1 - C(3,2)/C(4,2) = 1/2
    nccl = dispatch_time(SMALL, devices, T, H, 2, 4)  # Megatron: T k / ep = 500 copies to every rank
    assert (nccl.intra_bytes, nccl.inter_bytes, nccl.received_bytes) == (500 * 20, 2 * 500 * 20, 4 * 500 * 20)
    assert nccl.seconds == pytest.approx(NCCL_LATENCY["net"] + max(10_000 / 370e9, 20_000 / 47.5e9))
    deepep = dispatch_time(SMALL, devices, T, H, 2, 4, kernel="deepep")
    # a node is hit with q = 1 - C(2,2)/C(4,2) = 5/6: once over IB per remote node, then forwarded over NVLink
    assert deepep.inter_bytes == pytest.approx(T * 5 / 6 * 20)  # (N - 1) T q h b
    assert deepep.intra_bytes == pytest.approx(2 * 1 * T / 2 * 20)  # N (g - 1) T p h b: forwarded by the peer
    assert deepep.received_bytes == pytest.approx(4 * T / 2 * 20)  # N g T p h b, its own tokens included
    assert deepep.seconds == pytest.approx((1.9 + 4.0) * US + max(40_000 / 370e9, T * 5 / 6 * 20 / 47.5e9))
    assert deepep.sms == DEEPEP_SMS == 24
    limited = dispatch_time(SMALL, devices, T, H, 2, 4, kernel="deepep", node_limit=1)
    assert limited.inter_bytes == pytest.approx(T / 2 * 20)  # one node per token: half of them remote
    assert limited.received_bytes == pytest.approx(deepep.received_bytes)  # both experts on one node: p stays 1/2


def test_one_node_moves_nothing_over_the_network():
    p = 1 - comb(256 - 32, 8) / comb(256, 8)  # 32 of 256 experts per rank, top 8
    for kernel in KERNELS:
        got = dispatch_time(DGX, list(range(8)), 4096, 7168, 8, 256, kernel=kernel)
        assert got.inter_bytes == 0
    deepep = dispatch_time(DGX, list(range(8)), 4096, 7168, 8, 256, kernel="deepep")
    assert deepep.intra_bytes == pytest.approx(7 * 4096 * p * 7168 * 2)
    assert deepep.seconds == pytest.approx(1.9 * US + 8 * 4096 * p * 7168 * 2 / 370e9)
    nccl = dispatch_time(DGX, list(range(8)), 4096, 7168, 8, 256)
    assert nccl.intra_bytes == 7 / 8 * 4096 * 8 * 7168 * 2 and nccl.latency == pytest.approx(NCCL_LATENCY["nvlink"])


def test_hit_probabilities_match_an_enumeration_of_every_top_k():
    e, g, n, k = 2, 2, 2, 3  # 8 experts on 4 ranks on 2 nodes
    picks = list(combinations(range(8), k))
    rank0 = sum(any(x < e for x in pick) for pick in picks) / len(picks)
    node0 = sum(any(x < e * g for x in pick) for pick in picks) / len(picks)
    assert hit_probabilities(e, g, n, k) == pytest.approx((rank0, node0))
    assert hit_probabilities(e, g, n, k, node_limit=2) == hit_probabilities(e, g, n, k)  # M >= N: no limit
    assert hit_probabilities(e, g, 4, 2, node_limit=3) == hit_probabilities(e, g, 4, 2)  # M >= k: never binds


def test_node_limit_bounds_deepeps_inter_bytes_and_leaves_megatrons_k_copies():
    four = load_hardware("4x-dgx-h100")
    devices, tokens = list(range(32)), 4096
    inter = []
    for m in (1, 2, 3, None):
        got = dispatch_time(four, devices, tokens, 7168, 8, 256, kernel="deepep", node_limit=m)
        if m is not None:
            assert got.inter_bytes == pytest.approx(3 * tokens * m / 4 * 7168 * 2)  # (N - 1) T (M / N) h b
            assert got.inter_bytes <= tokens * m * 7168 * 2  # never more than M node copies a token
        inter.append(got.inter_bytes)
    assert inter == sorted(inter)
    nccl = {m: dispatch_time(four, devices, tokens, 7168, 8, 256, node_limit=m) for m in (1, None)}
    assert nccl[1] == nccl[None]
    assert inter[-1] < nccl[None].inter_bytes  # once per node, not once per expert


def test_time_grows_with_every_load_and_the_combine_mirrors_the_dispatch():
    base = {"tokens": 2048, "hidden": 4096, "top_k": 4, "experts": 64}
    for kernel in KERNELS:
        ref = dispatch_time(TWO, list(range(16)), **base, kernel=kernel)
        for name, bigger in (("tokens", 4096), ("hidden", 7168), ("top_k", 8)):
            assert dispatch_time(TWO, list(range(16)), **{**base, name: bigger}, kernel=kernel).seconds > ref.seconds
        heavy = dispatch_time(TWO, list(range(16)), **base, kernel=kernel, imbalance=1.5)
        assert heavy.seconds - heavy.latency == pytest.approx(1.5 * (ref.seconds - ref.latency))
        assert heavy.inter_bytes == pytest.approx(1.5 * ref.inter_bytes)
        fp8 = dispatch_time(TWO, list(range(16)), **base, kernel=kernel, dtype_bytes=FP8_SCALED_BYTES)
        assert fp8.seconds < ref.seconds
        back = combine_time(TWO, list(range(16)), **base, kernel=kernel)
        assert (back.what, back.seconds, back.inter_bytes) == ("combine", ref.seconds, ref.inter_bytes)
    assert dispatch_time(TWO, [3], **base).seconds == 0  # ep 1: nothing to exchange


def test_uneven_nodes_time_the_rank_alone_on_its_node():
    got = dispatch_time(TWO, [0, 1, 2, 8], 1024, 1024, 2, 8)  # device 8 takes 3 of its 4 shares over its NIC
    assert got.inter_bytes == 3 / 4 * 1024 * 2 * 1024 * 2 and got.intra_bytes == 0


def test_nccl_on_cpu_processes_uses_the_loopback_figures():
    cpu = load_hardware("local-cpu")
    got = dispatch_time(cpu, [0, 1], 64, 32, 1, 2)
    assert got.sms == 0 and got.latency == cpu.intra.latency and got.seconds > got.latency


@pytest.mark.parametrize("hw, devices, kwargs, message", [
    (DGX, [0, 1], {"kernel": "ibgda"}, "unknown all-to-all kernel"),
    (DGX, [0, 1, 2], {}, "do not shard evenly"),
    (DGX, [0, 1], {"top_k": 9, "experts": 8}, "exceeds the 8 experts"),
    (DGX, [0, 1], {"imbalance": 0.5}, "imbalance"),
    (DGX, [0, 1], {"node_limit": 0}, "node_limit"),
    (DGX, [0, 1], {"dtype_bytes": 0}, "dtype_bytes"),
    (DGX, [0, 1], {"tokens": -1}, "tokens"),
    (DGX, [0, 0], {}, "repeats a device"),
    (DGX, [0, 8], {}, "outside hardware"),
    (TWO, [0, 1, 8, 9, 10, 11], {"kernel": "deepep", "experts": 6}, "as many ranks on each node"),
    (load_hardware("pcie-4gpu"), [0, 1], {"kernel": "deepep"}, "need NVLink"),
    (TWO, list(range(16)), {"kernel": "deepep", "node_limit": 1, "top_k": 9, "experts": 16}, "node_limit 1 nodes"),
])
def test_bad_input_is_refused_in_one_line(hw, devices, kwargs, message):
    args = {"tokens": 16, "hidden": 8, "top_k": 2, "experts": 8, **kwargs}
    with pytest.raises(PipesimError, match=message) as err:
        dispatch_time(hw, devices, **args)
    assert "\n" not in str(err.value)


# DeepEP's normal kernels on H800 (deepseek-ai/DeepEP docs/legacy.md at dd758ca, the README's table since
# 3b1045d, 2025-04-22): 4096 tokens per rank, hidden 7168, top-4 groups (nodes), top-8 of 256 experts, FP8
# dispatch, BF16 combine, 24 SMs. "Bottleneck bandwidth": intranode, the bytes a rank receives (its own
# included: recv_x) over the kernel time; internode, the bytes a rank sends to nodes (its own node included:
# num_rdma_token_sent) over it. (dispatch GB/s, combine GB/s)
DEEPEP_H800 = {8: (153, 158), 16: (43, 43), 32: (58, 57), 64: (51, 50)}
# H800: the H100 die with 8 NVLink4 links, 200 GB/s per direction nominal, "actual achievable bandwidth peaks at
# approximately 160GB/s" (DeepEP maintainers, deepseek-ai/DeepEP#16; DeepEP's README "~160 GB/s NVLink maximum");
# one ConnectX-7 400 Gb/s NIC per GPU (DeepEP's README), the dgx-h100 preset's scale-out NIC: 50 GB/s peak, 47.5
# effective (its measured pipeline busbw; DeepEP#155 measures shmem_put_bw of about 47 GB/s between nodes)
H800 = replace(DGX, name="h800", intra=replace(DGX.intra, bandwidth=160e9, peak_bandwidth=200e9))
TOLERANCE = 0.15  # the model is an upper bound: DeepEP reaches 88-99 % of it


@pytest.mark.parametrize("ep", sorted(DEEPEP_H800))
def test_deepeps_published_h800_bandwidths_within_15_percent_from_above(ep):
    nodes = ep // 8
    hw = H800.with_nodes(nodes)
    limit = min(nodes, 4) if nodes > 1 else None  # test_internode.py: num_topk_groups = min(num_nodes, 4)
    for timed, published in ((dispatch_time(hw, list(range(ep)), 4096, 7168, 8, 256, dtype_bytes=FP8_SCALED_BYTES,
                                            node_limit=limit, kernel="deepep"), DEEPEP_H800[ep][0]),
                             (combine_time(hw, list(range(ep)), 4096, 7168, 8, 256, node_limit=limit,
                                           kernel="deepep"), DEEPEP_H800[ep][1])):
        logical = timed.received_bytes if nodes == 1 else timed.inter_bytes * nodes / (nodes - 1)
        modelled = logical / timed.seconds / 1e9
        assert published <= modelled <= published * (1 + TOLERANCE), (ep, timed.what, modelled, published)
