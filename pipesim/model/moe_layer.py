"""One mixture-of-experts MLP on one rank: its tokens, kernels, saved tensors, parameters and exchanges.

Megatron-core's MoE layer with the all-to-all token dispatcher: the router (a linear h -> E, softmax
and top-k), a permute of each token's k copies, the dispatch all-to-all over the expert-parallel
group, the local experts' grouped GEMMs (FC1, the activation, FC2), the combine all-to-all back, an
unpermute that sums the k outputs weighted by the router's probabilities, and the shared experts,
which every token passes through as a dense MLP. What the attention block does is the dense layer's
(pipesim.model.layer_kernels); this module replaces its MLP.

Token accounting per microbatch: the rank holds T = b s / cp tokens (T / tp under sequence
parallelism, which Megatron requires with tp and ep together). By conservation its E / ep local
experts compute on `routed_tokens` = T k etp / tp token-expert pairs on average (with sp; without it,
every tp rank holds all T tokens and the experts split as the MLP does: T k), times the load factor on
the slowest rank (MoeConfig.load_factor): every rank waits for it at the combine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.moe import MoeConfig
from pipesim.model.options import LayerOptions

ROUTER_BYTES = 4  # router logits and probabilities in float32 (Megatron's --moe-router-dtype fp32 default off:
# the router runs in the model's dtype, its softmax in float32)


def _moe(model: ModelConfig) -> MoeConfig:
    if model.moe is None:
        raise PipesimError("a mixture-of-experts layer needs a model with experts (moe)")
    return model.moe


def tokens_here(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """Tokens of the microbatch entering this rank's MoE block (its router, its dispatch): b s / cp, split over tp
    under sp."""
    return opts.seq_sharded(b * opts.local_seq(model))


def routed_tokens(model: ModelConfig, b: int, opts: LayerOptions, *, slowest: bool = True) -> int:
    """Token-expert pairs this rank's local experts compute per microbatch (rounded up); `slowest`: on the most
    loaded rank (x the load factor), else the mean."""
    moe = _moe(model)
    tokens = b * opts.local_seq(model)
    pairs = tokens * moe.top_k * opts.etp / opts.tp if opts.sp or opts.tp == 1 else tokens * moe.top_k
    if slowest:
        pairs *= moe.load_factor()
    return math.ceil(pairs)


@dataclass(frozen=True)
class ExpertShapes:
    """The grouped GEMMs' shapes on one rank: local experts, tokens per local expert, widths per etp rank."""

    local_experts: int  # E / ep
    tokens_per_expert: int  # routed tokens / local experts, rounded up
    fc1_out: int  # FC1's outputs per etp rank (SwiGLU: gate and up, 2 f / etp)
    ffn: int  # FC2's inputs per etp rank (f / etp)


def expert_shapes(model: ModelConfig, b: int, opts: LayerOptions) -> ExpertShapes:
    moe = _moe(model)
    local = moe.experts // opts.ep
    per_expert = -(-routed_tokens(model, b, opts) // local)
    ffn = moe.expert_ffn // opts.etp
    return ExpertShapes(local, per_expert, 2 * ffn if model.gated else ffn, ffn)


def moe_block_params(model: ModelConfig, opts: LayerOptions) -> int:
    """Parameters of one MoE MLP on one rank: the router (h x E, whole on every rank; and its E biases with
    `router_bias`), its E / ep local experts split etp ways, the shared experts split tp ways as the dense MLP (and
    their gate, `shared_gate`, whole), and the MLP's norm is the layer's (counted with the attention block)."""
    moe = _moe(model)
    h = model.hidden
    matrices = 3 if model.gated else 2
    shared_width = moe.shared_experts * moe.shared_width
    shared = matrices * h * shared_width // opts.tp
    if model.biases and shared_width:
        shared += (matrices - 1) * shared_width // opts.tp + h
    if moe.shared_gate and shared_width:  # Qwen2-MoE's gate on their output: h weights, whole on every rank
        shared += h
    router = h * moe.experts + (moe.experts if moe.router_bias else 0)
    return router + expert_params_here(model, opts) + shared


def expert_params_here(model: ModelConfig, opts: LayerOptions) -> int:
    """Of `moe_block_params`, the routed experts' parameters on this rank (E / ep experts, etp-split): the part
    ZeRO shards and the gradient reduction averages over the expert-data-parallel group instead of dp."""
    moe = _moe(model)
    matrices = 3 if model.gated else 2
    expert = matrices * model.hidden * moe.expert_ffn // opts.etp
    if model.biases:
        expert += (matrices - 1) * moe.expert_ffn // opts.etp + model.hidden
    return moe.experts // opts.ep * expert


def dense_mlp_params(model: ModelConfig, tp: int) -> int:
    """The dense MLP's matrices (and biases) on one tp rank: what an MoE layer replaces (its norm stays)."""
    h, f = model.hidden, model.ffn_size
    matrices = 3 if model.gated else 2
    return matrices * h * f // tp + ((matrices - 1) * f // tp + h if model.biases else 0)


__all__ = ["ExpertShapes", "dense_mlp_params", "expert_params_here", "expert_shapes", "moe_block_params",
           "routed_tokens", "tokens_here"]
