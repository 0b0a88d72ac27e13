"""Which keys of a Hugging Face config.json pipesim models, which change nothing it models, and the rest.

A config key either sizes or shapes what pipesim simulates (`MODELED`, read by `hf_config.model_from_hf`),
or changes nothing pipesim counts (`NO_EFFECT`: token ids, initialisation, rotary frequencies, caching:
listed as ignored in `--json`), or is off at the value it has (`OFF_WHEN_EMPTY`: no experts, no sliding
window, zero dropout; a sliding window as long as the sequence). Any other key, and any of those switched
on, would change the computation: the config is refused with one line naming the keys, never simulated
as a different (dense, full-attention) model. Mixtral's config.json, read as Llama, would be a dense 7B.

Some keys are read, or change nothing, only in the model type whose code reads them (`TYPE_MODELED`,
`TYPE_NO_EFFECT`): Mixtral's `num_local_experts` and `num_experts_per_tok` size its experts, so they are
read in a "mixtral" file and refuse a "llama" one (whose code would drop them: a dense model that the
file's author did not mean). A "deepseek_v3" file's experts, latent attention and multi-token prediction are read
(pipesim.model.hf_config); its router's keys that change nothing pipesim counts (the balance loss, group-limited
routing, the scores' scaling) are ignored and listed. A "qwen3" file (dense) and a "qwen3_moe" file are read with
their QK-norm and their head_dim (ModelConfig.head_width, qk_norm); qwen3_moe's experts (num_experts,
num_experts_per_tok, moe_intermediate_size, decoder_sparse_step, mlp_only_layers when MoeConfig can place them:
pipesim.model.hf_config) are read, and so is norm_topk_prob (the top-k weights renormalised: MoeConfig.renormalize,
which the executor's router honours, costing nothing pipesim counts). A Mixtral or Qwen3-MoE file's router loss
(router_aux_loss_coef, trained by Hugging Face's code only under output_router_logits, false in every bundled file)
is read as MoeConfig.hf_router_loss: one loss over every layer's routing at once, not Megatron-core's per-layer loss
that `--moe-aux-loss-coeff` gives the executor, so `pipesim run` refuses it and simulate counts nothing for it.
A "qwen2" file is read with its q/k/v biases (ModelConfig.qkv_bias); a "qwen2_moe" file with them (its `qkv_bias`,
true by default) and Qwen3-MoE's experts beside a shared expert behind a sigmoid gate (MoeConfig.shared_gate).
quantization_config stays refused
everywhere (DeepSeek-V3's says its checkpoint is FP8 with 128 x 128 block scales; pipesim trains in the dtype
given and models no FP8 GEMM).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.model.hf_rope import names_yarn

MODELED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
           "max_position_embeddings", "num_key_value_heads", "hidden_act", "rms_norm_eps", "layer_norm_eps",
           "attention_bias", "mlp_bias", "attention_dropout", "head_dim", "tie_word_embeddings", "torch_dtype",
           "dtype", "model_type")
# values that change no FLOP, byte or collective pipesim counts
NO_EFFECT = ("_name_or_path", "architectures", "transformers_version", "bos_token_id", "eos_token_id",
             "pad_token_id", "initializer_range", "rope_theta", "use_cache", "pretraining_tp",
             "tokenizer_class", "auto_map", "output_attentions", "output_hidden_states", "return_dict",
             "max_window_layers")
# rotary scaling (transformers 5's rope_parameters holds rope_theta and it): read when it names YaRN, whose attention
# factor costs time (pipesim.model.hf_rope); any other kind only changes the frequencies, no effect
ROTARY_SCALING = ("rope_scaling", "rope_parameters")
# off at a false, zero, null or empty value; on otherwise (then they change the computation)
OFF_WHEN_EMPTY = {
    "num_local_experts": "mixture of experts", "n_routed_experts": "mixture of experts",
    "num_experts": "mixture of experts", "num_experts_per_tok": "mixture of experts",
    "moe_intermediate_size": "mixture of experts", "n_shared_experts": "mixture of experts",
    "shared_expert_intermediate_size": "mixture of experts", "first_k_dense_replace": "mixture of experts",
    "decoder_sparse_step": "mixture of experts", "moe_layer_freq": "mixture of experts",
    "router_aux_loss_coef": "mixture of experts", "output_router_logits": "mixture of experts",
    "router_jitter_noise": "router jitter: a random scale on the experts' input in training",
    "norm_topk_prob": "mixture of experts",
    "topk_group": "mixture of experts", "n_group": "mixture of experts",
    "routed_scaling_factor": "mixture of experts", "mlp_only_layers": "mixture of experts",
    "interleave_moe_layer_step": "mixture of experts",
    "q_lora_rank": "multi-head latent attention", "kv_lora_rank": "multi-head latent attention",
    "qk_rope_head_dim": "multi-head latent attention", "qk_nope_head_dim": "multi-head latent attention",
    "v_head_dim": "multi-head latent attention",
    "num_nextn_predict_layers": "multi-token prediction",
    "sliding_window": "sliding-window attention", "use_sliding_window": "sliding-window attention",
    "quantization_config": "quantized weights",
    "hidden_dropout": "dropout", "resid_pdrop": "dropout", "embd_pdrop": "dropout",
    "residual_dropout": "dropout", "final_logit_softcapping": "logit soft-capping",
    "attn_logit_softcapping": "logit soft-capping",
    "use_bidirectional_attention": "bidirectional attention (EmbeddingGemma)",
}
# the keys a nemotron_h file's code reads that pipesim reads (TYPE_MODELED: pipesim.model.hf_nemotron_h)
NEMOTRON_H_KEYS = ("hybrid_override_pattern", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
                   "conv_kernel", "chunk_size", "expand", "mamba_hidden_act", "mlp_hidden_act", "use_bias",
                   "use_conv_bias", "mamba_proj_bias", "layer_norm_epsilon", "attention_head_dim", "residual_in_fp32",
                   "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                   "moe_shared_expert_intermediate_size", "n_shared_experts", "norm_topk_prob", "moe_latent_size",
                   "n_group", "topk_group")
# what changes nothing pipesim counts there: the initialisation and clamping of the time step (Megatron-core's mixer
# is called without a dt limit), the prenorm residual's init rescale, the inference kernels' switch and logits kept,
# the k weights' scaling (as DeepSeek-V3's router), an MTP pattern with no MTP layer
NEMOTRON_H_NO_EFFECT = ("time_step_min", "time_step_max", "time_step_floor", "time_step_limit",
                        "rescale_prenorm_residual", "use_mamba_kernels", "num_logits_to_keep", "routed_scaling_factor",
                        "mtp_hybrid_override_pattern", "mamba_dt_min", "mamba_dt_max", "mamba_dt_init_floor",
                        "mamba_dt_limit")
# read only in the model type whose code reads them (pipesim.model.hf_config turns them into a MoeConfig)
TYPE_MODELED = {"mixtral": ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits",
                            "sliding_window"),
                "deepseek_v3": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                                "first_k_dense_replace", "moe_layer_freq", "topk_method", "q_lora_rank", "kv_lora_rank",
                                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_nextn_predict_layers",
                                "n_group", "topk_group", "scoring_func"),
                "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                              "mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef", "output_router_logits"),
                # Qwen1.5-MoE / Qwen2-MoE: Qwen3-MoE's experts plus a gated shared expert, q/k/v biases
                "qwen2_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                              "mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef", "output_router_logits",
                              "shared_expert_intermediate_size", "qkv_bias"),
                # Nemotron-4 (transformers' NemotronConfig): its LayerNorm's epsilon names the norm's kind
                "nemotron": ("norm_eps",),
                # GPT-OSS: experts on every layer, windowed layers (pipesim.model.hf_gpt_oss)
                "gpt_oss": ("num_local_experts", "num_experts_per_tok", "experts_per_token", "sliding_window",
                            "layer_types", "router_aux_loss_coef", "output_router_logits", "swiglu_limit",
                            "swiglu_alpha"),
                # every layer windowed by sliding_window (MistralAttention, MixtralAttention)
                "mistral": ("sliding_window",),
                # GLM-4.5: DeepSeek-V3's experts and MTP modules, QK-norm (pipesim.model.hf_deepseek)
                "glm4_moe": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                             "first_k_dense_replace", "n_group", "topk_group", "num_nextn_predict_layers",
                             "use_qk_norm"),
                # Llama 4's language model: interleaved experts with a shared one, NoPE layers, the L2 QK-norm,
                # chunked attention (pipesim.model.hf_llama4)
                "llama4_text": ("num_local_experts", "num_experts_per_tok", "interleave_moe_layer_step", "moe_layers",
                                "intermediate_size_mlp", "use_qk_norm", "no_rope_layers", "no_rope_layer_interval",
                                "attention_chunk_size", "layer_types"),
                # Gemma 3's language model: GeGLU by hidden_activation, 5:1 local windows, the local layers' RoPE base
                # (pipesim.model.hf_gemma)
                "gemma3_text": ("hidden_activation", "sliding_window", "sliding_window_pattern", "layer_types",
                                "rope_local_base_freq", "query_pre_attn_scalar"),
                # Nemotron-H and Nemotron 3: a hybrid model's pattern, Mamba mixers and experts
                # (pipesim.model.hf_nemotron_h)
                "nemotron_h": NEMOTRON_H_KEYS,
                # Qwen3-Next: Qwen2-MoE's experts with a gated shared expert, Gated DeltaNet on all but every
                # full_attention_interval-th layer (pipesim.model.hf_qwen3_next)
                "qwen3_next": ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                               "mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef", "output_router_logits",
                               "shared_expert_intermediate_size", "layer_types", "full_attention_interval",
                               "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                               "linear_value_head_dim", "linear_conv_kernel_dim")}
# change nothing pipesim counts in that model type (Mixtral's and Qwen3-MoE's own router loss, router_aux_loss_coef
# under output_router_logits, is read: MoeConfig.hf_router_loss, which the executor refuses)
TYPE_NO_EFFECT = {# DeepSeek-V3's router: the sequence-wise balance loss (aux_loss_alpha, seq_aux) is a few FLOPs per
                  # token on scores the router made; the scaling of the k weights (routed_scaling_factor,
                  # norm_topk_prob) costs what the top-k costs; ep_size is its inference code's expert placement
                  # (training's is --ep)
                  "deepseek_v3": ("aux_loss_alpha", "seq_aux", "routed_scaling_factor", "norm_topk_prob", "ep_size"),
                  # rotary embeddings on part of each head: Megatron applies them to that part and concatenates the
                  # rest back, the same tensors read and written as a whole-head rotation (the executor builds it:
                  # pipesim.model.rotary)
                  "nemotron": ("partial_rotary_factor",),
                  # GPT-OSS: YaRN's original context
                  "gpt_oss": ("initial_context_length",),
                  # GLM-4.5: the rotary share (as Nemotron's), the k weights' scaling and renormalisation (as
                  # DeepSeek-V3's router)
                  "glm4_moe": ("partial_rotary_factor", "routed_scaling_factor", "norm_topk_prob"),
                  # Llama 4: the NoPE layers' attention-temperature tuning, which Megatron-core does not run
                  # (pipesim.model.hf_llama4); the router loss's coefficient, unused unless output_router_logits (off
                  # when empty: refused when true); its quantization tooling's and inference cache's switches
                  "llama4_text": ("attn_temperature_tuning", "floor_scale", "attn_scale", "router_aux_loss_coef",
                                  "for_llm_compressor", "cache_implementation"),
                  # Gemma 3: the inference cache; a hidden_act beside hidden_activation, which Gemma3MLP does not read
                  "gemma3_text": ("cache_implementation", "hidden_act"),
                  "nemotron_h": NEMOTRON_H_NO_EFFECT,
                  # Qwen3-Next: the rotary share (as Nemotron's)
                  "qwen3_next": ("partial_rotary_factor",)}
# decoders whose layers are nothing beyond MODELED and their TYPE_MODELED (Llama-style, DeepSeek-V3's, Qwen2's: Llama's
# layer with biases on q, k and v alone, and Qwen3's: Llama's layer with QK-norm and an explicit head_dim)
MODEL_TYPES = ("llama", "mistral", "mixtral", "deepseek_v3", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "nemotron",
               "gpt_oss", "glm4_moe", "llama4_text", "gemma3_text", "nemotron_h", "qwen3_next")
# model types whose files run another type's code, read as that type: Moonshot AI's Kimi K2 "reuses the
# DeepSeekV3CausalLM architecture" and names itself "kimi_k2" only so that inference engines can tell the two apart
# (MoonshotAI/Kimi-K2 docs/deploy_guidance.md, which suggests model_type "deepseek_v3" for a framework that does not
# know it; its config.json's architectures and auto_map name DeepseekV3ForCausalLM and configuration_deepseek).
# DeepSeek-V2's files (V2, V2-Lite, "deepseek_v2") hold the layer DeepSeek-V3 kept: "we adopt Multi-head Latent
# Attention (MLA) and DeepSeekMoE, which have been thoroughly validated by DeepSeek-V2" (arXiv:2412.19437, section
# 2.1); transformers' DeepseekV2Attention and DeepseekV2Moe (models/deepseek_v2/modular_deepseek_v2.py) are the same
# projections, routed and shared experts and first_k_dense_replace dense layers, and what V3 changed is read from the
# file's own keys (scoring_func, topk_method: V2's greedy and group_limited_greedy carry no routing bias; no
# num_nextn_predict_layers: no multi-token prediction)
TYPE_ALIASES = {"kimi_k2": "deepseek_v3", "deepseek_v2": "deepseek_v3"}
# files whose language model is a sub-config, read as it (Llama 4's "llama4", Gemma 3's "gemma3": their text_config,
# pipesim.model.hf_llama4 and hf_gemma)
WRAPPER_TYPES = ("llama4", "gemma3")


def positive_field(cfg: dict, name: str, where: str) -> int:
    """Field `name` of a config.json (present) as a positive integer; PipesimError naming the file otherwise."""
    value = cfg[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PipesimError(f"{where}: field {name!r} must be a positive integer, got {value!r}")
    return value


def required_field(cfg: dict, name: str, where: str) -> object:
    """Field `name` of a config.json, which must be there (null allowed); PipesimError naming the file otherwise."""
    if name not in cfg:
        raise PipesimError(f"{where}: field {name!r} is missing")
    return cfg[name]


def count_field(cfg: dict, name: str, where: str) -> int:
    """Field `name` (present) as a non-negative integer."""
    value = cfg[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PipesimError(f"{where}: field {name!r} must be a non-negative integer, got {value!r}")
    return value


# transformers' classes and their model types: a file that names its class (`architectures`) but no model_type is
# read as that class's type, not as a plain Llama (transformers itself reads model_type; files it writes carry both)
ARCHITECTURE_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
                      "DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV2ForCausalLM": "deepseek_v2",
                      "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe",
                      "NemotronForCausalLM": "nemotron", "GptOssForCausalLM": "gpt_oss",
                      "Glm4MoeForCausalLM": "glm4_moe", "Llama4ForCausalLM": "llama4_text",
                      "Llama4ForConditionalGeneration": "llama4", "Qwen2MoeForCausalLM": "qwen2_moe",
                      "Gemma3ForCausalLM": "gemma3_text", "Gemma3ForConditionalGeneration": "gemma3",
                      "NemotronHForCausalLM": "nemotron_h", "Qwen3NextForCausalLM": "qwen3_next"}


def code_type(cfg: dict) -> str | None:
    """The model type whose code a config.json runs: its model_type (else its one class's, `ARCHITECTURE_TYPES`;
    another class's name, refused), or the type an alias runs (TYPE_ALIASES). None: neither (Llama's layer)."""
    kind = cfg.get("model_type")
    classes = cfg.get("architectures")
    if kind is None and isinstance(classes, list) and len(classes) == 1 and isinstance(classes[0], str):
        kind = ARCHITECTURE_TYPES.get(classes[0], classes[0])
    return TYPE_ALIASES.get(kind, kind) if isinstance(kind, str) else kind


@dataclass(frozen=True)
class KeyReport:
    """A config's keys: those pipesim reads and those it ignores because they change nothing it models."""

    read: tuple[str, ...]
    ignored: tuple[str, ...]


def _empty(value: object) -> bool:
    return value is None or value is False or value == 0 or value == [] or value == {}


def check_keys(cfg: dict, *, where: str, seq: int) -> KeyReport:
    """The keys' report; PipesimError naming every key that would change the computation (`seq`: the training
    sequence length, which a sliding window at least as long leaves whole)."""
    changing: dict[str, str] = {}
    read, ignored = [], []
    window = cfg.get("sliding_window")
    window_whole = not cfg.get("use_sliding_window", True) or (isinstance(window, int) and window >= seq)
    kind = code_type(cfg)
    type_read = TYPE_MODELED.get(kind, ()) if isinstance(kind, str) else ()
    type_ignored = TYPE_NO_EFFECT.get(kind, ()) if isinstance(kind, str) else ()
    for key, value in cfg.items():
        if key in MODELED or key in type_read:
            read.append(key)
        elif key in ROTARY_SCALING:
            (read if names_yarn(value) else ignored).append(key)
        elif key == "layer_types":  # every layer full (Qwen3's newer files): nothing windowed
            if isinstance(value, list) and all(v == "full_attention" for v in value):
                ignored.append(key)
            else:
                changing[key] = "sliding-window attention"
        elif key in NO_EFFECT or key in type_ignored:
            ignored.append(key)
        elif key in OFF_WHEN_EMPTY:
            sliding = OFF_WHEN_EMPTY[key] == "sliding-window attention"
            if _empty(value) or (sliding and window_whole):
                ignored.append(key)
            else:
                changing[key] = OFF_WHEN_EMPTY[key]
        else:
            changing[key] = "unknown to pipesim"
    if kind is not None and kind not in MODEL_TYPES:
        changing["model_type"] = f"{kind!r}: pipesim models {', '.join((*MODEL_TYPES, *TYPE_ALIASES, *WRAPPER_TYPES))}"
    if changing:
        why: dict[str, list[str]] = {}
        for key, what in changing.items():
            why.setdefault(what, []).append(key)
        parts = "; ".join(f"{', '.join(keys)} ({what})" for what, keys in why.items())
        raise PipesimError(f"{where}: keys that change the model and pipesim does not model: {parts}; "
                           "refused rather than simulated as a different model")
    return KeyReport(tuple(read), tuple(ignored))


__all__ = ["MODELED", "MODEL_TYPES", "NO_EFFECT", "OFF_WHEN_EMPTY", "ROTARY_SCALING", "TYPE_ALIASES", "TYPE_MODELED",
           "WRAPPER_TYPES", "count_field", "required_field",
           "TYPE_NO_EFFECT", "KeyReport", "check_keys", "code_type", "positive_field"]
