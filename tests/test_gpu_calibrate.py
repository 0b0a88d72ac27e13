"""bench/gpu_calibrate.py's file paths, tested without a GPU.

tests/data/gpu_measurements_h100_sample.csv is written by hand in the exact format the script
writes (plausible H100 figures, not a measurement); the CPU fallback run is the script itself on
a tiny grid, so the writing path is exercised for real.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from pipesim.device import measured
from pipesim.device.profile import device_profile, load_profiles
from pipesim.errors import PipesimError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests/data/gpu_measurements_h100_sample.csv"
H100 = device_profile("H100")


def test_the_sample_parses_with_its_header():
    data = measured.read(SAMPLE)
    assert data.meta["device"] == "NVIDIA H100 80GB HBM3" and data.meta["family"] == "H100"
    assert [r.kind for r in data.records][:4] == ["launch", "launch", "launch", "copy"]
    gemm = data.of("gemm")[1]
    assert (gemm.shape, gemm.seconds, gemm.flops) == ((1, 4096, 4096, 4096), 0.000175, 2.0 * 4096**3)


def test_summary_is_the_best_gemm_copy_and_flash_and_the_median_launch():
    fig = measured.summarise(measured.read(SAMPLE), H100)
    assert fig["matmul_efficiency"] == 2.0 * 8192**3 / 0.00139 / 989e12  # bf16 only: the fp16 row is ignored
    assert fig["memory_efficiency"] == 2147483648 / 0.0007 / 3.35e12
    assert fig["kernel_overhead"] == statistics.median([2.5e-6, 3.5e-6, 3e-6])
    fwd_noncausal = 4 * 4 * 2048 * 2048 * 4096 / 0.0012
    fwd_causal = 4 * 4 * 2048 * 2048 * 4096 / 2 / 0.00075
    assert fig["flash_forward_efficiency"] == max(fwd_noncausal, fwd_causal) / 989e12
    assert fig["flash_backward_efficiency"] == 2.5 * 4 * 4 * 2048 * 2048 * 4096 / 0.0035 / 989e12
    assert measured.summarise(measured.read(SAMPLE), H100, "float16")["matmul_efficiency"] == \
        2.0 * 8192**3 / 0.00135 / 989e12


def test_collective_figures_use_nccl_tests_busbw():
    figs = measured.collective_figures(measured.read(SAMPLE))
    assert figs["all_reduce"]["busbw"] == 268435456 / 0.00128 * 2 * 7 / 8
    assert figs["all_reduce"]["small_message_seconds"] == 2.2e-5
    assert figs["send_recv"]["busbw"] == 268435456 / 0.0008


def test_profile_toml_round_trips_with_the_measurement_as_source(tmp_path):
    fig = measured.summarise(measured.read(SAMPLE), H100)
    prof = H100.with_measured("sample run", **fig)
    path = tmp_path / "profile.toml"
    path.write_text(measured.profile_toml("H100", prof))
    back = load_profiles(path)["H100"]
    for name, value in fig.items():
        assert getattr(back, name) == pytest.approx(value, rel=1e-5)  # written to 6 significant digits
        assert back.sources[name] == "sample run"
    assert back.sources["sms"] == H100.sources["sms"] and back.tiles == H100.tiles


def test_bad_files_are_one_line_errors():
    with pytest.raises(PipesimError, match="columns must be"):
        measured.parse("kind,dtype,shape\n")
    with pytest.raises(PipesimError, match="row 1: gemm needs a shape of 4 numbers"):
        measured.parse("kind,dtype,shape,bytes,seconds\ngemm,bfloat16,1x2x3,0,1e-3\n")
    with pytest.raises(PipesimError, match="unknown kind"):
        measured.parse("kind,dtype,shape,bytes,seconds\nconv,bfloat16,,0,1e-3\n")
    with pytest.raises(PipesimError, match="seconds must be positive"):
        measured.parse("kind,dtype,shape,bytes,seconds\nlaunch,float32,,0,0\n")


def test_write_then_parse_is_the_identity():
    data = measured.read(SAMPLE)
    again = measured.parse(measured.write(data.meta, list(data.records)))
    assert again == data


@pytest.mark.timeout(180)
def test_cpu_fallback_run_writes_a_file_that_parses_and_merges_collectives(tmp_path):
    coll = tmp_path / "collectives.json"  # executor/collectives_bench.py's --json report, two ops
    coll.write_text(json.dumps({"backend": "nccl", "world_size": 4, "results": [
        {"op": "all_reduce", "bytes": 1048576, "time": 2e-5, "algbw": 0, "busbw": 0, "busbw_factor": 1.5,
         "iters": 5, "verified": True},
        {"op": "broadcast", "bytes": 1048576, "time": 1e-5, "algbw": 0, "busbw": 0, "busbw_factor": 1.0,
         "iters": 5, "verified": True}]}))
    out = tmp_path / "cal"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench/gpu_calibrate.py"), "--out", str(out), "--cpu-fallback",
                           "--iters", "2", "--warmup", "1", "--collectives-json", str(coll)],
                          capture_output=True, text=True, env=env, timeout=170, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    data = measured.read(out / "measurements.csv")
    assert data.meta["fallback"] == "cpu"
    assert {r.kind for r in data.records} == {"launch", "copy", "gemm", "flash_forward", "flash_backward",
                                              "all_reduce"}  # broadcast is not a kind the model uses
    assert len(data.of("gemm")) == 8 and data.of("all_reduce")[0].shape == (4,)
    prof = load_profiles(out / "profile.toml")["H100"]
    assert prof.sources["matmul_efficiency"].startswith("measured by bench/gpu_calibrate.py on cpu")
    assert "wrote" in proc.stdout and "all_reduce: busbw" in proc.stdout
