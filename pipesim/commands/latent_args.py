"""Megatron-LM's flags for DeepSeek-V3's pieces (megatron/training/arguments.py @ core_v0.15.3): multi-head latent
attention (--multi-latent-attention with --q-lora-rank, --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim,
--v-head-dim), multi-token prediction (--mtp-num-layers) and DeepSeek's routing (--moe-router-enable-expert-bias,
--moe-router-num-groups, --moe-router-group-topk), into ModelConfig.mla, mtp_layers and the MoeConfig; each over a
--model-config file's own, as the size flags are. A Megatron-LM launch of DeepSeek-V3 then reads as its config.json
does (`--from-megatron`).

With --multi-latent-attention Megatron's --qk-layernorm is the latents' norms (gpt_layer_specs.py: the query and
key/value up projections become layer_norm_linear), which pipesim's latent attention always has (DeepSeek's q_a and
kv_a norms): so it is required there, and means nothing else.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from pipesim.commands.arg_types import bounded_int, positive_int
from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.latent_attention import LatentAttention

# argparse destination -> LatentAttention field, in Megatron's flag order
LATENT_WIDTHS = {"q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank", "qk_head_dim": "qk_nope_dim",
                 "qk_pos_emb_head_dim": "qk_rope_dim", "v_head_dim": "v_head_dim"}
# Megatron's defaults for them (core_v0.15.3 arguments.py: q-lora-rank None, kv-lora-rank 32, qk-head-dim 128,
# qk-pos-emb-head-dim 64, v-head-dim 128): a latent attention typed with --multi-latent-attention alone
MEGATRON_LATENT = LatentAttention(q_lora_rank=None, kv_lora_rank=32, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128)
ROUTER_FLAGS = ("moe_router_enable_expert_bias", "moe_router_num_groups", "moe_router_group_topk")
# every flag here (argparse destinations), in the order a command types them
LATENT_FLAGS = ("multi_latent_attention", *LATENT_WIDTHS, "mtp_num_layers", *ROUTER_FLAGS)


def add_latent_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("DeepSeek-V3's pieces (Megatron-core's flag names), over a --model-config's own")
    g.add_argument("--multi-latent-attention", action="store_const", const=True, default=None,
                   help="multi-head latent attention (DeepSeek's MLA; with --qk-layernorm, its latents' norms, "
                        "--position-embedding-type rope and --disable-bias-linear, as Megatron builds it)")
    g.add_argument("--q-lora-rank", type=positive_int, default=None, metavar="D",
                   help="latent attention: the queries' latent width (default none: a plain query projection)")
    for dest, what in (("kv_lora_rank", "the keys' and values' shared latent width"),
                       ("qk_head_dim", "a query or key head's part without positions"),
                       ("qk_pos_emb_head_dim", "a query or key head's rotary part"),
                       ("v_head_dim", "a value head's width")):
        default = getattr(MEGATRON_LATENT, LATENT_WIDTHS[dest])
        g.add_argument(f"--{dest.replace('_', '-')}", type=positive_int, default=None, metavar="D",
                       help=f"latent attention: {what} (default {default}, Megatron's)")
    g.add_argument("--mtp-num-layers", type=lambda t: bounded_int(t, 0), default=None, metavar="N",
                   help="multi-token-prediction modules after the last layer, on the last stage (DeepSeek-V3's 1; "
                        "default none)")
    g.add_argument("--moe-router-enable-expert-bias", action="store_const", const=True, default=None,
                   help="mixture of experts: a per-expert routing-score bias (DeepSeek-V3's aux-loss-free balance)")
    g.add_argument("--moe-router-num-groups", type=positive_int, default=None, metavar="G",
                   help="mixture of experts: group-limited routing over G equal groups of experts (with "
                        "--moe-router-group-topk)")
    g.add_argument("--moe-router-group-topk", type=positive_int, default=None, metavar="K",
                   help="mixture of experts: each token's experts among K of the --moe-router-num-groups groups")


def latent_norms(args: argparse.Namespace, given: dict, file_latent: bool) -> dict:
    """`given` (the typed structure fields) without --qk-layernorm where the model has latent attention (typed, or
    the file's): there it is the latents' norms, which pipesim's latent attention has anyway. Typed
    --multi-latent-attention without it is refused (Megatron then builds the latents without norms)."""
    typed = getattr(args, "multi_latent_attention", None)
    if typed and not given.get("qk_norm"):
        raise PipesimError("--multi-latent-attention without --qk-layernorm: Megatron then builds the latents without "
                           "their norms, which pipesim does not model (DeepSeek's have them)")
    if typed or file_latent:
        return {k: v for k, v in given.items() if k != "qk_norm"}
    return given


def with_latent_flags(model: ModelConfig, args: argparse.Namespace, source: str | None = None) -> ModelConfig:
    """The latent widths, the MTP modules and the routing flags over `model` (a --model-config file's, or the
    flags'); the widths need latent attention (typed or the file's), the routing flags experts."""
    widths = {LATENT_WIDTHS[k]: v for k in LATENT_WIDTHS if (v := getattr(args, k, None)) is not None}
    typed = getattr(args, "multi_latent_attention", None)
    if widths and not typed and model.mla is None:
        flag = "--" + next(k for k in LATENT_WIDTHS if getattr(args, k, None) is not None).replace("_", "-")
        raise PipesimError(f"{flag} sizes latent attention: give --multi-latent-attention"
                           + (f" (--model-config {source} has none)" if source else ""))
    changes: dict = {}
    if typed or widths:
        changes["mla"] = replace(model.mla or MEGATRON_LATENT, **widths)
    if (mtp := getattr(args, "mtp_num_layers", None)) is not None:
        changes["mtp_layers"] = mtp
    model = replace(model, **changes) if changes else model
    routing = {k: v for k in ROUTER_FLAGS if (v := getattr(args, k, None)) is not None}
    if not routing:
        return model
    if model.moe is None:
        raise PipesimError(f"--{next(iter(routing)).replace('_', '-')} needs a mixture-of-experts model (--model moe "
                           "or a mixture-of-experts --model-config)")
    groups, topk = routing.get("moe_router_num_groups"), routing.get("moe_router_group_topk")
    if groups is not None and groups > 1 and topk is None and model.moe.group_topk is None:
        raise PipesimError(f"--moe-router-num-groups {groups} needs --moe-router-group-topk")
    if topk is not None and groups is None and model.moe.groups == 1:
        raise PipesimError(f"--moe-router-group-topk {topk} needs --moe-router-num-groups")
    fields = {"expert_bias": routing.get("moe_router_enable_expert_bias"),
              "groups": routing.get("moe_router_num_groups"), "group_topk": routing.get("moe_router_group_topk")}
    return replace(model, moe=replace(model.moe, **{k: v for k, v in fields.items() if v is not None}))


__all__ = ["LATENT_FLAGS", "MEGATRON_LATENT", "add_latent_args", "latent_norms", "with_latent_flags"]
