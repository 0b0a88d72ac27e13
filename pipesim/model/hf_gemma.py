"""A Gemma 3 config.json (google/gemma-3-1b-pt, -4b, -12b, -27b): its language model.

A "gemma3_text" file (Gemma3ForCausalLM: the 1B, EmbeddingGemma's decoder files) is read as transformers' models/gemma3
builds it (modeling_gemma3.py, configuration_gemma3.py, whose Gemma3TextConfig defaults fill what a file leaves out:
GEMMA3_DEFAULTS), and so is a "gemma3" file's `text_config` (Gemma3ForConditionalGeneration: the 4B, 12B and 27B
repositories, whose text_config gives only what differs from those defaults); the SigLIP vision tower, its
projector and the image tokens' ids are listed as ignored keys (`--json`), never costed. The layer
(pipesim.model.gemma_layer): grouped-query attention with heads of `head_dim` (not hidden / heads), an RMSNorm over
head_dim on every query and key head (q_norm, k_norm: ModelConfig.qk_norm), the pre- and post-norms around each
block (ModelConfig.post_norms), a GeGLU MLP (`hidden_activation` gelu_pytorch_tanh: activation "geglu"), embeddings
times sqrt(hidden) (ModelConfig.embedding_scale), a head tied to the embedding (`tie_word_embeddings`, true by
default), no biases. Windows: layer l attends over the latest `sliding_window` keys unless (l + 1) %
`sliding_window_pattern` == 0 (5 local to 1 global at the default 6; `layer_types` when the file lists them:
pipesim.model.hf_gpt_oss.read_window), where it attends fully. RoPE: the full layers' `rope_theta` with the file's
`rope_scaling` (linear x 8 from 4B up), the windowed layers' own `rope_local_base_freq` unscaled (Rotary.window_theta);
transformers 5 writes both into `rope_parameters` per layer type, which is read the same way. The scores' scale,
`query_pre_attn_scalar` ** -0.5 (ModelConfig.softmax_scale), costs nothing (inside the attention kernel) and the
executor builds it; `cache_implementation` (inference) changes nothing. Gemma 2's
logit soft-capping (`attn_logit_softcapping`, `final_logit_softcapping`) is null in Gemma 3 and refused when set, as is
EmbeddingGemma's bidirectional attention (`use_bidirectional_attention`); "gemma2" and "gemma" files stay refused.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.hf_keys import code_type, required_field
from pipesim.model.hf_wrapper import TextWrapper, unwrap_text_config

# Gemma3TextConfig's defaults (transformers), where a file is silent
GEMMA3_DEFAULTS = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                   "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
                   "tie_word_embeddings": True, "rope_theta": 1_000_000.0, "attention_bias": False,
                   "attention_dropout": 0.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                   "rope_local_base_freq": 10_000.0, "sliding_window_pattern": 6}
# the tanh-approximated GeLUs (transformers' ACT2FN: gelu_pytorch_tanh, and NewGELU / FastGELU, the same function)
GEGLU_ACTS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
WINDOWED, FULL = "sliding_attention", "full_attention"  # transformers 5's rope_parameters keys (its layer types)
# the wrapper (Gemma3Config): its keys beside text_config, read or holding what pipesim does not cost; an absent
# text_config is Gemma3TextConfig's defaults, and the head's tie is the wrapper's where text_config is silent
GEMMA3_WRAPPER = TextWrapper(
    "gemma3", "gemma3_text", "Gemma 3",
    read=("model_type", "architectures", "text_config", "torch_dtype", "dtype", "tie_word_embeddings"),
    ignored=("vision_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index", "image_token_index",
             "initializer_range", "transformers_version", "_name_or_path", "pad_token_id", "bos_token_id",
             "eos_token_id"),
    text_required=False, inherits=("tie_word_embeddings",))


def unwrap_gemma3(cfg: dict, where: str) -> tuple[dict, tuple[str, ...], tuple[str, ...]]:
    """A "gemma3" file's text_config as a "gemma3_text" file (the wrapper's dtype and tie_word_embeddings where it
    gives none), with the wrapper's keys read and ignored; any other file unchanged, with none
    (pipesim.model.hf_wrapper)."""
    return unwrap_text_config(cfg, where, GEMMA3_WRAPPER)


def with_gemma3_defaults(cfg: dict) -> dict:
    """A "gemma3_text" file with Gemma3TextConfig's defaults where it is silent; any other file unchanged."""
    return {**GEMMA3_DEFAULTS, **cfg} if code_type(cfg) == "gemma3_text" else cfg


def gemma3_fields(cfg: dict, *, biases: bool, where: str) -> dict:
    """ModelConfig's Gemma 3 fields of a "gemma3_text" file (GEMMA3_DEFAULTS filled in): the GeGLU activation, QK-norm,
    post-norms, the embedding scale and the explicit head width. Refuses biases (Gemma3Attention's attention_bias puts
    them on q, k, v and o alone, which ModelConfig.biases cannot say) and an activation that is not a tanh GeLU."""
    act = cfg["hidden_activation"]
    if act not in GEGLU_ACTS:
        raise PipesimError(f"{where}: field 'hidden_activation' {act!r}: Gemma 3's MLP is a gated GeLU, which pipesim "
                           f"models with the tanh approximation ({', '.join(GEGLU_ACTS)}) only")
    if biases:
        raise PipesimError(f"{where}: field 'attention_bias' or 'mlp_bias' is true, but Gemma 3's biases would sit on "
                           "q, k, v and o only (its MLP is built bias-free), which pipesim's biases (every linear) "
                           "cannot say")
    head = required_field(cfg, "head_dim", where)
    if not isinstance(head, int) or isinstance(head, bool) or head < 1:
        raise PipesimError(f"{where}: field 'head_dim' must be a positive integer, got {head!r}")
    scalar = cfg["query_pre_attn_scalar"]  # the scores' scale, scalar ** -0.5 (transformers' Gemma3Attention.scaling)
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or not 0 < scalar < float("inf"):
        raise PipesimError(f"{where}: field 'query_pre_attn_scalar' must be a positive number, got {scalar!r}")
    return {"activation": "geglu", "qk_norm": True, "post_norms": True, "embedding_scale": True, "head_width": head,
            "softmax_scale": None if scalar == head else float(scalar) ** -0.5}


def gemma3_rope(cfg: dict, where: str) -> tuple[dict, float]:
    """(the keys pipesim.model.rotary.rotary_from_config reads for the full-attention layers, the windowed layers'
    base): transformers 5's per-type `rope_parameters` ({"full_attention": ..., "sliding_attention": ...}) or the
    older `rope_theta`, `rope_scaling` and `rope_local_base_freq`. The windowed layers' RoPE must be unscaled."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and (FULL in params or WINDOWED in params):
        full, local = params.get(FULL, {}), params.get(WINDOWED, {})
        if not isinstance(full, dict) or not isinstance(local, dict):
            raise PipesimError(f"{where}: field 'rope_parameters' must hold an object per layer type")
        if local.get("rope_type", "default") != "default":
            raise PipesimError(f"{where}: field 'rope_parameters' scales the sliding layers' RoPE "
                               f"({local.get('rope_type')!r}); pipesim builds Gemma 3's unscaled local RoPE only")
        theta = local.get("rope_theta", GEMMA3_DEFAULTS["rope_local_base_freq"])
        rest = {key: value for key, value in cfg.items() if key != "rope_parameters"}
        return {**rest, "rope_theta": full.get("rope_theta", GEMMA3_DEFAULTS["rope_theta"]),
                "rope_scaling": full}, _base(theta, "rope_parameters", where)
    return cfg, _base(cfg["rope_local_base_freq"], "rope_local_base_freq", where)


def _base(value: object, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise PipesimError(f"{where}: field {name!r}: the sliding layers' RoPE base must be a positive number, got "
                           f"{value!r}")
    return float(value)


__all__ = ["GEMMA3_DEFAULTS", "GEMMA3_WRAPPER", "GEGLU_ACTS", "gemma3_fields", "gemma3_rope", "unwrap_gemma3",
           "with_gemma3_defaults"]
