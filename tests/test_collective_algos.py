"""Collectives as NCCL runs them (pipesim/comm/collective_algos.py): closed forms on the presets' hierarchies."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesim.comm.collective_algos import ALGOS, PROTOCOLS, algo_time, bus_bandwidth, collective_time, group_shape
from pipesim.comm.collective_costs import KINDS, group_collective_time
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware

US = 1e-6
GiB = 2**30
DGX = load_hardware("dgx-h100")  # 8 GPUs, NVSwitch 370 GB/s effective
TWO = load_hardware("2x-dgx-h100")  # 2 nodes, one 47.5 GB/s NIC per GPU (rail-optimised)
NODE = list(range(8))


@pytest.mark.parametrize("kind", KINDS)
def test_cpu_hardware_keeps_comm_costs_results(kind):
    cpu = load_hardware("local-cpu")
    devices = [0, 1] if kind == "send_recv" else list(range(min(4, cpu.num_devices)))
    got = collective_time(kind, 4 * 2**20, devices, cpu)
    assert got.seconds == group_collective_time(cpu, kind, devices, 4 * 2**20) and got.algo == "comm_costs"


def test_ring_all_reduce_in_a_node_is_nccls_latency_plus_the_bus_bandwidth_term():
    s = GiB
    simple = collective_time("all_reduce", s, NODE, DGX, algo="ring", protocol="Simple")
    assert simple.latency == pytest.approx((8.4 + 14 * 3.4) * US)  # base + 2(n-1) NVLink steps
    assert simple.seconds == pytest.approx(simple.latency + 2 * 7 / 8 * s / 370e9)
    ll128 = collective_time("all_reduce", s, NODE, DGX, algo="ring", protocol="LL128")
    assert ll128.latency == pytest.approx((14.0 + 14 * 1.9) * US) and ll128.bus_bandwidth == 0.92 * 370e9
    best = collective_time("all_reduce", s, NODE, DGX)
    assert (best.algo, best.protocol) == ("ring", "Simple")  # large buffers: the ring at full bandwidth


def test_small_messages_are_latency_bound_and_pick_low_latency_protocols():
    small = collective_time("all_reduce", 8 * 1024, NODE, DGX)
    assert small.protocol == "LL"
    assert small.seconds == min(algo_time("all_reduce", 8 * 1024, group_shape(DGX, NODE), a, p).seconds
                                for a in ALGOS for p in PROTOCOLS)
    assert small.latency / small.seconds > 0.9
    ring_ll = collective_time("all_reduce", 8 * 1024, NODE, DGX, algo="ring", protocol="LL")
    assert ring_ll.latency == pytest.approx((6.6 + 14 * 0.6) * US)


def test_tree_all_reduce_across_nodes_has_log_depth_latency_and_half_the_algorithm_bandwidth():
    everyone = list(range(16))
    tree = collective_time("all_reduce", GiB, everyone, TWO, algo="tree", protocol="Simple")
    assert tree.latency == pytest.approx((8.4 + 2 * (7 * 4.0 + 1 * 14.0)) * US)
    bus = min(370e9, 8 * 47.5e9)
    assert tree.seconds == pytest.approx(tree.latency + 2 * GiB / (0.92 * bus))
    ring = collective_time("all_reduce", GiB, everyone, TWO, algo="ring", protocol="Simple")
    # 2 (n-1) = 30 steps, 2 (nodes-1) = 2 of them over the network; intra steps at least 3 x 1 us net overhead
    assert ring.latency == pytest.approx((8.4 + 28 * 3.4 + 2 * 14.0) * US)
    assert ring.seconds < tree.seconds  # bandwidth-bound: the ring's 2(n-1)/n beats the tree's 2/0.92


def test_rail_optimised_network_uses_every_gpus_nic():
    assert bus_bandwidth(group_shape(TWO, list(range(16)))) == 370e9  # min(NVLink, 8 NICs x 47.5)
    assert bus_bandwidth(group_shape(TWO, [0, 8])) == 47.5e9  # one rank per node: its own NIC
    assert bus_bandwidth(group_shape(TWO, [0, 1, 8, 9])) == 2 * 47.5e9
    one_nic = replace(TWO, inter=replace(TWO.inter, shared=True))
    assert bus_bandwidth(group_shape(one_nic, list(range(16)))) == 47.5e9


def test_one_rank_per_node_exposes_the_tree_network_latency():
    ring = collective_time("all_reduce", 1024, [0, 8], TWO, algo="ring", protocol="LL")
    assert ring.latency == pytest.approx((6.6 + 2 * 5.0) * US)  # both steps cross the network


def test_reduce_scatter_and_all_gather_are_half_an_all_reduce():
    for kind in ("reduce_scatter", "all_gather"):
        t = collective_time(kind, GiB, NODE, DGX, protocol="Simple")
        assert t.algo == "ring" and t.latency == pytest.approx((8.4 + 7 * 3.4) * US)
        assert t.seconds == pytest.approx(t.latency + 7 / 8 * GiB / 370e9)


def test_broadcast_send_recv_all_to_all_and_one_rank():
    b = collective_time("broadcast", GiB, NODE, DGX, protocol="Simple")
    assert b.seconds == pytest.approx((8.4 + 8 * 3.4) * US + GiB / 370e9)
    p2p = collective_time("send_recv", GiB, [0, 8], TWO)
    assert p2p.seconds == TWO.p2p_time(0, 8, GiB)
    a2a = collective_time("all_to_all", 16 * 2**20, list(range(16)), TWO)
    assert a2a.seconds == pytest.approx((8.4 + 14.0) * US + 16 * 2**20 * 8 / 16 / 47.5e9)
    assert collective_time("all_reduce", GiB, [3], DGX).seconds == 0.0


def test_auto_is_never_slower_than_any_explicit_choice():
    for n_bytes in (1024, 2**20, 2**26, 2**30):
        auto = collective_time("all_reduce", n_bytes, list(range(16)), TWO)
        for a in ALGOS:
            for p in PROTOCOLS:
                assert auto.seconds <= collective_time("all_reduce", n_bytes, list(range(16)), TWO, a, p).seconds


def test_bad_requests_are_one_line_errors():
    with pytest.raises(PipesimError, match="unknown collective"):
        collective_time("gossip", 1, NODE, DGX)
    with pytest.raises(PipesimError, match="unknown algorithm"):
        collective_time("all_reduce", 1, NODE, DGX, algo="nvls")
    with pytest.raises(PipesimError, match="unknown protocol"):
        collective_time("all_reduce", 1, NODE, DGX, protocol="LL64")
    with pytest.raises(PipesimError, match="as a ring"):
        collective_time("all_gather", 1, NODE, DGX, algo="tree")
    with pytest.raises(PipesimError, match="repeats"):
        collective_time("all_reduce", 1, [0, 0], DGX)
    with pytest.raises(PipesimError, match="no \\[inter\\]"):
        group_shape(replace(TWO, inter=None), [0, 8])
