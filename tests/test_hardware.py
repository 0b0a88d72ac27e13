"""Hardware presets, the TOML format (strict errors, exact round trip), links and the roofline."""

from __future__ import annotations

import dataclasses

import pytest

from pipesim.cost.cost_equation import CostEquation, SplitCosts, action_seconds
from pipesim.errors import PipesimError
from pipesim.hardware.machine import DeviceSpec, Hardware, HostProfile, LinkClass
from pipesim.hardware.toml_io import hardware_to_toml, load_hardware, preset_names

PRESETS = ["2x-dgx-h100", "4x-dgx-h100", "dgx-a100", "dgx-h100", "gb200-nvl72", "gb300-nvl72", "hgx-b200", "hgx-b300",
           "hgx-h200", "local-cpu", "pcie-4gpu"]


def test_presets_all_load_and_round_trip(tmp_path):
    assert preset_names() == PRESETS
    for name in PRESETS:
        hw = load_hardware(name)
        assert hw.name == name
        assert hw.source
        path = tmp_path / f"{name}.toml"
        path.write_text(hardware_to_toml(hw))
        assert load_hardware(str(path)) == hw


def test_preset_figures_match_reference():
    h100 = load_hardware("dgx-h100")
    assert h100.device.flops["bfloat16"] == 989e12
    assert (h100.intra.bandwidth, h100.intra.peak_bandwidth) == (370e9, 450e9)
    assert h100.device.hbm_bandwidth == 3.35e12
    assert load_hardware("dgx-a100").intra.peak_bandwidth == 300e9
    assert load_hardware("hgx-h200").device.hbm_bandwidth == 4.8e12
    assert load_hardware("hgx-b200").intra.peak_bandwidth == 900e9
    pcie = load_hardware("pcie-4gpu")
    assert pcie.intra.shared and pcie.intra.peak_bandwidth == 31.5e9 and pcie.num_devices == 4
    four = load_hardware("4x-dgx-h100")
    assert (four.num_nodes, four.num_devices, four.inter.peak_bandwidth) == (4, 32, 50e9)
    cpu = load_hardware("local-cpu")
    assert (cpu.host.cores, cpu.intra.shared, cpu.intra.name) == (2, True, "loopback")
    assert all(load_hardware(name).host is None for name in PRESETS if name != "local-cpu")  # GPUs: no host


def test_round_trip_keeps_unusual_values(tmp_path):
    hw = Hardware(
        name='odd "name"', device=DeviceSpec("x", {"float32": 1.0000000000000002e10}, 1.5, 3, 0.123456789),
        devices_per_node=3, num_nodes=2, intra=LinkClass("a", 1e-300 + 1, 2.5, 0.0, True),
        inter=LinkClass("b", 7.0, 9.0, 1.25e-7), per_action_overhead=3e-9, source="line\\with \\ slash",
        host=HostProfile(cores=5, late_recv_delay=0.1 + 0.2),
    )
    path = tmp_path / "odd.toml"
    path.write_text(hardware_to_toml(hw))
    assert load_hardware(str(path)) == hw


def test_nodes_links_and_resources():
    hw = load_hardware("2x-dgx-h100")
    assert [hw.node_of(d) for d in (0, 7, 8, 15)] == [0, 0, 1, 1]
    assert hw.link_between(0, 7) is hw.intra and hw.link_between(7, 8) is hw.inter
    assert hw.link_resources(1, 2) == ("n0.d1.nvswitch.tx", "n0.d2.nvswitch.rx")
    assert hw.link_resources(2, 1) == ("n0.d2.nvswitch.tx", "n0.d1.nvswitch.rx")  # full duplex: disjoint
    assert hw.link_resources(7, 8) == ("n0.d7.infiniband.tx", "n1.d8.infiniband.rx")
    assert hw.link_resources(3, 3) == ()
    pcie = load_hardware("pcie-4gpu")
    assert pcie.link_resources(0, 1) == pcie.link_resources(3, 2) == ("n0.pcie.bus",)
    with pytest.raises(PipesimError, match="device 16 is outside"):
        hw.node_of(16)
    one = load_hardware("dgx-h100")
    with pytest.raises(PipesimError, match="outside"):
        one.link_between(0, 8)


def test_p2p_time_is_latency_plus_bytes_over_bandwidth():
    hw = load_hardware("2x-dgx-h100")
    assert hw.p2p_time(0, 1, 10**9) == 1.9e-6 + 1e9 / 370e9
    assert hw.p2p_time(0, 8, 10**9) == 4.0e-6 + 1e9 / 47.5e9
    assert hw.p2p_time(5, 5, 10**9) == 0.0


def test_compute_time_is_a_roofline_plus_overhead():
    hw = load_hardware("dgx-h100")
    # compute-bound: 1e12 FLOPs at 989e12 * 0.5
    assert hw.compute_time(1e12, 1e6, "bfloat16") == 1e12 / (989e12 * 0.5) + 5e-6
    # memory-bound: 3.35e9 bytes at 3.35e12 B/s
    assert hw.compute_time(1.0, 3.35e9, "bfloat16") == pytest.approx(1e-3 + 5e-6, rel=1e-15)
    bare = dataclasses.replace(hw, device=DeviceSpec("d", {"float32": 2.0}, 1.0, 1, 1.0))
    with pytest.raises(PipesimError, match="no bfloat16 FLOP/s"):
        bare.cost_equation("bfloat16")
    with pytest.raises(PipesimError, match="no bfloat16 FLOP/s"):
        bare.compute_time(1.0, 1.0, "bfloat16")


def test_compute_time_is_the_cost_equation_the_fit_inverts():
    """Hardware.compute_time evaluates `action_seconds` on the hardware's figures, bit for bit: per-kind
    rates, the sum roofline, per-op costs (backward ops at their own), and a host's split bookkeeping."""
    cpu = load_hardware("local-cpu")
    eq = cpu.cost_equation("float32")
    dev = cpu.device
    assert eq.flop_rates == tuple(dev.flops["float32"] * (1.0 * dev.kind_efficiency[k]) for k in "FIW")
    assert eq.memory_rates == tuple(dev.hbm_bandwidth * dev.kind_memory_efficiency[k] for k in "FIW")
    assert (eq.roofline, eq.per_op, eq.backward_per_op) == ("sum", cpu.per_op_overhead, cpu.backward_op_overhead)
    assert eq.split == SplitCosts(0.0, cpu.host.split_group_overhead, cpu.host.split_graph_overhead)
    w = cpu.compute_time(3e9, 2e8, "float32", "W", 40)
    assert w == 3e9 / eq.flop_rates[2] + 2e8 / eq.memory_rates[2] + 40 * cpu.backward_op_overhead
    assert w == action_seconds(eq, (0.0, 0.0, 3e9), (0.0, 0.0, 2e8), ops=40, backward_ops=40)
    f = cpu.compute_time(3e9, 2e8, "float32", "F", 40)
    assert f == 3e9 / eq.flop_rates[0] + 2e8 / eq.memory_rates[0] + 40 * cpu.per_op_overhead
    # a fused B on the fit's side: FLOPs of I and W work, two actions' overheads, both kinds' ops
    two = CostEquation((1.0, 2.0, 4.0), (8.0, 8.0, 16.0), "sum", 0.5, 0.25, 0.125, SplitCosts(1.0, 2.0, 4.0))
    assert action_seconds(two, (0, 2, 4), (0, 8, 16), actions=2, ops=3, backward_ops=2) == 2 + 2 + 1 + 0.25 + 0.25
    assert two.split.add_to(1.0, 1, 3, 0) == 1.0 + 1.0 + 6.0  # a split W with 3 parameter groups
    gpu = CostEquation((1.0, 1.0, 1.0), (2.0, 2.0, 2.0), "max", 0.5)
    assert action_seconds(gpu, (3.0, 0, 0), (2.0, 0, 0)) == 3.5  # max(3, 1) + 0.5: overlapped


def test_host_profile_round_trips_and_every_field_is_written(tmp_path):
    host = HostProfile(cores=3, node_corun_slowdown=0.125, oversubscription_slowdown=0.25, time_slice=0.5,
                       send_overhead=1e-4, late_recv_delay=2e-4, split_backward_overhead=3e-4,
                       split_group_overhead=4e-4, split_graph_overhead=5e-4, probe_seconds=6e-3, probe_tolerance=0.2,
                       probe_machine="box | cpu | 2 cores")
    hw = dataclasses.replace(load_hardware("dgx-h100"), host=host, backward_op_overhead=1e-6, per_op_overhead=2e-6,
                             roofline="sum")
    text = hardware_to_toml(hw)
    for f in dataclasses.fields(HostProfile):
        assert f"\n{f.name} = " in text.split("[host]")[1]
    path = tmp_path / "hw.toml"
    path.write_text(text)
    assert load_hardware(str(path)) == hw
    assert "[host]" not in hardware_to_toml(load_hardware("dgx-h100"))


GOOD = """\
name = "t"
devices_per_node = 2
num_nodes = 1
[device]
name = "d"
flops = { float32 = 1e12 }
hbm_bandwidth = 1e12
memory = 1000
compute_efficiency = 0.5
[intra]
name = "nvlink"
bandwidth = 1e11
latency = 1e-6
"""


def _load_text(tmp_path, text):
    path = tmp_path / "hw.toml"
    path.write_text(text)
    return load_hardware(str(path))


def test_minimal_file_defaults(tmp_path):
    hw = _load_text(tmp_path, GOOD)
    assert hw.intra == LinkClass("nvlink", 1e11, 1e11, 1e-6, False)
    assert (hw.inter, hw.per_action_overhead, hw.host, hw.source) == (None, 0.0, None, "")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("bandwidth = 1e11", "bandwidth = -3", "[intra].bandwidth must be a positive number (bytes/s), got -3"),
        ("bandwidth = 1e11", 'bandwidth = "fast"', "[intra].bandwidth must be a positive number (bytes/s), got 'fast'"),
        ("bandwidth = 1e11\n", "", "missing field [intra].bandwidth"),
        ("latency = 1e-6", "latency = -1e-6", "[intra].latency must be a number >= 0 (seconds), got -1e-06"),
        ("latency = 1e-6", "latency = 1e-6\nspeed = 3", "unknown field [intra].speed"),
        ("latency = 1e-6", "latency = 1e-6\nshared = 1", "[intra].shared must be true or false, got 1"),
        ("memory = 1000", "memory = 1.5e3", "[device].memory must be a positive integer (bytes), got 1500.0"),
        ("compute_efficiency = 0.5", "compute_efficiency = 1.5",
         "[device].compute_efficiency must be a number in (0, 1]"),
        ("float32 = 1e12", "float64 = 1e12", "[device].flops has unknown dtype 'float64'"),
        ("float32 = 1e12", "float32 = 0", "[device].flops.float32 must be a positive number (FLOP/s), got 0"),
        ("num_nodes = 1", "num_nodes = 0", "num_nodes must be a positive integer, got 0"),
        ("num_nodes = 1", "num_nodes = 2", "num_nodes = 2 needs an [inter] section"),
        ("num_nodes = 1", "num_nodes = true", "num_nodes must be a positive integer, got True"),
        ('name = "t"\n', "", "missing field name"),
        ('name = "t"', 'name = "t"\ncolour = "red"', "unknown field colour"),
        ("[intra]", "[intra]\n[intra]", "not valid TOML"),
        ("[intra]\nname", "[intr]\nname",
         "unknown field intr (allowed: backward_op_overhead, device, devices_per_host, devices_per_node, host,"),
        ("num_nodes = 1", "num_nodes = 1\nhost_cores = 2", "unknown field host_cores (moved to [host].cores)"),
        ("num_nodes = 1", 'num_nodes = 1\nroofline = "min"', 'roofline must be "max" or "sum", got \'min\''),
        ("[intra]", "[host]\ntime_slice = 0.1\n[intra]", "missing field [host].cores"),
        ("[intra]", "[host]\ncores = 2\ntime_slice = -1\n[intra]", "[host].time_slice must be a number >= 0 (seconds)"),
        ("[intra]", "[host]\ncores = 2\nhost_cores = 2\n[intra]", "unknown field [host].host_cores (allowed: cores,"),
        ("[intra]\nname = \"nvlink\"\nbandwidth = 1e11\nlatency = 1e-6\n", "", "missing section [intra]"),
    ],
)
def test_malformed_fields_give_one_line_naming_file_and_field(tmp_path, old, new, message):
    assert old in GOOD
    with pytest.raises(PipesimError) as info:
        _load_text(tmp_path, GOOD.replace(old, new, 1))
    text = str(info.value)
    assert text.startswith(f"{tmp_path / 'hw.toml'}: ")
    assert message in text
    assert "\n" not in text


def test_unknown_name_lists_presets():
    with pytest.raises(PipesimError, match=r"unknown hardware 'dgx-z9': not a preset \(2x-dgx-h100, .*local-cpu"):
        load_hardware("dgx-z9")
