"""OpenAI's GPT-OSS read from its config.json (pipesim.model.hf_gpt_oss): windows on every other layer, attention
sinks, biased experts and router; exact parameter counts against the model card's (OpenAI, "gpt-oss-120b &
gpt-oss-20b Model Card", 2025-08-05, arXiv:2508.10925, Table 1: 116.83B total and 5.13B active; 20.91B and
3.61B), and what stays refused."""

from __future__ import annotations

import json

import pytest

from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.model.attention_window import SlidingWindow
from pipesim.model.hf_config import hf_key_report, load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.moe import MoeConfig
from pipesim.model.param_counts import active_params, model_params

H, A, KV, D, V = 2880, 64, 8, 64, 201088  # hidden, heads, kv heads, head_dim, vocabulary
ATTENTION = H * A * D + A * D + 2 * (H * KV * D + KV * D) + A * D * H + H + A  # q, k, v, o with biases; the sinks
EXPERT = H * 2 * H + 2 * H + H * H + H  # gate_up (2 x 2880) and down, each with its bias (intermediate_size 2880)
ROUTER = H * 128 + 128  # its linear's weight and bias (120b: 128 experts)


def test_bundled_files_read_every_key():
    """The published config.json files less quantization_config (the checkpoint's MXFP4 experts)."""
    for name, layers, experts in (("gpt-oss-120b", 36, 128), ("gpt-oss-20b", 24, 32)):
        cfg = read_hf_config(resolve_model_config(name))
        report = hf_key_report(name)
        assert set(report.read) | set(report.ignored) == set(cfg) and "quantization_config" not in cfg
        assert "initial_context_length" in report.ignored and {"swiglu_limit", "rope_scaling"} <= set(report.read)
        model = load_hf_config(name, seq=4096)
        assert (model.layers, model.head_width, model.kv_heads, model.biases, model.attention_sinks) == \
            (layers, D, KV, True, True)
        assert model.window == SlidingWindow(128, full_every=2) and model.windowed_layers(0, layers) == layers // 2
        assert model.moe == MoeConfig(experts=experts, top_k=4, expert_ffn=H, renormalize=True, router_bias=True,
                                      glu_clamp=7.0, glu_alpha=1.702, glu_offset=1.0)


def test_exact_parameter_counts_round_to_the_model_cards():
    """Total and active parameters; the card's active figure counts the unembedding but not the embedding lookup."""
    big, small = load_hf_config("gpt-oss-120b"), load_hf_config("gpt-oss-20b")
    norms = 2 * H
    per_layer = ATTENTION + norms + ROUTER + 128 * EXPERT
    assert model_params(big) == 36 * per_layer + 2 * V * H + H == 116_829_156_672
    assert round(model_params(big) / 1e9, 2) == 116.83
    active = 36 * (ATTENTION + norms + ROUTER + 4 * EXPERT) + 2 * V * H + H
    assert active_params(big) == active and round((active - V * H) / 1e9, 2) == 5.13
    small_router = H * 32 + 32
    assert model_params(small) == 24 * (ATTENTION + norms + small_router + 32 * EXPERT) + 2 * V * H + H
    assert round(model_params(small) / 1e9, 2) == 20.91
    assert round((active_params(small) - V * H) / 1e9, 2) == 3.61


def test_layer_types_and_what_stays_refused(tmp_path):
    """No layer_types: GptOssConfig's alternation; a pattern full_every cannot say, the MXFP4 checkpoint's
    quantization_config and attention_bias false are refused in one line each."""
    cfg = read_hf_config(resolve_model_config("gpt-oss-20b"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in cfg.items() if k != "layer_types"}))
    assert load_hf_config(path) == load_hf_config("gpt-oss-20b")
    odd = ["full_attention" if n in (1, 2) else "sliding_attention" for n in range(24)]
    cases = [({"layer_types": odd}, "field 'layer_types' puts full attention on layers [1, 2]: pipesim models a "
                                    "window on every layer or full attention on every k-th"),
             ({"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config (quantized weights)"),
             ({"attention_bias": False}, "field 'attention_bias' false, but GPT-OSS's experts and router keep"),
             ({"experts_per_token": 2}, "field 'experts_per_token' 2 disagrees with num_experts_per_tok 4")]
    for change, message in cases:
        path.write_text(json.dumps({**cfg, **change}))
        with pytest.raises(PipesimError) as err:
            load_hf_config(path)
        assert message in str(err.value) and "\n" not in str(err.value)
    every = {**cfg, "layer_types": ["sliding_attention"] * 24}
    path.write_text(json.dumps(every))
    assert load_hf_config(path).window == SlidingWindow(128)


def test_simulate_from_the_cli(capsys):
    """gpt-oss-120b on 64 H100s (pp 4, ep 8, the distributed optimizer) runs; its --json lists what it ignored."""
    args = ["simulate", "1f1b", "--model-config", "gpt-oss-120b", "--seq", "4096", "--batch", "512",
            "--microbatch-size", "1", "--stages", "4", "--ep", "8", "--dp", "16", "--zero", "1",
            "--hardware", "dgx-h100", "--nodes", "8", "--attention", "flash", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert "initial_context_length" in result["model_config"]["ignored"] and result["step_time"] > 0
