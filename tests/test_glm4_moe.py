"""A "glm4_moe" config.json (Zhipu's GLM-4.5 family: transformers' Glm4MoeForCausalLM) read as what its code builds
(pipesim.model.hf_deepseek.glm4_moe_fields): grouped-query attention with heads of head_dim and biases on q, k and v
alone, RoPE on half of each head, DeepSeek-V3's experts with the router's score bias always there, and a
multi-token-prediction module. GLM-4.5-Air's exact count against the model card's "106 billion total parameters"
(zai-org/GLM-4.5-Air), and a step simulated with heads that do not divide the hidden size."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.model.hf_config import hf_key_report, load_hf_config
from pipesim.model.moe import MoeConfig
from pipesim.model.param_counts import model_params

# zai-org/GLM-4.5-Air's configuration as transformers 4.54.1 loads it (Glm4MoeConfig: the keys of its config.json)
GLM45_AIR = {
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338], "first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 131072,
    "model_type": "glm4_moe", "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8,
    "num_hidden_layers": 46, "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "pad_token_id": 151329,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
    "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.1", "use_cache": True, "use_qk_norm": False, "vocab_size": 151552}
H, A, KV, D, V = 4096, 96, 8, 128, 151552  # hidden, heads, key/value heads, head_dim, vocabulary
F, FE, E = 10944, 1408, 128  # dense width, expert width, routed experts
# q_proj, k_proj, v_proj with their biases, o_proj (bias-free), the two RMSNorms (Glm4MoeAttention, the layer's norms)
ATTENTION = H * (A + 2 * KV) * D + (A + 2 * KV) * D + A * D * H + 2 * H
EXPERT = 3 * H * FE  # gate_proj, up_proj, down_proj
MOE = H * E + E + E * EXPERT + EXPERT  # the router's weight and score bias, the experts, the one shared


def _load(tmp_path, cfg: dict, **kw):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return load_hf_config(path, seq=4096, **kw)


def test_glm4_moe_is_read_as_its_code_builds_it(tmp_path):
    air = _load(tmp_path, GLM45_AIR)
    assert (air.qkv_bias, air.biases, air.head_width, air.num_kv_heads, air.qk_norm, air.norm) == (
        True, False, D, KV, False, "rmsnorm")
    assert (air.rotary.fraction, air.mtp_layers, air.ffn_size) == (0.5, 1, F)
    assert air.moe == MoeConfig(experts=E, top_k=8, expert_ffn=FE, shared_experts=1, dense_layers=1,
                                expert_bias=True, groups=1, group_topk=None, score="sigmoid")
    report = hf_key_report(tmp_path / "config.json")
    assert set(report.read) | set(report.ignored) == set(GLM45_AIR)
    assert _load(tmp_path, {**GLM45_AIR, "use_qk_norm": True}).qk_norm is True


def test_exact_parameter_count_rounds_to_the_model_cards_total(tmp_path):
    """One dense layer, 45 with experts, the embedding and the head untied: 106.85B, the card's "106 billion"; the
    multi-token-prediction module (its projection 2h -> h, three norms and an MoE layer) on top of it."""
    air = _load(tmp_path, GLM45_AIR)
    main_model = 2 * V * H + H + (ATTENTION + 3 * H * F) + 45 * (ATTENTION + MOE)
    assert model_params(replace(air, mtp_layers=0)) == main_model == 106_852_251_264
    assert int(main_model / 1e9) == 106
    assert model_params(air) == main_model + 2 * H * H + 3 * H + ATTENTION + MOE


def test_a_glm4_moe_step_simulates_with_heads_that_do_not_divide_the_hidden_size(tmp_path, capsys):
    """96 heads of 128 over a 4096 hidden: the CPU-fit's GPT-shaped reference block takes one head there."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GLM45_AIR))
    assert main(["simulate", "1f1b", "--stages", "8", "--model-config", str(path), "--seq", "4096", "--batch", "64",
                 "--microbatch-size", "1", "--ep", "4", "--dp", "4", "--zero", "1", "--recompute", "full",
                 "--hardware", "dgx-h100", "--nodes", "4", "--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] > 0


def test_biases_glm_does_not_build_are_refused(tmp_path):
    with pytest.raises(PipesimError) as err:
        _load(tmp_path, {**GLM45_AIR, "mlp_bias": True})
    assert "field 'mlp_bias' is true, but GLM-4.5's MLPs and experts are built bias-free" in str(err.value)
