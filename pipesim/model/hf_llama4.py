"""A Llama 4 config.json (meta-llama/Llama-4-Scout-17B-16E, Llama-4-Maverick-17B-128E): its language model.

The repositories' config.json is a "llama4" file (Llama4ForConditionalGeneration): a `text_config` (model_type
"llama4_text", Llama4ForCausalLM) beside a `vision_config`. pipesim reads the language model, what NVIDIA's
"LLAMA4-Scout-LLM" and "-Maverick-LLM" pretraining benchmarks train; the vision encoder, its projector and the image
tokens' ids are listed as ignored keys (`--json`), never costed. A "llama4_text" file is read the same way.

The text model (transformers' models/llama4/modeling_llama4.py and configuration_llama4.py, whose defaults fill what a
file leaves out): Llama's grouped-query attention with heads of `head_dim` (128 by default, not hidden / heads: the
file must give it, as it must num_key_value_heads, 8 by default), no biases (`attention_bias` true is refused: it
would put them on q, k, v and o alone), RMSNorm, SwiGLU, untied embeddings; on the layers `moe_layers` names
(default every `interleave_moe_layer_step`-th, from layer step - 1: MoeConfig.every) Llama4TextMoe:
`num_local_experts` routed SwiGLU experts of width `intermediate_size`, `num_experts_per_tok` (1) per token behind a
bias-free router (Llama4Router: the top-k logits through a sigmoid, applied to the expert's input; Megatron-core's
--moe-router-score-function sigmoid --moe-apply-probs-on-input: the same kernels' bytes as weights on the output),
plus one shared expert of width `intermediate_size` every token passes through; the other layers a dense SwiGLU MLP
of width `intermediate_size_mlp` (Llama4TextMLP). Attention (pipesim.model.llama4_attention): NoPE layers
(`no_rope_layers`, a 1 where a layer rotates, or every `no_rope_layer_interval`-th: ModelConfig.nope_every), the
weightless L2 QK-norm (`use_qk_norm`: ModelConfig.qk_l2_norm), chunked attention on the RoPE layers over
`attention_chunk_size` tokens (`layer_types` "chunked_attention"; ModelConfig.attention_chunk: a longer training
sequence is refused). The attention-temperature tuning of the NoPE layers (`attn_temperature_tuning`, `floor_scale`,
`attn_scale`: queries times log(floor((p + 1) / floor_scale) + 1) attn_scale + 1, 1 below floor_scale tokens) is not
in Megatron-core (core_v0.15.3 has no such option), whose training pipesim costs: read past, costing nothing.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.hf_keys import code_type, count_field, positive_field, required_field
from pipesim.model.hf_wrapper import TextWrapper, unwrap_text_config
from pipesim.model.llama4_attention import is_nope_layer, nope_period
from pipesim.model.moe import MoeConfig
from pipesim.model.moe_layer_freq import placement

# Llama4TextConfig's defaults (transformers), where a file is silent
LLAMA4_DEFAULTS = {"num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
                   "intermediate_size_mlp": 16384, "no_rope_layer_interval": 4, "use_qk_norm": True,
                   "attention_chunk_size": 8192}
CHUNKED, FULL = "chunked_attention", "full_attention"  # its layer_types values
# the wrapper (Llama4Config): its keys beside text_config, read or holding what pipesim does not cost
LLAMA4_WRAPPER = TextWrapper(
    "llama4", "llama4_text", "Llama 4",
    read=("model_type", "architectures", "text_config", "torch_dtype", "dtype", "tie_word_embeddings"),
    ignored=("vision_config", "boi_token_index", "eoi_token_index", "image_token_index", "transformers_version",
             "_name_or_path", "pad_token_id", "bos_token_id", "eos_token_id"),
    text_types=("llama4",))


def unwrap_llama4(cfg: dict, where: str) -> tuple[dict, tuple[str, ...], tuple[str, ...]]:
    """A "llama4" file's text_config as a "llama4_text" file (its dtype the wrapper's where it gives none), with the
    wrapper's keys read and ignored; any other file unchanged, with none (pipesim.model.hf_wrapper)."""
    if code_type(cfg) == "llama4" and cfg.get("tie_word_embeddings") and "tie_word_embeddings" not in \
            cfg.get("text_config", {}):
        raise PipesimError(f"{where}: field 'tie_word_embeddings' true on the wrapper, absent in text_config: "
                           "Llama4ForCausalLM reads text_config's (false by default); give it there")
    return unwrap_text_config(cfg, where, LLAMA4_WRAPPER)


def llama4_experts(cfg: dict, layers: int, where: str) -> MoeConfig | None:
    """Llama4TextMoe's layout (`cfg` with LLAMA4_DEFAULTS where the file is silent): None when no layer has
    experts; else MoeConfig with one shared expert of the routed ones' width, placed every
    `interleave_moe_layer_step`-th layer, or where `moe_layers` names when MoeConfig can place them (dense first
    layers, then every k-th: pipesim.model.moe_layer_freq.placement; refused otherwise)."""
    experts = count_field(cfg, "num_local_experts", where)
    top_k, step = (positive_field(cfg, name, where) for name in ("num_experts_per_tok", "interleave_moe_layer_step"))
    listed = cfg.get("moe_layers")
    where_moe = list(range(step - 1, layers, step)) if listed is None else listed
    if not isinstance(where_moe, list) or any(not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < layers
                                              for x in where_moe):
        raise PipesimError(f"{where}: field 'moe_layers' must list layer indices below {layers}, got {listed!r}")
    if not experts or not where_moe:
        return None
    if top_k > experts:
        raise PipesimError(f"{where}: field 'num_experts_per_tok' {top_k} is more than num_local_experts {experts}")
    listed_layers = set(where_moe)
    dense, every = placement([int(layer in listed_layers) for layer in range(layers)],
                             flag=f"{where}: field 'moe_layers'")
    return MoeConfig(experts=experts, top_k=top_k, expert_ffn=positive_field(cfg, "intermediate_size", where),
                     shared_experts=1, dense_layers=dense, every=every, score="sigmoid", input_probs=True)


def _nope_every(cfg: dict, layers: int, where: str) -> int:
    """ModelConfig.nope_every from `no_rope_layers` (1: RoPE, 0: NoPE, at least one per layer) or, when it is absent
    or empty (transformers then builds it), `no_rope_layer_interval`."""
    flags = cfg.get("no_rope_layers")
    if not flags:
        return positive_field(cfg, "no_rope_layer_interval", where)
    if not isinstance(flags, list) or len(flags) < layers or any(x not in (0, 1) or isinstance(x, bool)
                                                                 for x in flags):
        raise PipesimError(f"{where}: field 'no_rope_layers' must list 0 or 1 for each of the {layers} layers")
    every = nope_period([not flags[layer] for layer in range(layers)])
    if every is None:
        nope = [layer for layer in range(layers) if not flags[layer]]
        raise PipesimError(f"{where}: field 'no_rope_layers' leaves RoPE out of layers {nope}: pipesim models NoPE "
                           "on every k-th layer (layer l when (l + 1) % k == 0)")
    return every


def _chunk(cfg: dict, layers: int, nope_every: int, where: str) -> int | None:
    """The chunk of the RoPE layers' chunked attention (None: none): attention_chunk_size where `layer_types` (or,
    without it, transformers' rule: the RoPE layers) makes any layer chunked."""
    chunk = cfg["attention_chunk_size"]
    if chunk is not None:
        chunk = positive_field(cfg, "attention_chunk_size", where)
    kinds = cfg.get("layer_types")
    if kinds is None:
        kinds = [FULL if is_nope_layer(nope_every, layer) else CHUNKED for layer in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in (CHUNKED, FULL) for k in kinds):
        raise PipesimError(f"{where}: field 'layer_types' must list {CHUNKED!r} or {FULL!r} for each of the "
                           f"{layers} layers")
    if any((k == CHUNKED) == is_nope_layer(nope_every, layer) for layer, k in enumerate(kinds)):
        raise PipesimError(f"{where}: field 'layer_types' must chunk the RoPE layers and keep the NoPE layers full "
                           "(transformers' rule), which pipesim models")
    return chunk if CHUNKED in kinds else None


def llama4_fields(cfg: dict, layers: int, where: str) -> dict:
    """ModelConfig fields of a "llama4_text" file beyond Llama's: moe, ffn_hidden (the dense layers'), head_width,
    qk_l2_norm, nope_every and attention_chunk."""
    for name in ("head_dim", "num_key_value_heads"):  # Llama4TextConfig's defaults are not Llama's
        required_field(cfg, name, where)
    cfg = {**LLAMA4_DEFAULTS, **cfg}
    if cfg.get("attention_bias", False) is not False:
        raise PipesimError(f"{where}: field 'attention_bias' {cfg['attention_bias']!r}: Llama 4's biases would sit on "
                           "q, k, v and o alone, which pipesim's biases (every linear) cannot say")
    qk = cfg["use_qk_norm"]
    if not isinstance(qk, bool):
        raise PipesimError(f"{where}: field 'use_qk_norm' must be true or false, got {qk!r}")
    moe = llama4_experts(cfg, layers, where)
    dense_width = positive_field(cfg, "intermediate_size_mlp", where)  # checked where no layer is dense too
    ffn = dense_width if moe is None or moe.moe_layers(0, layers) < layers else positive_field(
        cfg, "intermediate_size", where)
    nope = _nope_every(cfg, layers, where)
    return {"moe": moe, "ffn_hidden": ffn, "head_width": positive_field(cfg, "head_dim", where), "qk_l2_norm": qk,
            "nope_every": nope, "attention_chunk": _chunk(cfg, layers, nope, where)}


__all__ = ["LLAMA4_DEFAULTS", "LLAMA4_WRAPPER", "llama4_experts", "llama4_fields", "unwrap_llama4"]
