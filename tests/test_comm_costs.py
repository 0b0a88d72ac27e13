"""Ring collective formulas, nccl-tests busbw factors and the two-level all_reduce (formulas.md)."""

from __future__ import annotations

import pytest

from pipesim.comm.collective_costs import (
    KINDS,
    busbw_factor,
    group_collective_time,
    hierarchical_all_reduce_time,
    ring_time,
)
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware


def test_closed_forms():
    s, b, a = 1e9, 1e11, 1e-6
    assert ring_time("all_reduce", 4, s, b, a) == pytest.approx(6e-6 + 1.5e-2, rel=1e-15)
    assert ring_time("reduce_scatter", 4, s, b, a) == pytest.approx(3e-6 + 7.5e-3, rel=1e-15)
    assert ring_time("all_gather", 4, s, b, a) == pytest.approx(3e-6 + 7.5e-3, rel=1e-15)
    assert ring_time("all_to_all", 4, s, b, 0.0) == pytest.approx(7.5e-3, rel=1e-15)
    assert ring_time("broadcast", 4, s, b, 0.0) == ring_time("reduce", 4, s, b, 0.0) == 1e-2
    assert ring_time("send_recv", 2, s, b, a) == a + 1e-2
    assert ring_time("all_reduce", 8, 8e9, 1e9, 0.0) == pytest.approx(14.0, rel=1e-15)  # 2 * 7/8 * 8


@pytest.mark.parametrize("kind", KINDS)
def test_one_rank_costs_nothing(kind):
    assert ring_time(kind, 1, 1e9, 1e9, 1e-3) == 0.0


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_all_reduce_is_reduce_scatter_then_all_gather(n):
    args = (3.3e8, 2.5e10, 7e-6)
    rs_ag = ring_time("reduce_scatter", n, *args) + ring_time("all_gather", n, *args)
    assert ring_time("all_reduce", n, *args) == pytest.approx(rs_ag, rel=1e-15)


def test_busbw_factors():
    assert busbw_factor("all_reduce", 4) == 1.5
    assert busbw_factor("reduce_scatter", 4) == busbw_factor("all_gather", 4) == busbw_factor("all_to_all", 4) == 0.75
    assert busbw_factor("broadcast", 4) == busbw_factor("reduce", 4) == busbw_factor("send_recv", 2) == 1.0
    assert busbw_factor("all_reduce", 1) == 0.0


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "send_recv"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_busbw_of_a_latency_free_ring_is_the_link_bandwidth(kind, n):
    """The point of busbw: algbw x factor recovers the per-link bandwidth, whatever n."""
    s, b = 1e9, 3e10
    algbw = s / ring_time(kind, n, s, b, 0.0)
    assert algbw * busbw_factor(kind, n) == pytest.approx(b, rel=1e-12)


def test_hierarchical_is_rs_in_node_ar_across_ar_then_ag():
    s, n_l, nodes = 8e9, 8, 4
    intra, a_in, inter, a_out = 370e9, 1.9e-6, 47.5e9, 4e-6
    expected = (ring_time("reduce_scatter", n_l, s, intra, a_in) + ring_time("all_reduce", nodes, s / n_l, inter, a_out)
                + ring_time("all_gather", n_l, s, intra, a_in))
    assert hierarchical_all_reduce_time(n_l, nodes, s, intra, a_in, inter, a_out) == expected
    # one node: a flat ring; one device per node: a flat ring over the network
    assert hierarchical_all_reduce_time(n_l, 1, s, intra, a_in, inter, a_out) == pytest.approx(
        ring_time("all_reduce", n_l, s, intra, a_in), rel=1e-15)
    assert hierarchical_all_reduce_time(1, nodes, s, intra, a_in, inter, a_out) == ring_time(
        "all_reduce", nodes, s, inter, a_out)


def test_group_inside_one_node_is_a_flat_intra_ring():
    hw = load_hardware("2x-dgx-h100")
    expected = ring_time("all_reduce", 4, 1e9, 370e9, 1.9e-6)
    assert group_collective_time(hw, "all_reduce", [8, 9, 10, 11], 1e9) == expected
    assert group_collective_time(hw, "all_gather", [3], 1e9) == 0.0


def test_group_across_nodes():
    hw = load_hardware("2x-dgx-h100")
    everyone = list(range(16))
    assert group_collective_time(hw, "all_reduce", everyone, 1e9) == hierarchical_all_reduce_time(
        8, 2, 1e9, 370e9, 1.9e-6, 47.5e9, 4e-6)
    # other collectives, and uneven groups, take a flat ring at min(intra, inter) bandwidth
    assert group_collective_time(hw, "all_gather", everyone, 1e9) == ring_time("all_gather", 16, 1e9, 47.5e9, 4e-6)
    assert group_collective_time(hw, "all_reduce", [0, 1, 8], 1e9) == ring_time("all_reduce", 3, 1e9, 47.5e9, 4e-6)
    # the point of going hierarchical: less traffic on the slow links
    assert group_collective_time(hw, "all_reduce", everyone, 1e9) < ring_time("all_reduce", 16, 1e9, 47.5e9, 4e-6)
    assert group_collective_time(hw, "send_recv", [7, 8], 1e6) == hw.p2p_time(7, 8, 10**6)


def test_shared_medium_splits_bandwidth_between_a_ring_steps_transfers():
    pcie = load_hardware("pcie-4gpu")
    assert group_collective_time(pcie, "all_reduce", [0, 1, 2, 3], 1e9) == ring_time(
        "all_reduce", 4, 1e9, 24e9 / 4, 2.5e-6)
    # loopback is one shared medium: a 2-rank ring's two transfers split it, busbw = half the link
    # (hardware.md, this box: p2p ~1.4 GB/s, 2-rank all_reduce busbw ~0.7 GB/s)
    from dataclasses import replace

    cpu = load_hardware("local-cpu")
    cpu = replace(cpu, intra=replace(cpu.intra, latency=0.0))  # bandwidth term only: exact
    s = 1e8
    busbw = s / group_collective_time(cpu, "all_reduce", [0, 1], s) * busbw_factor("all_reduce", 2)
    assert busbw == pytest.approx(cpu.intra.bandwidth / 2, rel=1e-9)


def test_bad_groups():
    hw = load_hardware("dgx-h100")
    with pytest.raises(PipesimError, match="unknown collective 'allreduce'"):
        group_collective_time(hw, "allreduce", [0, 1], 1.0)
    with pytest.raises(PipesimError, match="repeats a device"):
        group_collective_time(hw, "all_reduce", [0, 0], 1.0)
    with pytest.raises(PipesimError, match="outside"):
        group_collective_time(hw, "all_reduce", [0, 8], 1.0)
    with pytest.raises(PipesimError, match="between two devices"):
        group_collective_time(hw, "send_recv", [0, 1, 2], 1.0)
