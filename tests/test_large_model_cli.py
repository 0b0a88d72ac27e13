"""Issue 14's flags through `pipesim simulate`: Korthikanti's closed forms in --json, monotonic effects of
recomputation, ZeRO bytes per stage, the microbatch spellings, and bad input as one line with exit 2."""

from __future__ import annotations

import json

import pytest

from pipesim.cli import main

GPT = ["--model", "gpt", "--hidden", "256", "--heads", "8", "--seq", "64", "--vocab", "512", "--layers", "8",
       "--batch", "16", "--dtype", "bfloat16", "--hardware", "dgx-h100", "--attention", "eager"]


def sim(capsys, *argv) -> dict:
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("tp,extra,per_layer", [
    (1, [], lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h)),
    (4, [], lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    (4, ["--sequence-parallel"], lambda s, b, h, a, t: s * b * h / t * (34 + 5 * a * s / h)),
    (4, ["--recompute", "selective"], lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
    (4, ["--recompute", "selective", "--sequence-parallel"], lambda s, b, h, a, t: s * b * h / t * 34),
    (1, ["--recompute", "full"], lambda s, b, h, a, t: 2 * s * b * h),
])
def test_korthikanti_activations_per_layer_in_json(capsys, tp, extra, per_layer):
    # one middle stage of 2 layers, one microbatch in flight under gpipe with m = 1: stash = 2 x per layer
    argv = [*GPT, "gpipe", "-p", "4", "-m", "1", "--tp", str(tp), "--layer-split", "2,2,2,2", "--nodes", "2", *extra]
    d = sim(capsys, *argv)
    rank1 = d["memory"]["ranks"][1]
    assert rank1["inflight"] == 1
    assert rank1["activations"] == 2 * per_layer(64, 16, 256, 8, tp)


def test_recompute_costs_time_and_saves_memory(capsys):
    runs = {r: sim(capsys, *GPT, "1f1b", "-p", "4", "-m", "8", "--recompute", r) for r in ("none", "selective", "full")}
    t = {r: d["makespan"] for r, d in runs.items()}
    mem = {r: d["memory"]["ranks"][0]["activations"] for r, d in runs.items()}
    assert t["full"] > t["selective"] > t["none"]
    assert mem["full"] < mem["selective"] < mem["none"]
    assert runs["full"]["memory"]["ranks"][0]["recompute"] > 0 == runs["none"]["memory"]["ranks"][0]["recompute"]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_bytes_per_stage(capsys, zero):
    """ZeRO paper's division, plus ZeRO 3's chunk gathered from the step's start on top of its shard."""
    d = sim(capsys, *GPT, "1f1b", "-p", "2", "-m", "2", "--dp", "4", "--zero", str(zero))
    base = sim(capsys, *GPT, "1f1b", "-p", "2", "-m", "2", "--dp", "4")["memory"]["ranks"][0]
    params = base["parameters"] // 2  # mixed precision: 2 bytes per parameter
    got = d["memory"]["ranks"][0]
    shard = -(-params // 4)
    assert (got["parameters"], got["gradients"], got["optimizer_states"]) == (  # bfloat16: float32 main grads
        2 * (params + shard if zero == 3 else params), 4 * (shard if zero >= 2 else params),
        12 * (shard if zero else params))


def test_microbatch_size_spelling(capsys):
    a = sim(capsys, *GPT, "1f1b", "-p", "2", "--dp", "2", "--microbatch-size", "2")
    assert a["schedule"]["microbatches"] == 4  # 16 / (2 x 2)
    b = sim(capsys, *GPT, "1f1b", "-p", "2", "--dp", "2", "-m", "4", "--microbatch-size", "2")
    assert b["makespan"] == a["makespan"]


@pytest.mark.parametrize("argv,message", [
    (["-m", "3", "--microbatch-size", "2"], "--microbatches 3 and --microbatch-size 2 disagree"),
    (["--microbatch-size", "3"], "--batch 16 does not split into dp(1) x microbatches of --microbatch-size 3"),
    (["--cp", "3", "--attention", "flash", "-p", "2"], "--seq 64 is not divisible by 2 x cp(3)"),
    (["--cp", "2"], "--cp 2 needs --attention flash"),
    (["--kv-heads", "3"], "--kv-heads 3 must divide --heads 8"),
    (["--model-config", "no-such-model"], "--model-config no-such-model: no such file or bundled config"),
    (["--layer-split", "4,0,4,1", "-p", "4"], "layer split [4, 0, 4, 1] must have 4 entries of 0 or more layers"),
    (["--nodes", "2", "--hardware", "local-cpu"], "names no network to join nodes with"),
])
def test_bad_input_one_line_exit_2(capsys, argv, message):
    base = [a for a in GPT]
    code = main(["simulate", "1f1b", *base, *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err


def test_model_config_missing_field_one_line(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 256, "num_attention_heads": 8, "intermediate_size": 512,
                               "vocab_size": 512, "max_position_embeddings": 64}))
    assert main(["simulate", "1f1b", "--model-config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"pipesim: error: {cfg}: field 'num_hidden_layers' is missing"


def test_llama_config_and_nodes(capsys):
    d = sim(capsys, "1f1b", "--model-config", "llama3-8b", "--seq", "8192", "--batch", "64", "--microbatch-size",
            "1", "--tp", "8", "-p", "4", "--dp", "2", "--hardware", "dgx-h100", "--nodes", "8", "--zero", "1")
    assert d["hardware"] == "8x-dgx-h100"
    assert d["options"] == {"recompute": "none", "sequence_parallel": False, "attention": "flash", "cp": 1,
                            "zero": 1, "nodes": 8}
    assert d["schedule"]["microbatches"] == 32
