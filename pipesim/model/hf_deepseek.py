"""DeepSeekMoE and latent attention in a Hugging Face config.json: a "deepseek_v3" file's (and the types read as one:
pipesim.model.hf_keys.TYPE_ALIASES) and a "glm4_moe" file's experts and multi-token prediction (Zhipu's GLM-4.5).

DeepSeek (transformers' models/deepseek_v3): latent attention's widths (`deepseek_attention`) and DeepseekV3MoE's
layout (`deepseek_experts`): n_routed_experts experts of width moe_intermediate_size, num_experts_per_tok per token,
n_shared_experts shared ones of that width (one MLP of n_shared x moe_intermediate_size, as DeepSeek builds them),
the first first_k_dense_replace layers dense, the router's scores its scoring_func's (MoeConfig.score: V3's sigmoid,
V2's softmax), and with topk_method "noaux_tc" the router's per-expert e_score_correction_bias.

GLM-4.5 (transformers' models/glm4_moe/modeling_glm4_moe.py, Glm4MoeAttention, Glm4MoeMoE, Glm4MoeDecoderLayer):
Llama's grouped-query attention with heads of `head_dim`, biases on q, k and v alone (`attention_bias`; o_proj is
bias-free), an optional RMSNorm over head_dim on queries and keys (`use_qk_norm`), RoPE on `partial_rotary_factor` of
each head, and DeepSeek-V3's MoE: layers from first_k_dense_replace on hold Glm4MoeMoE, n_routed_experts experts of
moe_intermediate_size behind a sigmoid router whose e_score_correction_bias is always there (Glm4MoeTopkRouter
registers it), group-limited by n_group / topk_group, and n_shared_experts x moe_intermediate_size shared;
num_nextn_predict_layers multi-token-prediction modules (DeepSeek-V3's, which transformers leaves unbuilt and
Megatron trains).
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.hf_keys import count_field, positive_field, required_field
from pipesim.model.latent_attention import LatentAttention
from pipesim.model.moe import MoeConfig

DEEPSEEK_ROUTING = {"noaux_tc": True, "greedy": False, "group_limited_greedy": False}  # topk_method -> a score bias
DEEPSEEK_SCORES = ("sigmoid", "softmax")  # scoring_func values DeepSeek's MoEGate computes


def deepseek_attention(cfg: dict, where: str) -> LatentAttention:
    """DeepseekV3Attention's widths: q_lora_rank (null: q_proj h -> heads x (nope + rope)), kv_lora_rank,
    qk_nope_head_dim, qk_rope_head_dim, v_head_dim (all required)."""
    names = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    for name in ("q_lora_rank", *names):
        required_field(cfg, name, where)
    q = None if cfg["q_lora_rank"] is None else positive_field(cfg, "q_lora_rank", where)
    kv, nope, rope, v = (positive_field(cfg, name, where) for name in names)
    try:
        return LatentAttention(q_lora_rank=q, kv_lora_rank=kv, qk_nope_dim=nope, qk_rope_dim=rope, v_head_dim=v)
    except PipesimError as e:
        raise PipesimError(f"{where}: {e}") from None


def deepseek_experts(cfg: dict, where: str, *, routing_bias: bool | None = None) -> MoeConfig | None:
    """DeepseekV3MoE's layout (None when n_routed_experts is null: every MLP dense), every layer after the dense ones
    with experts (moe_layer_freq 1). `routing_bias`: the router's score bias when the code always has one (GLM-4.5);
    None reads it from topk_method (DeepSeek's: "noaux_tc" has one) and checks scoring_func."""
    if required_field(cfg, "n_routed_experts", where) is None:
        return None
    for name in ("num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace"):
        required_field(cfg, name, where)
    experts, top_k, width = (positive_field(cfg, name, where)
                             for name in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"))
    shared = 0 if cfg["n_shared_experts"] is None else count_field(cfg, "n_shared_experts", where)
    dense = count_field(cfg, "first_k_dense_replace", where)
    freq = cfg.get("moe_layer_freq", 1)
    if type(freq) is not int or freq != 1:
        raise PipesimError(f"{where}: field 'moe_layer_freq' {freq!r}: DeepSeek places experts on layers l with "
                           "l % freq == 0, pipesim's every on (l + 1) % every == 0; pipesim reads 1 only")
    scores = "sigmoid"  # GLM-4.5's router (Glm4MoeTopkRouter), and DeepSeek-V3's scoring_func
    if routing_bias is None:
        method = required_field(cfg, "topk_method", where)
        if not isinstance(method, str) or method not in DEEPSEEK_ROUTING:
            raise PipesimError(f"{where}: field 'topk_method' {method!r} is not DeepSeek's; choose one of "
                               f"{', '.join(DEEPSEEK_ROUTING)}")
        scores = cfg.get("scoring_func", "softmax")
        if not isinstance(scores, str) or scores not in DEEPSEEK_SCORES:
            raise PipesimError(f"{where}: field 'scoring_func' {scores!r} is not DeepSeek's; choose "
                               f"{' or '.join(DEEPSEEK_SCORES)}")
        routing_bias = DEEPSEEK_ROUTING[method]
    if top_k > experts:
        raise PipesimError(f"{where}: field 'num_experts_per_tok' {top_k} is more than n_routed_experts {experts}")
    groups, group_topk = _groups(cfg, experts, top_k, where)
    return MoeConfig(experts=experts, top_k=top_k, expert_ffn=width, shared_experts=shared, dense_layers=dense,
                     expert_bias=routing_bias, groups=groups, group_topk=group_topk, score=scores)


def _groups(cfg: dict, experts: int, top_k: int, where: str) -> tuple[int, int | None]:
    """Group-limited routing (DeepSeek's node limit): topk_group of n_group groups (null n_group: one group, and
    topk_group is then unread); (1, None) without it."""
    groups = 1 if cfg.get("n_group") is None else positive_field(cfg, "n_group", where)
    topk = None if cfg.get("topk_group") is None else positive_field(cfg, "topk_group", where)
    if experts % groups:
        raise PipesimError(f"{where}: field 'n_group' {groups} does not divide n_routed_experts {experts}")
    if topk is not None and topk > groups:
        raise PipesimError(f"{where}: field 'topk_group' {topk} is more than n_group {groups}")
    if groups == 1:
        return 1, None
    if topk is None:
        raise PipesimError(f"{where}: field 'n_group' {groups} needs topk_group (the groups a token's experts come "
                           "from)")
    if top_k > topk * (experts // groups):
        raise PipesimError(f"{where}: field 'num_experts_per_tok' {top_k} is more than topk_group {topk} groups of "
                           f"{experts // groups} experts hold")
    return groups, topk


def mtp_modules(cfg: dict, where: str) -> int:
    """num_nextn_predict_layers (absent or null: none)."""
    return count_field(cfg, "num_nextn_predict_layers", where) if cfg.get("num_nextn_predict_layers") is not None \
        else 0


def glm4_moe_fields(cfg: dict, *, biases: bool, where: str) -> dict:
    """A "glm4_moe" file's ModelConfig fields beyond Llama's: its experts (DeepSeek-V3's layout, the score bias always
    there), MTP modules, q/k/v biases (`attention_bias`), QK-norm (`use_qk_norm`) and `head_dim` (hidden / heads when
    absent, as Glm4MoeAttention takes it). `biases` (attention_bias or mlp_bias) true with mlp_bias is refused: the
    MLPs are built bias-free."""
    if cfg.get("mlp_bias"):  # a bool: model_from_hf checked it
        raise PipesimError(f"{where}: field 'mlp_bias' is true, but GLM-4.5's MLPs and experts are built bias-free "
                           "(Glm4MoeMLP), which pipesim's biases (every linear) cannot say")
    qk_norm = cfg.get("use_qk_norm", False)
    if not isinstance(qk_norm, bool):
        raise PipesimError(f"{where}: field 'use_qk_norm' must be true or false, got {qk_norm!r}")
    head = positive_field(cfg, "head_dim", where) if cfg.get("head_dim") is not None else None
    return {"moe": deepseek_experts(cfg, where, routing_bias=True), "mtp_layers": mtp_modules(cfg, where),
            "qkv_bias": biases, "qk_norm": qk_norm, "head_width": head}


__all__ = ["DEEPSEEK_ROUTING", "DEEPSEEK_SCORES", "deepseek_attention", "deepseek_experts", "glm4_moe_fields",
           "mtp_modules"]
