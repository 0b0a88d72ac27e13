"""The expert flags of the command line (Megatron-core's names) into a ModelConfig's MoeConfig: --model moe's own
experts, or over a mixture-of-experts --model-config's; the routing flags (load imbalance, capacity) for either."""

from __future__ import annotations

import argparse
from dataclasses import replace

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.moe import MoeConfig
from pipesim.model.moe_layer_freq import parse_pattern, placement

ROUTING_FLAGS = ("moe_load_imbalance", "moe_expert_capacity_factor", "moe_token_drop_policy",
                 "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_z_loss_coeff")
# MoeConfig's fields, flag by flag
ROUTING_FIELDS = ("imbalance", "capacity_factor", "drop_policy", "balance", "aux_loss_coeff", "z_loss_coeff")
MOE_DEFAULTS = {"experts": 4, "top_k": 2}  # --model moe's experts and experts per token when not given
MOE_FLAGS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
             "moe_layer_freq", "moe_shared_expert_gate")


def moe_config(args: argparse.Namespace, hidden: int, layers: int) -> MoeConfig:
    """--model moe's experts: an MoE MLP of GeLU experts (the GPT block's MLP), dropless, on every layer or those
    --moe-layer-freq gives; an expert as wide as the dense MLP unless --moe-ffn-hidden-size (Megatron's default:
    --ffn-hidden-size's)."""
    shared = getattr(args, "moe_shared_expert_intermediate_size", None)
    return MoeConfig(experts=args.num_experts or MOE_DEFAULTS["experts"],
                     top_k=args.moe_router_topk or MOE_DEFAULTS["top_k"],
                     expert_ffn=args.moe_ffn_hidden_size or getattr(args, "ffn_hidden", None) or 4 * hidden,
                     shared_experts=1 if shared else 0, shared_ffn=shared,
                     shared_gate=bool(getattr(args, "moe_shared_expert_gate", None)), **_placement(args, layers))


def _placement(args: argparse.Namespace, layers: int) -> dict[str, int]:
    """--moe-layer-freq as MoeConfig's dense_layers and every ({} when not given)."""
    text = getattr(args, "moe_layer_freq", None)
    if text is None:
        return {}
    dense, every = placement(parse_pattern(text, layers))
    return {"dense_layers": dense, "every": every}


def with_expert_flags(model: ModelConfig, args: argparse.Namespace, source: str) -> ModelConfig:
    """--num-experts, --moe-router-topk, --moe-ffn-hidden-size, --moe-shared-expert-intermediate-size (Megatron's
    total shared width), --moe-shared-expert-gate, --moe-layer-freq over a mixture-of-experts --model-config's own;
    refused on a dense one."""
    given = {name: getattr(args, name) for name in MOE_FLAGS if getattr(args, name, None) is not None}
    if not given:
        return model
    if model.moe is None:
        flag = "--" + next(iter(given)).replace("_", "-")
        raise PipesimError(f"{flag}: --model-config {source} is a dense model (give a mixture-of-experts config, "
                           "or --model moe)")
    fields = {"experts": given.get("num_experts"), "top_k": given.get("moe_router_topk"),
              "expert_ffn": given.get("moe_ffn_hidden_size")}
    if "moe_shared_expert_intermediate_size" in given:
        fields |= {"shared_experts": 1, "shared_ffn": given["moe_shared_expert_intermediate_size"]}
    if given.get("moe_shared_expert_gate"):  # Qwen2-MoE's gate on the shared expert
        fields["shared_gate"] = True
    fields |= _placement(args, model.layers)
    # typed group-limited routing joins them (pipesim.commands.latent_args sets it again, the same values): the
    # experts' count and their groups are checked together, not the new count against the file's groups
    fields |= {"groups": getattr(args, "moe_router_num_groups", None),
               "group_topk": getattr(args, "moe_router_group_topk", None)}
    try:
        return replace(model, moe=replace(model.moe, **{k: v for k, v in fields.items() if v is not None}))
    except PipesimError as e:
        typed = ", ".join("--" + name.replace("_", "-") for name in given)
        raise PipesimError(f"{typed} over --model-config {source}'s experts: {e}") from None


def with_routing(model: ModelConfig, args: argparse.Namespace) -> ModelConfig:
    """--moe-load-imbalance / --moe-expert-capacity-factor / --moe-token-drop-policy /
    --moe-router-load-balancing-type / --moe-aux-loss-coeff / --moe-z-loss-coeff into the model's MoeConfig (refused
    on a dense model)."""
    given = {flag: value for flag in ROUTING_FLAGS if (value := getattr(args, flag, None)) is not None}
    if not given:
        return model
    if model.moe is None:
        flag = "--" + next(iter(given)).replace("_", "-")
        raise PipesimError(f"{flag} needs a mixture-of-experts model (--model-config mixtral-8x7b, ...)")
    fields = dict(zip(ROUTING_FLAGS, ROUTING_FIELDS, strict=True))
    return replace(model, moe=replace(model.moe, **{fields[flag]: value for flag, value in given.items()}))


__all__ = ["MOE_DEFAULTS", "MOE_FLAGS", "ROUTING_FLAGS", "moe_config", "with_expert_flags", "with_routing"]
