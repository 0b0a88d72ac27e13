"""bench/gpu_layers.py (the layer kernels timed on a GPU) on the CPU's tiny cases, and bench/gpu_layers_compare.py on
the H200 recording (tests/data/gpu_layers_h200.csv)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_layers  # noqa: E402
from gpu_layer_configs import CASES, DTYPE, TINY_CASES  # noqa: E402
from gpu_layers_compare import main as compare_main  # noqa: E402

from pipesim.cost.device_profiles import profile_of  # noqa: E402
from pipesim.cost.kernel_costs import kernel_seconds  # noqa: E402

RECORDING = ROOT / "tests/data/gpu_layers_h200.csv"


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_the_cpu_run_times_every_kernel_of_both_lists_each_phase_and_the_eager_block(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_layers.py"), str(tmp_path), "--device", "cpu",
                           "--tiny", "--blocks", "eager,megatron"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = _rows(tmp_path / "layers.csv")
    for case in TINY_CASES:
        mine = [r for r in rows if r["case"] == case.label]
        names = {k.name for fused in (True, False) for p in "FIW" for k in getattr(case.kernels(fused), p)}
        assert sorted(r["kernel"] for r in mine if r["mode"] == "alone") == sorted(names)  # each kernel once
        phases = [(r["mode"], r["phase"]) for r in mine if r["mode"] != "alone"]
        expected = [(m, p) for m in ("sequence-fused", "sequence-unfused") for p in "FIW"]
        blocks = [(b, p) for b in ("eager", "megatron") for p in "FB"]
        assert phases == expected + (blocks if case.eager_layer else [])
        assert all(float(r["seconds"]) >= 0 for r in mine)
    assert json.loads((tmp_path / "meta.json").read_text())["device"] == "cpu"
    for block in ("eager", "megatron"):
        assert "traceEvents" in json.loads((tmp_path / f"{block}_trace.json").read_text())


def test_the_megatron_block_is_the_eager_block_in_megatrons_layout():
    """With the QKV weight's rows reordered from [3, heads, head_dim] to Megatron's [heads, 3, head_dim] and no
    dropout, both blocks compute the same function (the benchmark times the same layer twice, two ways)."""
    case = TINY_CASES[0]
    eager = gpu_layers.EagerGptBlock(case, torch.device("cpu"), torch.float32)
    megatron = gpu_layers.MegatronGptBlock(case, torch.device("cpu"), torch.float32)
    state = dict(eager.state_dict())
    heads, hd = eager.heads, eager.head_dim
    for name in ("w_qkv", "b_qkv"):
        t = state[name]
        state[name] = t.view(3, heads, hd, *t.shape[1:]).transpose(0, 1).reshape(t.shape)
    megatron.load_state_dict(state)
    x = torch.randn(case.b, case.model.seq, case.model.hidden)
    old, gpu_layers.DROPOUT = gpu_layers.DROPOUT, 0.0
    try:
        ours, theirs = eager(x), megatron(x.transpose(0, 1).contiguous()).transpose(0, 1)
    finally:
        gpu_layers.DROPOUT = old
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


def test_the_recording_holds_every_case_and_the_comparison_is_the_kernel_model(capsys):
    rows = _rows(RECORDING)
    assert {r["case"] for r in rows} == {c.label for c in CASES}
    assert compare_main([str(RECORDING)]) == 0
    out = capsys.readouterr().out
    case = next(c for c in CASES if c.label.startswith("KOR22 22B"))
    model = sum(kernel_seconds(k, DTYPE, profile_of("H200")) for k in case.kernels(True).F)
    alone = sum(float(r["seconds"]) for r in rows if r["case"] == case.label and r["mode"] == "alone"
                and r["kernel"] in {k.name for k in case.kernels(True).F})
    assert f"  fused   F: model {model * 1e3:8.3f} ms | kernels alone {alone * 1e3:8.3f} ms" in out
    assert out.count("eager torch block:") == sum(c.eager_layer for c in CASES)
    compiled = {r["phase"]: float(r["seconds"]) for r in rows if r["case"] == case.label and r["mode"] == "compiled"}
    assert (f"  torch.compile block:   F {compiled['F'] * 1e3:8.3f} ms (model fused {model / compiled['F'] - 1:+6.1%})"
            in out)  # the compiled block beside the fused list, the Megatron-layout one beside the unfused list
    assert out.count("torch.compile block:") == out.count("Megatron-layout block:") == sum(c.eager_layer for c in CASES)


def test_a_missing_recording_is_one_line_and_exit_2(tmp_path, capsys):
    assert compare_main([str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_layers_compare.py: ") and err.count("\n") == 1
