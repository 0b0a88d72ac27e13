"""Blackwell Ultra (B300 family; hgx-b300 and gb300-nvl72): each figure is its source's arithmetic, the family times
Transformer Engine's own B300 GEMM measurement, and the GB300 is the family at its 1,400 W rating."""

from __future__ import annotations

import json
import shlex

import pytest

from pipesim.cli import main
from pipesim.cost.device_profiles import fp8_profile_of, profile_of
from pipesim.device.fp8_rates import load_fp8_figures
from pipesim.device.gemm import gemm_time
from pipesim.device.profile import device_profile
from pipesim.hardware.toml_io import load_hardware

SUSTAINED = 1237 / 1450  # [B200SUST]: the B200's settled / burst rate, taken for the B300 (no long B300 run found)
# NVIDIA/TransformerEngine @ d0067d0da docs/examples/gemm_profiling/gemm_profiling.rst, --pre-quantize on an "NVIDIA
# B300 SXM6 AC": one layer's 12 GEMMs (hidden 4096, FFN 16384, 15,872 tokens), per-layer totals in ms
TE_GUIDE_MS = {"bfloat16": 13.102, "tensorwise": 6.812, "mxfp8": 7.161, "nvfp4": 3.764}


def test_the_b300_figures_are_their_sources_arithmetic():
    b300, b200 = device_profile("B300"), device_profile("B200")
    assert (b300.peak("bfloat16"), b300.hbm_bandwidth, b300.sms) == (2250e12, 7.7e12, 148)
    assert b300.matmul_efficiency == round(1769.0 / 2250 * SUSTAINED, 3)  # [MAMF]'s B300 row, sustained
    # cuDNN 9.22 on a GB200 and a GB300 (both rated 2,500 TFLOP/s BF16), causal at 8k: forward 1.397 -> 1.185 ms,
    # backward 4.127 -> 3.832 ms; the B200's figures times those ratios
    assert b300.flash_forward_efficiency == round(b200.flash_forward_efficiency * 1.397 / 1.185, 3)
    assert b300.flash_backward_efficiency == round(b200.flash_backward_efficiency * 4.127 / 3.832, 3)
    fp8 = load_fp8_figures()["B300"]
    assert (fp8.peak, fp8.fp4_peak, fp8.tn_only) == (4500e12, 13500e12, False)
    assert fp8.matmul_efficiency == round(3353.3 / 4500 * SUSTAINED, 3)
    mx = round(fp8.matmul_efficiency * 6.812 / 7.161, 3)  # the guide's MXFP8 over FP8 current scaling
    assert fp8.efficiency("mxfp8") == mx
    assert fp8.efficiency("nvfp4") == round(mx * (7.161 / 3.764) / 3, 3)  # its NVFP4 over MXFP8, at 3x the peak


def test_the_family_times_the_te_guides_b300_gemms_within_2_percent():
    """A check, not a fit: the 12 GEMMs of the guide's layer through the GEMM model in each precision."""
    tokens, h, f = 15872, 4096, 16384
    linears = [(h, 3 * h), (h, h), (h, f), (f, h)]  # (inputs, outputs): QKV, projection, MLP up, MLP down
    shapes = [s for k, n in linears for s in ((tokens, n, k), (tokens, k, n), (k, n, tokens))]  # fprop, dgrad, wgrad
    for recipe, measured in TE_GUIDE_MS.items():
        if recipe == "bfloat16":
            dtype, prof = "bfloat16", profile_of("B300")
        else:
            dtype, prof = "float4" if recipe == "nvfp4" else "float8", fp8_profile_of("B300", None, recipe)
        model = sum(gemm_time(m, n, k, dtype, prof, c_bytes=2).seconds for m, n, k in shapes) * 1e3
        assert model / measured == pytest.approx(1.0, abs=0.02), recipe


def test_the_gb300_is_the_family_at_its_1400_w_rating():
    gb, hgx = load_hardware("gb300-nvl72"), load_hardware("hgx-b300")
    assert (gb.device.memory, gb.device.hbm_bandwidth, gb.devices_per_node, gb.devices_per_host) == \
        (279e9, 8e12, 72, 4)
    assert (hgx.device.memory, hgx.device.hbm_bandwidth, hgx.devices_per_node) == (270e9, 7.7e12, 8)
    assert gb.with_nodes(2).inter.peak_bandwidth == hgx.with_nodes(2).inter.peak_bandwidth == 100e9  # 800 Gb/s per GPU
    board = profile_of("B300", gb.device.kernels)
    assert board.clock_scale == pytest.approx(2.5 / 2.25)
    assert board.peak("bfloat16") == pytest.approx(2500e12) == gb.device.flops["bfloat16"]
    # NVIDIA's blog: 15 PFLOPS dense NVFP4 for the GB300
    assert fp8_profile_of("B300", gb.device.kernels, "nvfp4").peak("float4") == pytest.approx(15000e12)
    assert board.matmul_efficiency == device_profile("B300").matmul_efficiency  # no GB300 measurement: the family's


def test_nvfp4_llama_70b_fits_a_gb300_at_tp_1_only_with_its_state_sharded(capsys):
    """279 GB (259.84 GiB) per GPU: the 26.02 recipe's TP 1 x PP 4 fits with the distributed optimizer over dp 16,
    and is refused in one line without it."""
    args = ["simulate", "1f1b", "--model-config", "llama3-70b", "--seq", "8192", "--batch", "64", "--microbatch-size",
            "1", "--stages", "4", "--dp", "16", "--hardware", "gb300-nvl72", "--nvlink-domain", "64", "--attention",
            "flash", "--framework", "megatron-core", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    assert main([*args, "--zero", "1"]) == 0
    assert "peak memory" in capsys.readouterr().out
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pipesim: error: rank 0") and err.endswith("but GB300-279GB has 259.84 GiB")
    assert "\n" not in err


def test_the_planner_plans_a_gb300_rack_and_its_winner_re_simulates(capsys, tmp_path):
    """The planner takes the new presets as any other: its winner's command, run again, gives its own step."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--model-config", "llama3-8b", "--seq", "4096", "--batch", "64", "--layers", "8",
                 "--hardware", "gb300-nvl72", "--nvlink-domain", "8", "--gpus", "8", "--framework", "megatron-core",
                 "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4", "--recompute", "none", "--max-candidates", "20",
                 "--json", str(out)]) == 0
    capsys.readouterr()
    data = json.loads(out.read_text())
    argv = shlex.split(data["winner"]["simulate_command"])
    assert argv[argv.index("--hardware") + 1] == "gb300-nvl72" and "--fp4-format" in argv
    assert main(argv[1:] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == data["rows"][0]["step_time"]
