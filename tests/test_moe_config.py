"""Mixture-of-experts models from Hugging Face config.json: Mixtral read into ModelConfig.moe, exact total and active
parameter counts against Mistral AI's published figures, MoeConfig's one-line refusals, and the MoE configs that stay
refused because pipesim cannot count their layers exactly (pipesim.model.hf_config, hf_keys, param_counts, moe)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.executor_scope import unbuilt_structure
from pipesim.model.hf_config import hf_key_report, load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.moe import MoeConfig
from pipesim.model.param_counts import (
    active_params,
    block_params,
    embedding_params,
    expert_params,
    head_params,
    mlp_params,
    model_params,
    moe_mlp_params,
    router_params,
    shared_expert_params,
)
from tests.config_files import config_refusal, write_config

# a Mixtral-shaped file small enough to count by hand: h 64, 4 heads of 16, 2 kv heads, 4 experts of width 96, top 2
TINY_MIXTRAL = {"architectures": ["MixtralForCausalLM"], "hidden_act": "silu", "hidden_size": 64,
                "intermediate_size": 96, "max_position_embeddings": 256, "model_type": "mixtral",
                "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 2,
                "num_local_experts": 4, "output_router_logits": False, "rms_norm_eps": 1e-05,
                "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False,
                "torch_dtype": "bfloat16", "vocab_size": 100}


# -- Mixtral: the bundled configs and their published parameter counts -------------------------------------------

@pytest.mark.parametrize("name,layers,hidden,heads,ffn,max_seq,total,active", [
    # Mistral AI, "Mixtral of experts" (mistral.ai/news/mixtral-of-experts, 2023-12-11): "46.7B total parameters but
    # only uses 12.9B parameters per token"
    ("mixtral-8x7b", 32, 4096, 32, 14336, 32768, 46_702_792_704, 12_879_925_248),
    # Mistral AI, "Cheaper, Better, Faster, Stronger" (mistral.ai/news/mixtral-8x22b, 2024-04-17): "uses only 39B
    # active parameters out of 141B"
    ("mixtral-8x22b", 56, 6144, 48, 16384, 65536, 140_620_634_112, 39_152_031_744),
])
def test_bundled_mixtral_configs_and_their_published_parameter_counts(name, layers, hidden, heads, ffn, max_seq,
                                                                       total, active):
    model = load_hf_config(name)
    assert (model.layers, model.hidden, model.heads, model.num_kv_heads, model.vocab, model.seq) == \
        (layers, hidden, heads, 8, 32000, max_seq)
    assert (model.activation, model.norm, model.dropout, model.biases, model.positions, model.tied_embeddings,
            model.dtype) == ("swiglu", "rmsnorm", False, False, "rope", False, "bfloat16")
    assert model.moe == MoeConfig(experts=8, top_k=2, expert_ffn=ffn, renormalize=True) and model.ffn_size == ffn
    assert model.moe.moe_layers(0, model.layers) == layers  # every layer's MLP is the mixture
    assert (model_params(model), active_params(model)) == (total, active)
    published_total, published_active = {"mixtral-8x7b": (46.7, 12.9), "mixtral-8x22b": (141, 39)}[name]
    digits = 1 if isinstance(published_total, float) else 0
    assert round(total / 1e9, digits) == published_total and round(active / 1e9, digits) == published_active


def test_mixtral_8x7b_counts_piece_by_piece():
    """h 4096, g 8 kv heads of 128, f 14336, E 8, k 2, V 32000, 32 layers, untied, no biases, RMSNorm."""
    model = load_hf_config("mixtral-8x7b")
    h, hkv, f, vocab = 4096, 8 * 128, 14336, 32000
    attention, norms = h * (h + 2 * hkv) + h * h, 2 * h
    assert expert_params(model) == 3 * h * f == 176_160_768  # w1, w3 (h -> f) and w2 (f -> h)
    assert router_params(model) == h * 8 and shared_expert_params(model) == 0
    assert moe_mlp_params(model) == h * 8 + 8 * 3 * h * f
    ends = 2 * vocab * h + h  # embedding, LM head, final norm
    assert model_params(model) == ends + 32 * (attention + norms + h * 8 + 8 * 3 * h * f)
    assert active_params(model) == ends + 32 * (attention + norms + h * 8 + 2 * 3 * h * f)
    assert active_params(model) - 2 * vocab * h == 12_617_781_248  # without embedding and head: 12.6B, not 12.9B


def test_mixtral_counts_match_the_modules_transformers_builds():
    """The parameters of Mixtral's modules as transformers' MixtralForCausalLM names them (q/k/v/o_proj, gate,
    experts' w1/w2/w3, two RMSNorms per layer, final norm, untied lm_head), built on the meta device and counted."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    model = load_hf_config("mixtral-8x7b")
    h, hkv, f, experts, vocab = model.hidden, model.num_kv_heads * model.head_dim, 14336, 8, model.vocab

    def layer() -> nn.Module:
        attn = nn.ModuleDict({"q_proj": nn.Linear(h, h, bias=False), "k_proj": nn.Linear(h, hkv, bias=False),
                              "v_proj": nn.Linear(h, hkv, bias=False), "o_proj": nn.Linear(h, h, bias=False)})
        expert = [nn.ModuleDict({"w1": nn.Linear(h, f, bias=False), "w2": nn.Linear(f, h, bias=False),
                                 "w3": nn.Linear(h, f, bias=False)}) for _ in range(experts)]
        moe = nn.ModuleDict({"gate": nn.Linear(h, experts, bias=False), "experts": nn.ModuleList(expert)})
        return nn.ModuleDict({"self_attn": attn, "block_sparse_moe": moe, "input_layernorm": nn.RMSNorm(h),
                              "post_attention_layernorm": nn.RMSNorm(h)})

    with torch.device("meta"):
        net = nn.ModuleDict({"embed_tokens": nn.Embedding(vocab, h), "layers": nn.ModuleList([layer()]),
                             "norm": nn.RMSNorm(h), "lm_head": nn.Linear(h, vocab, bias=False)})
    one_layer = sum(p.numel() for p in net["layers"].parameters())
    ends = sum(p.numel() for name, p in net.named_parameters() if not name.startswith("layers."))
    assert model_params(model) == ends + model.layers * one_layer


def test_tiny_mixtral_file_loads_and_every_key_is_read_or_ignored(tmp_path):
    path = write_config(tmp_path, TINY_MIXTRAL)
    model = load_hf_config(path)
    assert model.moe == MoeConfig(experts=4, top_k=2, expert_ffn=96, renormalize=True)
    report = hf_key_report(path)
    assert "num_local_experts" in report.read and "num_experts_per_tok" in report.read
    assert report.ignored == ("architectures",) and "sliding_window" in report.read  # null: MixtralAttention's none
    assert set(report.read) | set(report.ignored) == set(TINY_MIXTRAL)
    for name in ("mixtral-8x7b", "mixtral-8x22b"):
        bundled = hf_key_report(name)
        assert set(bundled.read) | set(bundled.ignored) == set(read_hf_config(resolve_model_config(name)))
        assert "router_aux_loss_coef" in bundled.read and "output_router_logits" in bundled.read
        assert load_hf_config(resolve_model_config(name)).moe.hf_router_loss == 0  # output_router_logits false


def test_a_files_own_router_loss_is_read_and_the_executor_refuses_it(tmp_path):
    """transformers adds router_aux_loss_coef x its load-balancing loss (over every layer at once, not Megatron-core's
    per layer) only under output_router_logits: read so, costing nothing; `pipesim run` refuses it in one line."""
    on = load_hf_config(write_config(tmp_path, {**TINY_MIXTRAL, "output_router_logits": True}))
    assert on.moe.hf_router_loss == 0.02 and unbuilt_structure(on) == [
        "Hugging Face's router loss over every layer at once (output_router_logits; --moe-aux-loss-coeff trains "
        "Megatron-core's per layer)"]
    absent = {k: v for k, v in TINY_MIXTRAL.items() if k != "router_aux_loss_coef"}
    assert load_hf_config(write_config(tmp_path, {**absent, "output_router_logits": True})).moe.hf_router_loss == \
        0.001  # MixtralConfig's default
    with pytest.raises(PipesimError, match="field 'output_router_logits' must be true or false, got 'yes'"):
        load_hf_config(write_config(tmp_path, {**TINY_MIXTRAL, "output_router_logits": "yes"}))


def test_mixtral_expert_defaults_are_transformers_mixtral_config_defaults(tmp_path):
    """A mixtral file without the expert keys is what MixtralConfig builds: 8 experts, 2 per token."""
    cfg = {k: v for k, v in TINY_MIXTRAL.items() if k not in ("num_local_experts", "num_experts_per_tok")}
    assert load_hf_config(write_config(tmp_path, cfg)).moe == MoeConfig(experts=8, top_k=2, expert_ffn=96,
                                                                        renormalize=True)


def test_a_zero_router_jitter_changes_nothing_and_a_nonzero_one_refuses(tmp_path):
    path = write_config(tmp_path, {**TINY_MIXTRAL, "router_jitter_noise": 0.0})
    assert load_hf_config(path) == load_hf_config(write_config(tmp_path, TINY_MIXTRAL))
    assert "router_jitter_noise" in hf_key_report(write_config(tmp_path, {**TINY_MIXTRAL, "router_jitter_noise": 0}))\
        .ignored
    path = write_config(tmp_path, {**TINY_MIXTRAL, "router_jitter_noise": 0.01})
    assert config_refusal(path) == (
        f"{path}: keys that change the model and pipesim does not model: router_jitter_noise (router jitter: a random "
        "scale on the experts' input in training); refused rather than simulated as a different model")


# -- exact counts for the layouts MoeConfig describes -------------------------------------------------------------

def _tiny(**moe) -> ModelConfig:
    return ModelConfig(kind="gpt", hidden=64, layers=6, heads=4, kv_heads=2, seq=32, vocab=100, ffn_hidden=160,
                       activation="swiglu", norm="rmsnorm", dropout=False, biases=False, positions="rope",
                       moe=MoeConfig(**{"experts": 4, "top_k": 2, "expert_ffn": 96, **moe}))


def test_dense_first_layers_every_nth_layer_and_shared_experts_are_counted_layer_by_layer():
    """DeepSeek-style dense first layers (the dense MLP's ffn_size), Qwen-style every-other-layer experts and
    shared experts: model_params follows the layers MoeConfig.is_moe_layer places, active_params the top_k."""
    model = _tiny(shared_experts=2, shared_ffn=48, dense_layers=1, every=2)
    h = 64
    moe_layers = [layer for layer in range(6) if model.moe.is_moe_layer(layer)]
    assert moe_layers == [1, 3, 5]
    dense_block = block_params(model)
    attn_norms = dense_block - 3 * h * 160  # the block less its SwiGLU MLP of ffn_size 160
    router, expert, shared = h * 4, 3 * h * 96, 3 * h * (2 * 48)
    assert (router_params(model), expert_params(model), shared_expert_params(model)) == (router, expert, shared)
    ends = embedding_params(model) + head_params(model, holds_embedding=True)
    assert model_params(model) == ends + 3 * dense_block + 3 * (attn_norms + router + 4 * expert + shared)
    assert active_params(model) == ends + 3 * dense_block + 3 * (attn_norms + router + 2 * expert + shared)


def test_gelu_experts_biases_and_tied_embeddings():
    """A GeLU expert is two matrices; with biases every linear has one (the router none, as Megatron's); tied
    embeddings count the matrix once in both totals."""
    model = replace(_tiny(), activation="gelu", biases=True, norm="layernorm", tied_embeddings=True)
    h = 64
    assert expert_params(model) == mlp_params(model, 96) == 2 * h * 96 + 96 + h
    assert router_params(model) == h * 4
    ends = embedding_params(model) + head_params(model, holds_embedding=True)
    assert head_params(model, holds_embedding=True) == 2 * h  # the final LayerNorm only
    per_layer = block_params(model) - mlp_params(model, 160) + h * 4
    assert model_params(model) == ends + 6 * (per_layer + 4 * expert_params(model))
    assert active_params(model) == ends + 6 * (per_layer + 2 * expert_params(model))


def test_a_dense_model_is_all_active_and_has_no_experts_to_count():
    dense = load_hf_config("llama3-8b")
    assert active_params(dense) == model_params(dense) == 8_030_261_248
    for count in (expert_params, router_params, shared_expert_params, moe_mlp_params):
        with pytest.raises(PipesimError, match=r"^expert parameters need a model with experts \(moe\)$"):
            count(dense)


def test_a_moe_model_round_trips_through_to_dict_and_json():
    for model in (load_hf_config("mixtral-8x22b"), _tiny(shared_experts=1, dense_layers=2, every=2,
                                                         capacity_factor=1.25)):
        data = model.to_dict()
        assert isinstance(data["moe"], dict)
        assert ModelConfig(**data) == model
        assert ModelConfig(**json.loads(json.dumps(data))) == model
    assert "moe" not in ModelConfig(kind="gpt").to_dict()


# -- MoeConfig's and ModelConfig's refusals ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    ({"experts": 0}, "moe experts must be a positive integer, got 0"),
    ({"top_k": True}, "moe top_k must be a positive integer, got True"),
    ({"expert_ffn": 1.5}, "moe expert_ffn must be a positive integer, got 1.5"),
    ({"every": 0}, "moe every must be a positive integer, got 0"),
    ({"shared_experts": -1}, "moe shared_experts must be a non-negative integer, got -1"),
    ({"dense_layers": "1"}, "moe dense_layers must be a non-negative integer, got '1'"),
    ({"shared_ffn": 0}, "moe shared_ffn must be a positive integer, got 0"),
    ({"top_k": 5}, "moe top_k 5 is more than its 4 experts"),
    ({"capacity_factor": True}, "moe capacity_factor must be a number in (0, E / k = 2] (an expert holds at most "
                                "every token), got True"),
    ({"capacity_factor": -1.0}, "moe capacity_factor must be a number in (0, E / k = 2] (an expert holds at most "
                                "every token), got -1.0"),
    # an expert gets each token at most once: above E / k the ratio is impossible (and inf or 1e300 overflowed)
    ({"capacity_factor": 2.5}, "moe capacity_factor must be a number in (0, E / k = 2] (an expert holds at most "
                               "every token), got 2.5"),
    ({"capacity_factor": float("inf")}, "moe capacity_factor must be a number in (0, E / k = 2] (an expert holds at "
                                        "most every token), got inf"),
    ({"imbalance": 0.5}, "moe imbalance (the most-loaded expert's tokens / the mean) must be in [1, E / k = 2] (an "
                         "expert receives at most every token), got 0.5"),
    ({"imbalance": float("nan")}, "moe imbalance (the most-loaded expert's tokens / the mean) must be in [1, E / k = "
                                  "2] (an expert receives at most every token), got nan"),
    ({"capacity_factor": 1.5, "imbalance": 1.1},
     "moe imbalance applies to dropless routing; with a capacity_factor the most-loaded expert takes capacity_factor "
     "x the mean"),
])
def test_moe_config_refuses_each_bad_field_in_one_line(kwargs, message):
    with pytest.raises(PipesimError) as err:
        MoeConfig(**{"experts": 4, "top_k": 2, "expert_ffn": 96, **kwargs})
    assert str(err.value) == message


@pytest.mark.parametrize("kwargs,message", [
    ({"moe": "8x2"}, "moe must be a MoeConfig, got str"),
    ({"kind": "mlp"}, "experts (moe) need a transformer (--model gpt or --model-config)"),
    ({"moe": MoeConfig(4, 2, 96, dense_layers=6)}, "moe: none of the 6 layers has experts (dense_layers 6, every 1)"),
    ({"moe": {"experts": 4, "top_k": 8, "expert_ffn": 96}}, "moe top_k 8 is more than its 4 experts"),  # from JSON
])
def test_model_config_refuses_experts_it_cannot_place(kwargs, message):
    with pytest.raises(PipesimError) as err:
        ModelConfig(**{**_tiny().to_dict(), **kwargs})
    assert str(err.value) == message


@pytest.mark.parametrize("change,message", [
    ({"num_experts_per_tok": 5}, "field 'num_experts_per_tok' 5 is more than num_local_experts 4"),
    ({"num_local_experts": 0}, "field 'num_local_experts' must be a positive integer, got 0"),
    ({"num_experts_per_tok": "2"}, "field 'num_experts_per_tok' must be a positive integer, got '2'"),
    ({"hidden_act": "gelu"}, "field 'hidden_act' 'gelu': Mixtral's experts are gated (w2(act(w1 x) * w3 x)), which "
                             "pipesim models with silu or swish only"),
    ({"attention_bias": True}, "field 'attention_bias' or 'mlp_bias' is true, but Mixtral's linears have no biases "
                               "(transformers builds them bias-free)"),
])
def test_a_bad_mixtral_field_is_one_line_naming_field_and_file(tmp_path, change, message):
    path = write_config(tmp_path, {**TINY_MIXTRAL, **change})
    assert config_refusal(path) == f"{path}: {message}"


# -- on but unmodelled: refused, never simulated as a different model ----------------------------------------------

def test_an_unmodelled_expert_key_in_a_mixtral_file_still_refuses(tmp_path):
    """Mixtral's code has no shared experts or dense first layers: a file that asks for them is not Mixtral."""
    path = write_config(tmp_path, {**TINY_MIXTRAL, "n_shared_experts": 1, "first_k_dense_replace": 1})
    assert config_refusal(path) == (
        f"{path}: keys that change the model and pipesim does not model: n_shared_experts, first_k_dense_replace "
        "(mixture of experts); refused rather than simulated as a different model")


def test_mixtral_expert_keys_in_a_llama_file_refuse(tmp_path):
    """Llama's code would drop them and build a dense model the file's author did not mean."""
    cfg = {**TINY_MIXTRAL, "model_type": "llama"}
    path = write_config(tmp_path, cfg)
    assert config_refusal(path) == (
        f"{path}: keys that change the model and pipesim does not model: num_experts_per_tok, num_local_experts, "
        "router_aux_loss_coef (mixture of experts); refused rather than simulated as a different model")


# Qwen1.5-MoE-A2.7B's config.json (Qwen/Qwen1.5-MoE-A2.7B on the Hugging Face hub)
QWEN2_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
             "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
             "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
             "max_window_layers": 21, "model_type": "qwen2_moe", "moe_intermediate_size": 1408,
             "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
             "num_hidden_layers": 24, "num_key_value_heads": 16, "output_router_logits": False, "rms_norm_eps": 1e-06,
             "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632,
             "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
             "transformers_version": "4.39.0.dev0", "use_cache": True, "use_sliding_window": False,
             "vocab_size": 151936}


def test_qwen1_5_moe_is_read_with_its_gated_shared_expert(tmp_path):
    """Qwen/Qwen1.5-MoE-A2.7B's config.json: Qwen3-MoE's experts beside one shared expert of 5632 behind a sigmoid gate
    (MoeConfig.shared_gate) and q/k/v biases (tests/test_qwen2_moe.py: its counts and costs)."""
    model = load_hf_config(write_config(tmp_path, QWEN2_MOE), seq=4096)
    assert model.moe == MoeConfig(experts=60, top_k=4, expert_ffn=1408, shared_experts=1, shared_ffn=5632,
                                  shared_gate=True)
    assert model.qkv_bias and not model.biases


# DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3 on the Hugging Face hub), less auto_map and quantization_config
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
               "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
               "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
               "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
               "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
               "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
               "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
               "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
               "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
               "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                                "original_max_position_embeddings": 4096, "type": "yarn"},
               "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
               "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
               "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280}


def test_deepseek_v3_loads_and_its_fp8_quantization_config_stays_refused(tmp_path):
    """Latent attention, DeepSeekMoE and multi-token prediction are modelled now (tests/test_deepseek_v3.py); the
    published file's quantization_config (FP8 weights with block scales) still refuses it, naming the key."""
    model = load_hf_config(write_config(tmp_path, DEEPSEEK_V3))
    assert model.mla is not None and model.mtp_layers == 1 and model.moe.experts == 256
    quantized = {**DEEPSEEK_V3, "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                                        "quant_method": "fp8", "weight_block_size": [128, 128]}}
    path = write_config(tmp_path, quantized)
    assert config_refusal(path) == (f"{path}: keys that change the model and pipesim does not model: "
                                    "quantization_config (quantized weights); refused rather than simulated as a "
                                    "different model")
