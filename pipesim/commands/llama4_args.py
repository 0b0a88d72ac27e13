"""Megatron-LM's flags for Llama 4's pieces (megatron/training/arguments.py @ core_v0.15.3): --qk-l2-norm (the
weightless L2 QK-norm: ModelConfig.qk_l2_norm), --no-rope-freq (NoPE layers: ModelConfig.nope_every), and its router's
--moe-router-score-function and --moe-apply-probs-on-input (MoeConfig.score, input_probs); each over a --model-config
file's own, as the size flags are (pipesim.commands.common.model_config). A Megatron-LM launch of Llama 4 then reads
as its config.json does (`--from-megatron`).

--no-rope-freq takes Megatron's spellings: an integer N (RoPE skipped on every N-th layer, layer l when
(l + 1) % N == 0: transformer_config.py's [0] * (N - 1) + [1] repeated) or a list expression of 0/1 per layer, 1 where
RoPE is skipped (no_rope_freq_type's "([0]*3+[1]*1)*12"), which must be such a period (pipesim.model.moe_layer_freq
reads the expression).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.llama4_attention import nope_period
from pipesim.model.moe import SCORE_FUNCTIONS
from pipesim.model.moe_layer_freq import parse_pattern

# argparse destinations, in the order a command types them
LLAMA4_FLAGS = ("qk_l2_norm", "no_rope_freq", "moe_router_score_function", "moe_apply_probs_on_input")
NO_ROPE_FLAG = "--no-rope-freq"


def add_llama4_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Llama 4's pieces (Megatron-core's flag names), over a --model-config's own")
    g.add_argument("--qk-l2-norm", action="store_const", const=True, default=None,
                   help="a weightless L2 norm over head_dim on every query and key head (Llama 4's QK-norm)")
    g.add_argument(NO_ROPE_FLAG, default=None, metavar="N|LIST",
                   help="no rotary embedding on every N-th layer (layer l when (l + 1) %% N == 0: Llama 4's 4), or "
                        "Megatron's list such as '([0]*3+[1])*12' (1: no RoPE) when it is such a period")
    g.add_argument("--moe-router-score-function", choices=SCORE_FUNCTIONS, default=None,
                   help="mixture of experts: the router's scores, a softmax over the experts or each logit's "
                        "sigmoid (DeepSeek-V3's, Llama 4's); default softmax")
    g.add_argument("--moe-apply-probs-on-input", action="store_const", const=True, default=None,
                   help="mixture of experts, top-1: the router's weight multiplies the expert's input, not its "
                        "output (Llama 4's)")


def no_rope_freq_period(text: str, layers: int) -> int:
    """ModelConfig.nope_every from Megatron's --no-rope-freq: an integer N >= 2, or a list of 0/1 per layer (1: no
    RoPE) that is such a period (all 0s: none); PipesimError otherwise."""
    pattern = parse_pattern(text, layers, flag=NO_ROPE_FLAG, integer=lambda n: [int((i + 1) % n == 0)
                                                                                for i in range(layers)])
    every = nope_period([bool(v) for v in pattern])
    if every is None:
        ones = [layer for layer, v in enumerate(pattern) if v]
        raise PipesimError(f"{NO_ROPE_FLAG} {text[:60]}: RoPE skipped on layers {ones[:8]}; pipesim models NoPE on "
                           "every N-th layer (layer l when (l + 1) % N == 0, N >= 2)")
    return every


def with_llama4_flags(model: ModelConfig, args: argparse.Namespace) -> ModelConfig:
    """--qk-l2-norm and --no-rope-freq over `model`; the router's two flags over its experts (refused without)."""
    changes: dict = {}
    if getattr(args, "qk_l2_norm", None):  # Megatron builds L2Norm in place of a --qk-layernorm's norms
        changes.update(qk_l2_norm=True, qk_norm=False)
    if (text := getattr(args, "no_rope_freq", None)) is not None:
        changes["nope_every"] = no_rope_freq_period(text, model.layers)
    routing = {k: v for k in ("moe_router_score_function", "moe_apply_probs_on_input")
               if (v := getattr(args, k, None)) is not None}
    if routing:
        if model.moe is None:
            raise PipesimError(f"--{next(iter(routing)).replace('_', '-')} needs a mixture-of-experts model (--model "
                               "moe or a mixture-of-experts --model-config)")
        fields = {"score": routing.get("moe_router_score_function"),
                  "input_probs": routing.get("moe_apply_probs_on_input")}
        changes["moe"] = replace(model.moe, **{k: v for k, v in fields.items() if v is not None})
    return replace(model, **changes) if changes else model


__all__ = ["LLAMA4_FLAGS", "NO_ROPE_FLAG", "add_llama4_args", "no_rope_freq_period", "with_llama4_flags"]
