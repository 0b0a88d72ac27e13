"""`pipesim calibrate --from-trace`: torch's own Schedule1F1B on 2 CPU ranks under the profiler (tests/conftest.py's
`profiled_traces`, shared with tests/test_trace_import.py: one Linear(256, 256) + ReLU per stage, batch 32, m = 4,
5 steps), imported, fitted to a hardware file whose simulation of that run lands within the CPU validation's
error (docs/validation.md: goal max 10 % on held-out runs). The CLI runs in process (pipesim.cli.main)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipesim.calibration.measured import typical_metrics
from pipesim.cli import main
from pipesim.cost.executor_ops import EMBED_ROPE_OPS, GPT_BLOCK_OPS, HEAD_RMSNORM_OPS, add_ops, executor_block_ops
from pipesim.cost.stage_work import stage_work
from pipesim.model.config import ModelConfig
from pipesim.trace_import import import_traces

ROOT = Path(__file__).parent.parent
FACTORY = "tests/workers/profiled_pipeline.py:make"  # sized by PROFILED_HIDDEN / PROFILED_BATCH when called
VALIDATION_MAX_ERROR = 0.10  # docs/validation.md: held-out goal, max <= 10 %


@pytest.fixture
def traces(profiled_traces, monkeypatch) -> Path:
    """The 1f1b traces; the factory sized as the traced run, paths relative to the repository as a user's."""
    for key, value in profiled_traces.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT)
    return profiled_traces.one_f_one_b


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_calibrated_from_torchs_1f1b_trace_predicts_that_run(traces, profiled_traces, tmp_path, capsys):
    batch, m = str(profiled_traces.batch), str(profiled_traces.m)
    hw = tmp_path / "hw.toml"
    code, calibrated, err = _cli(capsys, "calibrate", "--from-trace", str(traces), "--model", FACTORY, "--batch", batch,
                                 "-o", str(hw))
    assert code == 0, err[-2000:]
    assert hw.is_file() and "calibrated-cpu" in hw.read_text()
    measured = typical_metrics([import_traces([str(traces)])])[0]  # seconds: the traced run's typical step
    code, out, err = _cli(capsys, "simulate", "1f1b", "-p", str(profiled_traces.p), "-m", m, "--model", FACTORY,
                          "--batch", batch, "--hardware", str(hw), "--json")
    assert code == 0, err[-2000:]
    predicted = json.loads(out)["makespan"]
    print(calibrated)
    print(f"traced step {measured * 1e3:.3f} ms, predicted {predicted * 1e3:.3f} ms ({predicted / measured - 1:+.1%})")
    assert abs(predicted / measured - 1) <= VALIDATION_MAX_ERROR
    assert f"measured {measured * 1e3:.3f} ms" in calibrated  # the command reports the same figure


def test_from_trace_needs_the_runs_model(traces, tmp_path, capsys):
    code, _, err = _cli(capsys, "calibrate", "--from-trace", str(traces), "-o", str(tmp_path / "hw.toml"))
    assert code == 2 and err.strip().splitlines() == [
        "pipesim: error: --from-trace needs --model: the traced run's model (mlp or gpt with its sizes, or "
        "MODULE:FACTORY; or --model-config) and its --batch"]
    assert not (tmp_path / "hw.toml").exists()


def test_a_traced_transformers_structure_is_taken_only_with_from_trace(tmp_path, capsys):
    """--model-config and the structure flags size a traced run's model (as `pipesim run` takes them); with the
    executor runs or --gpu they are refused in one line, never read past."""
    out = str(tmp_path / "hw.toml")
    code, _, err = _cli(capsys, "calibrate", "--quick", "--model-config", "llama3-8b", "-o", out)
    assert code == 2 and err.strip().splitlines() == [
        "pipesim: error: --model, --model-config and --schedule describe a traced run: give them with --from-trace"]
    code, _, err = _cli(capsys, "calibrate", "--quick", "--kv-heads", "2", "-o", out)
    assert code == 2 and err.strip().splitlines() == [
        "pipesim: error: --kv-heads sizes a traced run's model (--from-trace): it does nothing with the executor runs"]
    code, _, err = _cli(capsys, "calibrate", "--from-measurements", "m.csv", "--model-config", "llama3-8b", "-o", out)
    assert code == 2 and "--model-config and --schedule calibrate from a traced run, not with --from-measurements" \
        in err


def test_the_trace_fit_inverts_the_ops_a_calibrated_cpu_host_charges_for_the_models_structure():
    """The fit (stage_work) counts what the simulator charges a calibrated CPU host (model_costs' executor ops): a
    Llama-shaped block's structure ops (RMSNorm, RoPE, SwiGLU) and the rope embedding's, the GPT's where it is one."""
    llama = ModelConfig(kind="gpt", hidden=64, heads=4, kv_heads=2, layers=4, seq=16, vocab=128, batch=8,
                        activation="swiglu", norm="rmsnorm", positions="rope", biases=False, dropout=False)
    (first, _, first_ops), (last, _, last_ops) = stage_work(llama, 2, 4)
    block = executor_block_ops(llama)
    assert block != GPT_BLOCK_OPS
    assert first_ops == tuple(2 * n + e for n, e in zip(block, add_ops((3, 0, 2), EMBED_ROPE_OPS), strict=True))
    assert last_ops == tuple(2 * n + h for n, h in zip(block, add_ops((3, 3, 2), HEAD_RMSNORM_OPS), strict=True))
    gpt = ModelConfig(kind="gpt", hidden=64, heads=4, layers=4, seq=16, vocab=128, batch=8)
    assert stage_work(gpt, 2, 4)[1][2] == tuple(2 * n + h for n, h in zip(GPT_BLOCK_OPS, (3, 3, 2), strict=True))
