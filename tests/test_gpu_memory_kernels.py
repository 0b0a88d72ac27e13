"""bench/gpu_memory_kernels.py (each memory-bound kernel of the model timed as Megatron's op) on the CPU's tiny
cases, and bench/gpu_memory_kernels_compare.py on the H200 recording (tests/data/gpu_memory_kernels_h200.csv)."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_layer_configs import CASES, TINY_CASES  # noqa: E402
from gpu_memory_kernels import family_of  # noqa: E402
from gpu_memory_kernels_compare import main as compare_main  # noqa: E402

from pipesim.model.activations import MASK_BYTES  # noqa: E402
from pipesim.model.kernel_types import MemoryBound  # noqa: E402

RECORDING = ROOT / "tests/data/gpu_memory_kernels_h200.csv"
H200_HBM = 4.8e12  # bytes/s, the hgx-h200 preset's datasheet figure


def _memory_bound(case):
    pk = case.kernels(True)
    return [(p, k) for p in "FIW" for k in getattr(pk, p) if isinstance(k, MemoryBound)]


# (values, masks) the model charges per element of the op's first tensor: bytes = values d + masks MASK_BYTES
PER_ELEMENT = {("LayerNorm", False): (2, 0), ("LayerNorm", True): (3, 0), ("RMSNorm", False): (2, 0),
               ("RMSNorm", True): (3, 0), ("softmax", False): (2, 0), ("softmax", True): (3, 0),
               ("dropout", False): (2, 1), ("dropout", True): (2, 1), ("bias-dropout-add", False): (3, 1),
               ("add", False): (3, 0), ("add", True): (3, 0), ("bias-GeLU", False): (2, 0), ("bias-GeLU", True): (3, 0),
               ("SwiGLU", False): (3, 0), ("SwiGLU", True): (5, 0), ("bias add", False): (2, 0),
               ("bias gradient", False): (1, 0)}


@pytest.mark.parametrize("case", CASES + TINY_CASES, ids=lambda c: c.label)
def test_each_kernel_is_timed_on_the_tensors_whose_bytes_the_model_charges(case):
    """The op's main tensor has exactly the elements the model's byte count is made of (RoPE: Q and K together)."""
    for _, k in _memory_bound(case):
        fam = family_of(k, case)
        d = case.model.dtype_bytes
        elements = math.prod(fam.shapes[0])
        if fam.name == "RoPE":
            assert k.nbytes == 2 * d * (elements + math.prod(fam.shapes[1])), k.name
        else:
            values, masks = PER_ELEMENT[(fam.name, k.name.endswith(" backward"))]
            assert k.nbytes == (values * d + masks * MASK_BYTES) * elements, k.name


def test_the_cpu_run_records_every_memory_bound_kernel_once_per_implementation(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_memory_kernels.py"), str(tmp_path), "--device",
                           "cpu", "--tiny", "--impls", "eager", "--only", "tiny GPT,tiny Llama"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "memory_kernels.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["family"] for r in rows[:2]] == ["copy", "LayerNorm"] and rows[1]["case"].startswith("Liger")
    for case in TINY_CASES:
        mine = [(r["phase"], r["kernel"], r["impl"]) for r in rows if r["case"] == case.label]
        assert mine == [(p, k.name, "eager") for p, k in _memory_bound(case)]
    assert all(float(r["seconds"]) > 0 and float(r["gpu_seconds"]) == 0 for r in rows)  # no GPU: no kernel time


def test_bad_implementations_are_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_memory_kernels.py"), str(tmp_path), "--device",
                           "cpu", "--tiny", "--impls", "jit"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--impls 'jit'" in done.stderr
    assert not (tmp_path / "memory_kernels.csv").exists()


def test_the_comparison_weights_each_family_by_bytes_over_the_gpu_kernel_time(capsys):
    with open(RECORDING, newline="") as fh:
        rows = list(csv.DictReader(fh))
    timed = {r["case"] for r in rows if r["case"] and not r["case"].startswith("Liger")}
    assert timed == {c.label for c in CASES}  # all 14 layers
    assert all(float(r["gpu_seconds"]) > 0 for r in rows)
    assert compare_main([str(RECORDING)]) == 0
    out = capsys.readouterr().out
    # the residual adds, by hand: distinct (case, bytes, seconds) measurements
    adds = {(r["case"], int(r["nbytes"]), float(r["gpu_seconds"])) for r in rows
            if r["family"] == "add" and r["impl"] == "eager"}
    expected = sum(b for _, b, _ in adds) / sum(s for _, _, s in adds) / H200_HBM
    assert f"  {'add':18s} F: eager {expected:.3f} ({len(adds)})" in out
    # KOR22 22B's forward list: every kernel's bytes over its eager kernel time
    mine = [r for r in rows if r["case"].startswith("KOR22 22B") and r["phase"] == "F" and r["impl"] == "eager"]
    rate = sum(int(r["nbytes"]) for r in mine) / sum(float(r["gpu_seconds"]) for r in mine) / H200_HBM
    assert f"KOR22 22B (tp 8, b 4)      F:    2491 MB  eager {rate:.3f}" in out
    assert "the profile charges every memory-bound kernel 0.572 of it" in out


def test_a_missing_recording_is_one_line_and_exit_2(tmp_path, capsys):
    assert compare_main([str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_memory_kernels_compare.py: ") and err.count("\n") == 1


def test_transformer_engine_folds_the_qkv_bias_into_its_gemms():
    """--transformer-impl transformer_engine: the biased QKV's bias add and bias gradient leave the layer's kernels
    (TE adds the bias in the GEMM's epilogue and takes its gradient in the wgrad GEMM); the projection's and the MLP's
    bias gradients stay (Megatron-core gives those linears skip_bias_add=True: fused bias-dropout-add and bias
    activation), and every other kernel is the same."""
    from dataclasses import replace

    from pipesim.model.config import ModelConfig
    from pipesim.model.layer_kernels import layer_kernels
    from pipesim.model.options import LayerOptions

    gpt = ModelConfig(kind="gpt", hidden=256, layers=2, heads=4, seq=64, vocab=512, batch=4, dtype="bfloat16")
    assert gpt.biases
    opts = LayerOptions(tp=2, sp=True, attention="flash")
    local, te = (layer_kernels(gpt, 2, o) for o in (opts, replace(opts, te_linear=True)))
    names = [[k.name for k in phase] for phase in (local.F, local.I, local.W)]
    te_names = [[k.name for k in phase] for phase in (te.F, te.I, te.W)]
    assert "QKV bias add" in names[0] and "QKV bias gradient" in names[2]
    assert te_names == [[n for n in phase if n not in ("QKV bias add", "QKV bias gradient")] for phase in names]
    assert {"projection bias gradient", "FC1 bias gradient", "FC2 bias gradient"} <= set(te_names[2])
    no_bias = replace(gpt, biases=False)
    assert layer_kernels(no_bias, 2, opts) == layer_kernels(no_bias, 2, replace(opts, te_linear=True))
