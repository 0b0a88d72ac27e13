"""A Qwen3-Next config.json (model_type "qwen3_next": Qwen3-Next-80B-A3B): linear attention (Gated DeltaNet) on
three layers in four, gated softmax attention on the fourth, Qwen2-MoE's experts with a gated shared expert.

Read as Megatron-Bridge's Qwen3NextBridge converts it (src/megatron/bridge/models/qwen/qwen3_next_bridge.py at
067f987df): experimental_attention_variant "gated_delta_net" with linear_attention_freq from the file's
`full_attention_interval` (or its `layer_types`: "linear_attention" / "full_attention" per layer, which must be every
k-th layer full), the mixer's `linear_num_key_heads`, `linear_num_value_heads`, `linear_key_head_dim`,
`linear_value_head_dim` and `linear_conv_kernel_dim` (pipesim.model.gdn_mixer), attention_output_gate
(ModelConfig.attention_gate: q_proj of twice the width, pipesim.model.output_gate), QK-norm, heads of `head_dim`, the
shared expert's sigmoid gate (moe_shared_expert_gate). Its zero-centred RMSNorm ((1 + w) x) moves the bytes of an
RMSNorm; `partial_rotary_factor` rotates part of each head, the same RoPE kernel's bytes (ignored, listed).
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.gdn_mixer import GatedDeltaNet
from pipesim.model.hf_keys import positive_field, required_field
from pipesim.model.linear_attention import LinearAttention

LINEAR, FULL = "linear_attention", "full_attention"  # transformers' layer types
MIXER_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
              "linear_conv_kernel_dim")


def qwen3_next_fields(cfg: dict, *, layers: int, where: str) -> dict:
    """ModelConfig's Qwen3-Next fields: `linear_attention` and `attention_gate` (QK-norm and the head width are
    Qwen3's, read beside them)."""
    for key in MIXER_KEYS:
        required_field(cfg, key, where)
    mixer = GatedDeltaNet(key_heads=positive_field(cfg, "linear_num_key_heads", where),
                          value_heads=positive_field(cfg, "linear_num_value_heads", where),
                          key_dim=positive_field(cfg, "linear_key_head_dim", where),
                          value_dim=positive_field(cfg, "linear_value_head_dim", where),
                          conv_kernel=positive_field(cfg, "linear_conv_kernel_dim", where))
    return {"linear_attention": LinearAttention(mixer, _full_every(cfg, layers, where)), "attention_gate": True}


def _full_every(cfg: dict, layers: int, where: str) -> int:
    """k of 'every k-th layer attends fully': `full_attention_interval`, or what `layer_types` says (which must be that
    pattern; both given must agree)."""
    interval = cfg.get("full_attention_interval")
    if interval is not None:
        interval = positive_field(cfg, "full_attention_interval", where)
    kinds = cfg.get("layer_types")
    if kinds is None:
        if interval is None:
            raise PipesimError(f"{where}: field 'full_attention_interval' or 'layer_types' is missing")
        return interval
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in (LINEAR, FULL) for k in kinds):
        raise PipesimError(f"{where}: field 'layer_types' must list {LINEAR!r} or {FULL!r} for each of the {layers} "
                           "layers")
    full = [n for n, kind in enumerate(kinds) if kind == FULL]
    every = full[0] + 1 if full else 0
    if every < 2 or full != list(range(every - 1, layers, every)) or interval not in (None, every):
        raise PipesimError(f"{where}: field 'layer_types' puts full attention on layers {full}: pipesim models every "
                           "k-th layer full (Megatron-core's linear_attention_freq), "
                           f"full_attention_interval {interval!r}")
    return every


__all__ = ["MIXER_KEYS", "qwen3_next_fields"]
