"""bench/gpu_fp8.py (FP8 GEMMs beside BF16 and the FP8 casts, timed on one GPU): its specs against the model's
kernels, its one-line refusal without CUDA, and its CPU run on the tiny cases."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_fp8 import FIELDS, cast_specs, fp8_kernels, gemm_specs  # noqa: E402
from gpu_layer_configs import CASES, TINY_CASES  # noqa: E402

from pipesim.model.kernel_types import MemoryBound  # noqa: E402


def test_specs_cover_every_fp8_kernel_with_the_models_bytes():
    for case in (*CASES, *TINY_CASES):
        for recipe in ("delayed", "tensorwise"):
            for tn_only in (True, False):
                pk = fp8_kernels(case, recipe, tn_only)
                d = case.model.dtype_bytes
                gemms = gemm_specs(pk)
                assert len(gemms) == 3 * 4  # QKV, projection, FC1, FC2: fprop, dgrad, wgrad
                assert {(g.a, g.b) for g in gemms if g.name.endswith(" dgrad")} == {("float8_e5m2", "float8_e4m3fn")}
                specs = cast_specs(pk, tn_only, tp=case.opts.tp, sp=case.opts.sp)
                fp8_memory = [k for ph in "FIW" for k in pk.phase(ph) if isinstance(k, MemoryBound)
                              and k.name.endswith((" cast", " amax", " transpose"))]
                assert len(specs) == len(fp8_memory)
                for s in specs:  # the tensor the script runs moves exactly the model's bytes
                    elements = s.rows * s.cols
                    expect = {"amax": d * elements, "transpose": 2 * elements,
                              "cast": (d + (2 if s.transposed else 1)) * elements}[s.op]
                    assert s.nbytes == expect, (case.label, s)


def test_without_cuda_it_exits_2_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "bench/gpu_fp8.py"), str(tmp_path)], capture_output=True,
                         text=True, env={"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PATH": ""})
    assert run.returncode == 2
    assert run.stderr.strip() == "gpu_fp8.py: no CUDA device visible (torch.cuda.is_available() is False)"


def test_the_cpu_run_writes_the_recording_format(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "bench/gpu_fp8.py"), str(tmp_path), "--device", "cpu",
                          "--tiny"], capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": ""})
    assert run.returncode == 0, run.stderr
    rows = list(csv.DictReader((tmp_path / "fp8.csv").open()))
    assert tuple(rows[0]) == FIELDS and (tmp_path / "meta.json").exists()
    gemm = [r for r in rows if r["kind"] == "gemm"]
    assert {r["dtype"] for r in gemm} == {"float8", "bfloat16"} and len(gemm) == 2 * 2 * 12
    assert all(float(r["seconds"]) > 0 for r in rows)
