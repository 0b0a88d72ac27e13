"""A config.json's rotary scaling: the one part of it that costs time, YaRN's attention factor.

Rotary scaling changes the rotation's frequencies, nothing pipesim counts, except that YaRN also scales cos and sin
by an attention factor (transformers' modeling_rope_utils._compute_yarn_parameters: `attention_factor` when given,
else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are given, else get_mscale(factor),
with get_mscale(s, m) = 0.1 m ln s + 1 for s > 1 and 1 otherwise). Megatron-core multiplies cos and sin by it
(`_yarn_get_concentration_factor`, the same rule) and its fused RoPE kernel cannot: apply_rotary_pos_emb warns
"mscale=... is not supported by TE's fused RoPE. Using unfused implementation." (megatron/core/models/common/
embeddings/rope_utils.py at NVIDIA/Megatron-LM b0cc2706dd). GPT-OSS (YaRN, factor 32, no mscale pair) gets
0.1 ln 32 + 1 = 1.3466; DeepSeek-V3 and Kimi K2 (mscale = mscale_all_dim = 1) get 1. The factor is
`ModelConfig.rope_mscale`; pipesim.model.layer_kernels times RoPE unfused where it is not 1.
"""

from __future__ import annotations

import math

from pipesim.errors import PipesimError

YARN = "yarn"


def _mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _number(params: dict, name: str, key: str, where: str) -> float | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise PipesimError(f"{where}: field {key!r}'s {name!r} must be a positive number, got {value!r}")
    return float(value)


def names_yarn(params: object) -> bool:
    """Whether a rope_scaling (rope_parameters) value is YaRN's (its `rope_type`, or the older `type`)."""
    return isinstance(params, dict) and params.get("rope_type", params.get("type")) == YARN


def yarn_attention_factor(cfg: dict, where: str) -> float:
    """YaRN's attention factor from `rope_scaling` (or transformers 5's `rope_parameters`): 1.0 for any other
    rotary scaling or none."""
    for key in ("rope_scaling", "rope_parameters"):
        params = cfg.get(key)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise PipesimError(f"{where}: field {key!r} must be an object, got {params!r}")
        if not names_yarn(params):
            continue
        given = _number(params, "attention_factor", key, where)
        if given is not None:
            return given
        factor = _number(params, "factor", key, where)
        if factor is None:
            raise PipesimError(f"{where}: field {key!r} names YaRN without its 'factor'")
        m, m_all = (_number(params, name, key, where) for name in ("mscale", "mscale_all_dim"))
        return _mscale(factor, m) / _mscale(factor, m_all) if m and m_all else _mscale(factor)
    return 1.0


__all__ = ["names_yarn", "yarn_attention_factor"]
