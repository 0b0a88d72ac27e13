"""A board's power limit as its tensor clock (pipesim/device/power.py) and a board's own HBM ([device.kernels]):
the interpolation by hand, the refusals, and the kernel model and the simulator taking both."""

from __future__ import annotations

import json
import statistics
from importlib import resources

import pytest

from pipesim.cli import main
from pipesim.cost.device_profiles import fp8_profile_of, profile_of
from pipesim.device.gemm import gemm_time
from pipesim.device.kernels import flash_attention_time, memory_bound_time
from pipesim.device.power import clock_scale, rated_peak
from pipesim.device.profile import device_profile
from pipesim.errors import PipesimError
from pipesim.hardware.machine import KernelFigures
from pipesim.hardware.toml_io import load_hardware

GRAND_TETON = "bench/hardware/grand-teton-h100.toml"
SCALE = (835e12 + (989e12 - 835e12) * 100 / 300) / 989e12  # 500 W between the NVL's 400 W and the SXM's 700 W


def test_the_h100s_rated_boards_by_hand():
    """The datasheet's dense BF16 peaks: H100 NVL 835 TFLOP/s at 400 W, H100 SXM 989 at 700 W (the reference)."""
    h100 = device_profile("H100")
    assert (h100.power_limit, h100.power_ratings) == (700, ((400.0, 835e12), (700.0, 989e12)))
    assert rated_peak(h100.power_ratings, 500) == pytest.approx(886.333e12, rel=1e-6)
    assert clock_scale(h100, 500) == pytest.approx(SCALE, rel=1e-12) == pytest.approx(0.8962, abs=1e-4)
    assert clock_scale(h100, 700) == 1.0 and clock_scale(h100, 400) == pytest.approx(835 / 989)


def test_the_b200s_rated_boards_by_hand():
    """HGX B100 1,750 TFLOP/s dense BF16 at 700 W, HGX B200 2,250 at 1000 W (the reference), GB200 2,500 at 1200 W:
    a 750 W limit (torchao's B200 benchmark) is 1,750 + 500 x 50 / 300 = 1,833.3 TFLOP/s, 0.8148 of the reference;
    the GB200's 1200 W is 2,500 / 2,250 = 1.1111, and 1100 W halfway, 2,375 / 2,250 = 1.0556."""
    b200 = device_profile("B200")
    assert (b200.power_limit, b200.power_ratings) == (1000, ((700.0, 1.75e15), (1000.0, 2.25e15), (1200.0, 2.5e15)))
    assert rated_peak(b200.power_ratings, 750) == pytest.approx(1833.333e12, rel=1e-6)
    assert clock_scale(b200, 750) == pytest.approx(1833.333 / 2250, rel=1e-6) == pytest.approx(0.8148, abs=1e-4)
    assert clock_scale(b200, 1000) == 1.0 and clock_scale(b200, 700) == pytest.approx(1.75 / 2.25)
    assert clock_scale(b200, 1200) == pytest.approx(2.5 / 2.25) == pytest.approx(1.1111, abs=1e-4)
    assert clock_scale(b200, 1100) == pytest.approx(2.375 / 2.25)


@pytest.mark.parametrize("family,watts,message", [
    ("H100", 300, "power_limit 300 W on device 'H100-SXM5-80GB': outside the 400-700 W its rated boards span"),
    ("H100", 750, "outside the 400-700 W"),
    ("A100", 300, "power_limit 300 W on device 'A100-SXM4-80GB': its family lists no rated boards"),
    ("B200", 1300, "power_limit 1300 W on device 'B200-180GB': outside the 700-1200 W its rated boards span"),
])
def test_a_limit_no_rating_spans_is_refused(family, watts, message):
    with pytest.raises(PipesimError, match=message):
        clock_scale(device_profile(family), watts)


def test_the_kernel_model_runs_at_the_boards_clock_and_hbm():
    """Every tensor rate (GEMMs, flash attention) x the clock scale; memory-bound kernels at the board's HBM."""
    h100 = device_profile("H100")
    board = profile_of("H100", KernelFigures(hbm_bandwidth=2.4e12, power_limit=500, source="a 500 W HBM2e board"))
    assert board.clock_scale == pytest.approx(SCALE) and board.peak("bfloat16") == pytest.approx(989e12 * SCALE)
    big = (8192, 8192, 8192)
    assert gemm_time(*big, "bfloat16", board).compute == \
        pytest.approx(gemm_time(*big, "bfloat16", h100).compute / SCALE)
    flash = (1, 8192, 32, 128, "bfloat16")
    assert flash_attention_time(*flash, board, causal=True).compute == \
        pytest.approx(flash_attention_time(*flash, h100, causal=True).compute / SCALE)
    assert memory_bound_time(1e9, board).memory == pytest.approx(1e9 / (2.4e12 * h100.memory_bound_efficiency))
    assert "500 W board, its peaks x 0.8962" in board.sources["clock_scale"]


def test_figures_measured_on_a_limited_board_keep_their_rate():
    """A measured figure (pipesim calibrate --gpu, or a cited benchmark of the board) already runs at that board's
    clock: beside its power limit it keeps its rate, and only the figures not measured (here flash attention) take the
    board's clock. BF16 and FP8 GEMMs each at their measured fraction of their datasheet peak."""
    figures = KernelFigures(matmul_efficiency=0.574, fp8_matmul_efficiency=0.688, power_limit=500)
    board = profile_of("H100", figures)
    big = (8192, 8192, 8192)
    alone = profile_of("H100", KernelFigures(matmul_efficiency=0.574))  # the same measurement, no limit given
    assert gemm_time(*big, "bfloat16", board).compute == pytest.approx(gemm_time(*big, "bfloat16", alone).compute)
    assert board.matmul_efficiency * board.clock_scale == pytest.approx(0.574)
    assert board.clock_scale == pytest.approx(SCALE)
    flash = (1, 8192, 32, 128, "bfloat16")
    assert flash_attention_time(*flash, board, causal=True).compute == \
        pytest.approx(flash_attention_time(*flash, device_profile("H100"), causal=True).compute / SCALE)
    fp8 = fp8_profile_of("H100", figures, "tensorwise")
    assert fp8.matmul_efficiency * fp8.clock_scale == pytest.approx(0.688)
    assert fp8_profile_of("H100", KernelFigures(fp8_matmul_efficiency=0.688)).matmul_efficiency == 0.688
    # a per-tensor measurement on a B200 board: MXFP8, which has a figure of its own, keeps its ratio to per-tensor's
    b200 = KernelFigures(fp8_matmul_efficiency=0.6)
    assert fp8_profile_of("B200", b200, "tensorwise").matmul_efficiency == 0.6
    assert fp8_profile_of("B200", b200, "mxfp8").matmul_efficiency == pytest.approx(0.6 * 0.619 / 0.651)
    assert profile_of("H100", KernelFigures(memory_bound_efficiency=0.6, power_limit=500)).clock_scale < 1


def test_a_measured_figure_above_the_limited_boards_peak_is_refused(capsys):
    with pytest.raises(PipesimError, match="^matmul_efficiency 0.95 measured on a 500 W board is above that board's "
                                           "peak \\(x 0.8962 of the family's\\)"):
        profile_of("H100", KernelFigures(matmul_efficiency=0.95, power_limit=500))
    assert main([*SIM[:-2], "--hardware", GRAND_TETON, "--power-limit", "400"]) == 2  # measured at 500 W
    err = capsys.readouterr().err.strip()
    assert err == ("pipesim: error: --power-limit 400: hardware 'grand-teton-h100' already gives matmul_efficiency, "
                   "fp8_matmul_efficiency in [device.kernels], for the board it was measured on; edit the file instead")


def test_grand_teton_gemm_figures_are_the_cited_benchmarks_times_on_the_wave_model():
    """The file's BF16 and FP8 GEMM fractions: the H100 profile's, times the median of its time over the time
    meta-pytorch/float8_experimental PR #100 measured for LLaMa 2 70B's four linears at M = 16384 (bench_matmul.py)."""
    measured = {(8192, 1280): (0.622e-3, 0.244e-3), (1024, 8192): (0.499e-3, 0.257e-3),
                (8192, 7168): (3.445e-3, 1.470e-3), (3584, 8192): (1.628e-3, 0.700e-3)}  # (K, N): BF16, FP8 seconds
    h100, fp8 = device_profile("H100"), fp8_profile_of("H100", None, "tensorwise")
    bf16 = statistics.median(gemm_time(16384, n, k, "bfloat16", h100).seconds / t[0] for (k, n), t in measured.items())
    f8 = statistics.median(gemm_time(16384, n, k, "float8", fp8, c_bytes=2).seconds / t[1]
                           for (k, n), t in measured.items())
    kernels = load_hardware(GRAND_TETON).device.kernels
    assert kernels.matmul_efficiency == round(h100.matmul_efficiency * bf16, 3) == 0.574
    assert kernels.fp8_matmul_efficiency == round(fp8.matmul_efficiency * f8, 3) == 0.688


def test_grand_teton_is_the_500_w_hbm2e_board():
    hw = load_hardware(GRAND_TETON)
    assert (hw.device.kernels.hbm_bandwidth, hw.device.kernels.power_limit) == (2.4e12, 500)
    board = profile_of(hw.device.family, hw.device.kernels)
    assert (board.clock_scale, board.hbm_bandwidth) == (pytest.approx(SCALE), 2.4e12)


def test_a_power_limit_the_family_cannot_honour_is_one_line_and_exit_2(tmp_path, capsys):
    preset = resources.files("pipesim").joinpath("presets", "dgx-a100.toml").read_text()
    text = preset.replace("[intra]", "[device.kernels]\npower_limit = 300\n\n[intra]", 1)
    path = tmp_path / "a100-300w.toml"
    path.write_text(text)
    code = main(["simulate", "1f1b", "-p", "2", "-m", "4", "--model", "gpt", "--hidden", "1024", "--layers", "4",
                 "--heads", "16", "--seq", "1024", "--batch", "4", "--hardware", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "power_limit 300 W on device 'A100-SXM4-80GB': its family lists no rated boards" in err



SIM = ["simulate", "1f1b", "-p", "2", "-m", "4", "--model", "gpt", "--hidden", "2048", "--layers", "4", "--heads",
       "16", "--seq", "2048", "--batch", "4", "--dtype", "bfloat16", "--attention", "flash", "--json", "-"]


def _run(capsys, *extra: str) -> dict:
    assert main([*SIM, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _step(capsys, *extra: str) -> float:
    return _run(capsys, *extra)["step_time"]


def test_the_flag_is_the_boards_limit_in_the_file(tmp_path, capsys):
    """--power-limit 500 on dgx-h100 is the same run as a file whose [device.kernels] says power_limit = 500, and
    slower than the 700 W board; 700 is the board itself."""
    preset = resources.files("pipesim").joinpath("presets", "dgx-h100.toml").read_text()
    path = tmp_path / "h100-500w.toml"
    path.write_text(preset.replace("[intra]", "[device.kernels]\npower_limit = 500\n\n[intra]", 1))
    assert _run(capsys, "--hardware", "dgx-h100", "--power-limit", "500", "--nodes", "2")["hardware"] == \
        "2x-dgx-h100@500W"  # every report names the cap
    capped = _step(capsys, "--hardware", "dgx-h100", "--power-limit", "500")
    assert capped == _step(capsys, "--hardware", str(path))
    assert capped > _step(capsys, "--hardware", "dgx-h100") == _step(capsys, "--hardware", "dgx-h100",
                                                                     "--power-limit", "700")


@pytest.mark.parametrize("extra,message", [
    (["--hardware", "dgx-a100", "--power-limit", "300"], "power_limit 300 W on device 'A100-SXM4-80GB'"),
    (["--hardware", "local-cpu", "--power-limit", "300"], "--power-limit 300: hardware 'local-cpu' has no GPU"),
    (["--hardware", "dgx-h100", "--power-limit", "350"], "outside the 400-700 W its rated boards span"),
])
def test_the_flag_refuses_in_one_line(capsys, extra, message):
    assert main([*SIM[:-2], *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_plan_searches_and_exports_at_the_limit(capsys):
    args = ["plan", "--model", "gpt", "--hidden", "2048", "--layers", "8", "--heads", "16", "--seq", "2048",
            "--batch", "16", "--dtype", "bfloat16", "--hardware", "dgx-h100", "--gpus", "8", "--top", "1"]
    assert main([*args, "--power-limit", "500", "--json", "-"]) == 0
    capped = json.loads(capsys.readouterr().out)
    assert main([*args, "--json", "-"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert "--power-limit 500" in capped["winner"]["simulate_command"]
    assert "--power-limit" not in full["winner"]["simulate_command"]
    assert capped["rows"][0]["step_time"] > full["rows"][0]["step_time"]
