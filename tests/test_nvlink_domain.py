"""GB200 NVL72: a rack-sized NVLink domain (pipesim/presets/gb200-nvl72.toml) and --nvlink-domain, a job that fills
only part of each domain (Hardware.with_domain)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from pipesim.cli import main
from pipesim.commands.plan_cmd import cluster
from pipesim.cost.device_profiles import fp8_profile_of, profile_of
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import hardware_to_toml, load_hardware

SMALL = ["--model", "gpt", "--hidden", "1024", "--layers", "8", "--heads", "16", "--seq", "1024", "--batch", "64",
         "--microbatch-size", "1"]


def test_the_gb200_preset_is_a_rack_of_b200s_at_1200_watts():
    """72 GPUs per NVLink domain; 13.4 TB / 72 = 186 GB each; the B200 family's clock x 2500 / 2250 (the GB200's
    1,200 W rating over the 1000 W HGX B200 the family is measured on) for what no GB200 measurement gives, its GEMMs
    as measured on a GB200; HBM and NVLink 5 as the HGX B200's."""
    gb, hgx = load_hardware("gb200-nvl72"), load_hardware("hgx-b200")
    assert (gb.devices_per_node, gb.num_nodes, gb.device.memory) == (72, 1, 186_000_000_000)
    assert (gb.host_devices, hgx.host_devices) == (4, 8)  # a 4-GPU tray; an HGX board is its own host
    assert (gb.device.family, gb.device.kernels.power_limit) == ("B200", 1200)
    assert gb.device.flops["bfloat16"] == 2500e12 and gb.intra == hgx.intra and gb.scale_out == hgx.scale_out
    rack, board = profile_of("B200", gb.device.kernels), profile_of("B200", hgx.device.kernels)
    assert rack.clock_scale == pytest.approx(2500 / 2250) and board.clock_scale == 1.0
    assert rack.peak("bfloat16") == pytest.approx(2500e12) and rack.hbm_bandwidth == board.hbm_bandwidth == 8e12
    # its GEMMs are MAMF's GB200 bursts (1822.0 BF16, 3615.6 FP8 TFLOP/s) at the B200's sustained fraction, rounded
    sustained = 1237 / 1450
    assert gb.device.kernels.matmul_efficiency == round(1822.0 / 2250 * sustained, 4)
    assert gb.device.kernels.fp8_matmul_efficiency == round(3615.6 / 4500 * sustained, 4)
    assert rack.peak("bfloat16") * rack.matmul_efficiency == pytest.approx(2250e12 * 0.6908)
    flash = board.flash_forward_efficiency  # unmeasured on a GB200: the rating's clock
    assert rack.flash_forward_efficiency * rack.clock_scale == pytest.approx(flash * 2.5 / 2.25)
    tensorwise, mxfp8 = (fp8_profile_of("B200", gb.device.kernels, r) for r in ("tensorwise", "mxfp8"))
    assert tensorwise.peak("float8") * tensorwise.matmul_efficiency == pytest.approx(4500e12 * 0.6854)
    assert mxfp8.matmul_efficiency / tensorwise.matmul_efficiency == pytest.approx(0.619 / 0.651)


def test_a_domain_of_64_places_ranks_64_to_a_rack():
    """Slurm's segment of 16 trays: ranks 0-63 in the first rack, 64-127 in the second, joined by InfiniBand."""
    hw = load_hardware("gb200-nvl72").with_domain(64).with_nodes(4)
    assert (hw.name, hw.devices_per_node, hw.num_devices) == ("4x-gb200-nvl72/64", 64, 256)
    assert [hw.node_of(d) for d in (0, 63, 64, 255)] == [0, 0, 1, 3]
    assert hw.link_between(62, 63) is hw.intra and hw.link_between(63, 64) is hw.inter
    whole = load_hardware("gb200-nvl72").with_nodes(4)  # all 72: rank 64 still shares rank 63's rack
    assert whole.link_between(63, 64) is whole.intra and whole.node_of(72) == 1
    assert load_hardware("gb200-nvl72").with_domain(72) == load_hardware("gb200-nvl72")
    assert load_hardware("dgx-h100").with_domain(4).num_devices == 4  # half of each host: its own choice


@pytest.mark.parametrize("make,message", [
    (lambda: load_hardware("gb200-nvl72").with_domain(73), "--nvlink-domain 73: hardware 'gb200-nvl72' has 72 devices "
                                                           "per node; give 1 to that many"),
    (lambda: load_hardware("dgx-h100").with_domain(0), "--nvlink-domain 0"),
    (lambda: load_hardware("2x-dgx-h100").with_domain(4), "already joins 2 nodes; give a one-node preset and --nodes"),
    (lambda: load_hardware("gb200-nvl72").with_domain(62), "--nvlink-domain 62: hardware 'gb200-nvl72' has 4 devices "
                                                           "per host; a domain holds whole hosts"),
])
def test_a_domain_the_hardware_cannot_hold_is_refused(make, message):
    with pytest.raises(PipesimError, match=message):
        make()


def test_the_flag_is_the_hardware_file_with_that_many_devices_per_node(tmp_path):
    """`--hardware gb200-nvl72 --nvlink-domain 8 --nodes 2` simulates exactly what a file of 8 GPUs per node does, and
    differs from the whole rack (16 GPUs in one domain: its DP all-reduce stays on NVLink)."""
    gb = load_hardware("gb200-nvl72")
    path = tmp_path / "gb200-8.toml"
    path.write_text(hardware_to_toml(dataclasses.replace(gb, devices_per_node=8)))
    run = ["simulate", "1f1b", *SMALL, "--stages", "2", "--dp", "8", "--comm", "links"]
    steps = {}
    for name, hw in [("flag", ["--hardware", "gb200-nvl72", "--nvlink-domain", "8", "--nodes", "2"]),
                     ("file", ["--hardware", str(path), "--nodes", "2"]),
                     ("rack", ["--hardware", "gb200-nvl72"])]:
        out = tmp_path / f"{name}.json"
        assert main(run + hw + ["--json", str(out)]) == 0
        steps[name] = json.loads(out.read_text())
    assert steps["flag"]["step_time"] == steps["file"]["step_time"]
    assert steps["flag"]["hardware"] == "2x-gb200-nvl72/8"
    assert steps["rack"]["step_time"] < steps["flag"]["step_time"]  # InfiniBand under the gradients' all-reduce


def test_a_bad_domain_on_the_command_line_is_one_line(capsys):
    assert main(["simulate", "1f1b", *SMALL, "--stages", "2", "--hardware", "gb200-nvl72",
                 "--nvlink-domain", "80"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("pipesim: error: --nvlink-domain 80: hardware 'gb200-nvl72' has 72 devices per node; give 1 to "
                   "that many")


def test_the_planner_fills_racks_a_domain_at_a_time():
    args = argparse.Namespace(hardware="gb200-nvl72", nvlink_domain=64, power_limit=None, nodes=None, gpus=256)
    hw, gpus, flags = cluster(args)
    assert (hw.name, gpus) == ("4x-gb200-nvl72/64", 256)
    assert flags == ["--hardware", "gb200-nvl72", "--nvlink-domain", "64", "--nodes", "4"]
    with pytest.raises(PipesimError, match=r"--gpus 256 is not a multiple of gb200-nvl72's 72 GPUs per node "
                                           r"\(--nvlink-domain G fills G of each\)"):
        cluster(argparse.Namespace(**{**vars(args), "nvlink_domain": None}))


def test_the_planners_run_command_starts_four_ranks_per_tray(tmp_path):
    """The NVLink domain is the rack; torchrun's node is the 4-GPU tray: 8 GPUs are two trays of 4 ranks."""
    out = tmp_path / "plan.json"
    assert main(["plan", *SMALL[:-2], "--hardware", "gb200-nvl72", "--gpus", "8", "--json", str(out)]) == 0
    run = json.loads(out.read_text())["winner"]["run_command"]
    assert " --nproc 4 --nnodes 2 --rdzv-endpoint HOST:29500" in run
