"""A board's power limit as its tensor clock (pipesim/device/power.py) and a board's own HBM ([device.kernels]):
the interpolation by hand, the refusals, and the kernel model and the simulator taking both."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from pipesim.cli import main
from pipesim.cost.device_profiles import profile_of
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


@pytest.mark.parametrize("family,watts,message", [
    ("H100", 300, "power_limit 300 W on device 'H100-SXM5-80GB': outside the 400-700 W its rated boards span"),
    ("H100", 750, "outside the 400-700 W"),
    ("A100", 300, "power_limit 300 W on device 'A100-SXM4-80GB': its family lists no rated boards"),
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


def test_a_limit_over_measured_tensor_figures_is_refused():
    """Measured figures (pipesim calibrate --gpu) already run at the measured board's clock: a limit on top would
    scale them twice."""
    with pytest.raises(PipesimError, match="^power_limit 500 W: the device's \\[device.kernels\\] also gives "
                                           "matmul_efficiency, measured at that board's own clock"):
        profile_of("H100", KernelFigures(matmul_efficiency=0.7, power_limit=500))
    assert profile_of("H100", KernelFigures(memory_bound_efficiency=0.6, power_limit=500)).clock_scale < 1


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
