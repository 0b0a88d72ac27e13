"""DeepSeek-V2's files read as DeepSeek-V3's layer (pipesim.model.hf_keys.TYPE_ALIASES): DeepSeek-V2-Lite's config.json,
its exact parameter count against DeepSeek's published total (deepseek-ai/DeepSeek-V2-Lite model card and the
DeepSeek-V2 paper, arXiv:2405.04434: 15.7B parameters, 27 layers, hidden 2048, 16 heads, MLA with a 512 KV latent and
no query compression, the first layer dense, 64 routed experts of 1408, 6 per token, 2 shared), and the head_dim that
transformers writes into the DeepSeek files it saves."""

from __future__ import annotations

import json

import pytest

from pipesim.errors import PipesimError
from pipesim.model.hf_config import hf_key_report, load_hf_config
from pipesim.model.latent_attention import LatentAttention
from pipesim.model.moe import MoeConfig
from pipesim.model.param_counts import active_params, model_params

# deepseek-ai/DeepSeek-V2-Lite's config.json (its auto_map names the repository's configuration_deepseek and
# modeling_deepseek: DeepseekV2Config, DeepseekV2ForCausalLM)
V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV2Config",
                 "AutoModel": "modeling_deepseek.DeepseekV2Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
    "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 102400}
H, A, V = 2048, 16, 102400  # hidden, heads, vocabulary
DC, NOPE, ROPE, DV = 512, 128, 64, 128  # kv_lora_rank, qk_nope, qk_rope, v_head_dim (no q_lora_rank)
F, FE, E, K, S = 10944, 1408, 64, 6, 2  # dense width, expert width, routed experts, per token, shared experts
# q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj (DeepseekV2Attention)
ATTENTION = H * A * (NOPE + ROPE) + H * (DC + ROPE) + DC + DC * A * (NOPE + DV) + A * DV * H
EXPERT = 3 * H * FE  # gate_proj, up_proj, down_proj


def _load(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return load_hf_config(path, seq=4096, batch=32)


def test_a_deepseek_v2_file_is_read_as_deepseek_v3s_layer(tmp_path):
    """Every key read or listed as ignored; the same model as the file renamed deepseek_v3; softmax greedy routing
    without V3's score bias; no multi-token prediction; YaRN's factors (mscale = mscale_all_dim) scale nothing."""
    lite = _load(tmp_path, V2_LITE)
    assert lite.moe == MoeConfig(experts=E, top_k=K, expert_ffn=FE, shared_experts=S, dense_layers=1,
                                 expert_bias=False, groups=1, group_topk=None)
    assert lite.mla == LatentAttention(q_lora_rank=None, kv_lora_rank=DC, qk_nope_dim=NOPE, qk_rope_dim=ROPE,
                                       v_head_dim=DV)
    assert (lite.layers, lite.heads, lite.hidden, lite.vocab, lite.mtp_layers, lite.ffn_size, lite.rope_mscale) == (
        27, A, H, V, 0, F, 1.0)
    assert _load(tmp_path, {**V2_LITE, "model_type": "deepseek_v3"}) == lite
    path = tmp_path / "config.json"
    report = hf_key_report(path)
    assert set(report.read) | set(report.ignored) == set(V2_LITE)
    assert {"aux_loss_alpha", "seq_aux", "routed_scaling_factor"} <= set(report.ignored)
    assert "scoring_func" in report.read  # V2's softmax: the executor's router computes it (MoeConfig.score)


def test_exact_parameter_count_rounds_to_deepseeks_total(tmp_path):
    """One dense layer and 26 MoE layers (router, 64 experts, the 2 shared as one MLP of 2 x 1408); the embedding
    and the head untied: 15.7B, the model card's total."""
    lite = _load(tmp_path, V2_LITE)
    ends = 2 * V * H + H  # embedding, head, final norm
    dense_layer = ATTENTION + 2 * H + 3 * H * F
    moe_layer = ATTENTION + 2 * H + H * E + E * EXPERT + S * EXPERT
    assert model_params(lite) == ends + dense_layer + 26 * moe_layer == 15_706_484_224
    assert round(model_params(lite) / 1e9, 1) == 15.7
    active = ends + dense_layer + 26 * (ATTENTION + 2 * H + H * E + K * EXPERT + S * EXPERT)
    assert active_params(lite) == active == 2_661_150_208  # with the embedding and head whole, as for V3


def test_transformers_head_dim_is_ropes_width_and_another_is_refused(tmp_path):
    """transformers' DeepseekV2Config and DeepseekV3Config set head_dim = qk_rope_head_dim, and a file they save
    carries it: read past when it is that, refused otherwise (it would not be a width pipesim reads)."""
    assert _load(tmp_path, {**V2_LITE, "head_dim": ROPE}) == _load(tmp_path, V2_LITE)
    with pytest.raises(PipesimError) as err:
        _load(tmp_path, {**V2_LITE, "head_dim": 128})
    assert "field 'head_dim' 128 is not qk_rope_head_dim 64 (transformers' DeepSeek configs set it so" in str(err.value)


@pytest.mark.parametrize(("change", "message"), [
    ({"n_group": "2"}, "field 'n_group' must be a positive integer, got '2'"),
    ({"n_group": 0}, "field 'n_group' must be a positive integer, got 0"),
    ({"n_group": 3}, "field 'n_group' 3 does not divide n_routed_experts 64"),
    ({"n_group": 8, "topk_group": None}, "field 'n_group' 8 needs topk_group"),
    ({"topk_group": 7}, "field 'topk_group' 7 is more than n_group 1"),
    ({"n_group": 8, "topk_group": "3"}, "field 'topk_group' must be a positive integer, got '3'"),
    ({"topk_method": ["greedy"]}, "field 'topk_method' ['greedy'] is not DeepSeek's"),
    ({"scoring_func": {"a": 1}}, "field 'scoring_func' {'a': 1} is not DeepSeek's"),
    ({"moe_layer_freq": True}, "field 'moe_layer_freq' True: DeepSeek places experts"),
    ({"qk_rope_head_dim": 3}, "latent attention qk_rope_dim 3 is odd: rotary embeddings turn pairs of features"),
    ({"num_nextn_predict_layers": 10 ** 12}, "1000000000000 multi-token-prediction modules beside 27 layers are "
                                             "above pipesim's bound of 65,536 layers"),
])
def test_a_bad_routing_or_latent_field_is_one_line_naming_the_file(tmp_path, change, message):
    """Fuzzed on 2026-12-07: these raised TypeError (n_group, topk_method of another type) or ran for ever (10^12
    multi-token-prediction modules, each costed as a layer)."""
    with pytest.raises(PipesimError) as err:
        _load(tmp_path, {**V2_LITE, **change})
    assert str(err.value).startswith(f"{tmp_path / 'config.json'}: ") and message in str(err.value)
