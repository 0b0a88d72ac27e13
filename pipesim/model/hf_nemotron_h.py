"""A Nemotron-H config.json (model_type "nemotron_h": Nemotron-H 4B/8B/47B/56B, Nemotron Nano 2, Nemotron 3 Nano): a
hybrid model (pipesim.model.hybrid), read as Megatron-Bridge converts it for Megatron-core.

Megatron-Bridge's NemotronHBridge (src/megatron/bridge/models/nemotronh/nemotron_h_bridge.py at 067f987df) maps
`hybrid_override_pattern` to hybrid_layer_pattern (one layer per symbol: M Mamba-2, * attention, - MLP, E experts),
`mamba_num_heads`, `mamba_head_dim`, `ssm_state_size`, `n_groups` and `chunk_size` to the mixer's sizes, `use_bias`
to add_bias_linear and `layer_norm_epsilon` to the RMSNorms' epsilon; it sets position_embedding_type "none", the
squared-ReLU MLP (its `mlp_hidden_act` relu2) and kv_channels from `head_dim` or `attention_head_dim`, and routes
experts with sigmoid scores and a per-expert bias (moe_router_score_function "sigmoid",
moe_router_enable_expert_bias: MoeConfig.score, expert_bias). The experts: `n_routed_experts` of
`moe_intermediate_size`, `num_experts_per_tok` per token, one shared expert of `moe_shared_expert_intermediate_size`
(Nemotron 3 Nano's recipe, src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_nano.py). The mixer's conv kernel
(`conv_kernel`, default 4) and chunk (default 128, Megatron-core's MambaMixer default) are read; `expand` is what
mamba_num_heads x mamba_head_dim over hidden_size already says. Refused in one line: biases (`use_bias`,
`mamba_proj_bias`), a conv without its bias (Megatron asserts conv_bias), a mixer activation other than SiLU, an MLP
other than squared ReLU, a float32 residual stream (`residual_in_fp32`), latent experts (`moe_latent_size`: Nemotron 3
Super's), more than one shared expert, and multi-token prediction (`num_nextn_predict_layers`, off when 0).
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.hf_keys import positive_field, required_field
from pipesim.model.hybrid import HybridLayers
from pipesim.model.mamba_mixer import MambaMixer
from pipesim.model.moe import MoeConfig

MIXER_DEFAULTS = {"conv_kernel": 4, "chunk_size": 128, "mamba_hidden_act": "silu", "use_conv_bias": True,
                  "mlp_hidden_act": "relu2"}


def nemotron_h_fields(cfg: dict, *, layers: int, hidden: int, where: str) -> dict:
    """ModelConfig's fields of a "nemotron_h" file: `hybrid`, `moe`, `head_width`, the squared-ReLU activation, no
    position embeddings, no biases; PipesimError naming the key for what pipesim does not model."""
    cfg = {**MIXER_DEFAULTS, **cfg}
    for key, want in (("mamba_hidden_act", "silu"), ("mlp_hidden_act", "relu2"), ("use_conv_bias", True)):
        if cfg[key] != want:
            raise PipesimError(f"{where}: field {key!r} {cfg[key]!r}: pipesim models Megatron-core's Mamba layers "
                               f"with {want!r} only")
    for key, what in (("use_bias", "biases on the linears"), ("mamba_proj_bias", "biases on in_proj and out_proj"),
                      ("residual_in_fp32", "a float32 residual stream"),
                      ("moe_latent_size", "latent experts (Nemotron 3 Super's LatentMoE)")):
        if cfg.get(key):
            raise PipesimError(f"{where}: field {key!r} {cfg[key]!r}: {what} in a hybrid model is not modelled")
    pattern = required_field(cfg, "hybrid_override_pattern", where)
    if not isinstance(pattern, str):
        raise PipesimError(f"{where}: field 'hybrid_override_pattern' must be a string, got {pattern!r}")
    for key in ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups"):
        required_field(cfg, key, where)
    mixer = MambaMixer(heads=positive_field(cfg, "mamba_num_heads", where),
                       head_dim=positive_field(cfg, "mamba_head_dim", where),
                       state=positive_field(cfg, "ssm_state_size", where),
                       groups=positive_field(cfg, "n_groups", where),
                       conv_kernel=positive_field(cfg, "conv_kernel", where),
                       chunk=positive_field(cfg, "chunk_size", where))
    expand = cfg.get("expand")
    if expand is not None and expand * hidden != mixer.d_inner:
        raise PipesimError(f"{where}: field 'expand' {expand!r} x hidden_size {hidden} is not mamba_num_heads x "
                           f"mamba_head_dim ({mixer.d_inner}), the mixer's width")
    head = cfg.get("head_dim") or cfg.get("attention_head_dim")
    if head is not None and (not isinstance(head, int) or isinstance(head, bool) or head < 1):
        raise PipesimError(f"{where}: field 'head_dim' must be a positive integer, got {head!r}")
    hybrid = HybridLayers(pattern, mixer)
    return {"hybrid": hybrid, "moe": _experts(cfg, hybrid.moe_layers(), where), "head_width": head,
            "activation": "relu2", "positions": "none", "norm_eps": cfg.get("layer_norm_epsilon", 1e-5)}


def _experts(cfg: dict, placement: tuple[int, ...], where: str) -> MoeConfig | None:
    """The E layers' experts (None without any): routed and one shared squared-ReLU MLP, sigmoid scores with a
    per-expert bias (Megatron-Bridge's NemotronHBridge provider), placed on the pattern's E layers."""
    if not placement:
        return None
    experts = positive_field(cfg, "n_routed_experts", where)
    shared = cfg.get("n_shared_experts", 1)
    width = cfg.get("moe_shared_expert_intermediate_size")
    if shared not in (0, 1) or (width is None) != (shared == 0):
        raise PipesimError(f"{where}: fields 'n_shared_experts' {shared!r} and 'moe_shared_expert_intermediate_size' "
                           f"{width!r}: pipesim reads one shared expert of that width, or none")
    groups = cfg.get("n_group") or 1
    return MoeConfig(experts=experts, top_k=positive_field(cfg, "num_experts_per_tok", where),
                     expert_ffn=positive_field(cfg, "moe_intermediate_size", where), shared_experts=shared,
                     shared_ffn=width, placement=placement, score="sigmoid", expert_bias=True,
                     renormalize=bool(cfg.get("norm_topk_prob", False)), groups=groups,
                     group_topk=cfg.get("topk_group") if groups > 1 else None)


__all__ = ["MIXER_DEFAULTS", "nemotron_h_fields"]
