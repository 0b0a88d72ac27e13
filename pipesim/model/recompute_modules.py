"""Megatron-core's selective recomputation by module: `--recompute selective --recompute-modules M [M ...]`.

Megatron-core (core_v0.13 on) checkpoints the submodules named in `recompute_modules` when
`recompute_granularity` is "selective" (megatron/core/transformer/transformer_config.py; default ["core_attn"],
what pipesim's plain `--recompute selective` has always meant). What each one drops, as core_v0.15.0 does it with
its default Transformer-Engine layer spec (megatron/core/models/gpt/gpt_layer_specs.py):

- core_attn: the attention core's scores / softmax (flash: its logsumexp); tensor_parallel.checkpoint (or TE's) of
  the core, re-run before its backward (transformer/attention.py).
- layernorm: the outputs of `input_layernorm` and `pre_mlp_layernorm`, by output-discarding checkpointing
  (CheckpointWithoutOutput in transformer/transformer_layer.py), each re-run when its consumer's output gradient
  arrives. The TE spec fuses a norm into the linear after it (TELayerNormColumnParallelLinear) and sets the norm
  module to IdentityOp, which Megatron skips: only latent attention's input norm (its down projections are plain
  linears) and a MoE layer's pre-MLP norm (the router is no fused linear) are separate modules. A dense layer with
  standard attention has nothing this module recomputes.
- moe_act: the routed experts' activation output (the FC2 input) by output-discarding checkpointing, re-run before
  FC2's backward (transformer/moe/experts.py, TEGroupedMLP; grouped GEMM only, as pipesim's experts are).
- mla_up_proj: latent attention's Q / KV up projections, their latents' norms and RoPE (the normed latents, Q, K and
  V are dropped; the latents and the rotary key are the checkpoint's inputs) by output-discarding checkpointing,
  re-run before the attention core's backward (transformer/multi_latent_attention.py).
- mlp: a dense layer's whole MLP (tensor_parallel.checkpoint; TE's fused pre-MLP norm and the tp collectives
  inside it); transformer_layer.py skips MoE layers.
- moe: a MoE layer's whole MoELayer.forward (router, permute, dispatch and combine all-to-alls, experts, shared
  experts; transformer/moe/moe_layer.py): its input (the pre-MLP norm output) is all it keeps, and its backward first
  re-runs the forward, all-to-alls included.
- shared_experts: the shared experts' MLP (tensor_parallel.checkpoint in moe_layer.py's shared_experts_compute).

A checkpoint inside another ("moe" with "moe_act" or "shared_experts") runs once more when the outer one re-runs
the forward with gradients on: Megatron's nesting, kept as it is.
"""

from __future__ import annotations

from collections.abc import Iterable

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig

# Megatron-core's choices, in its order (transformer_config.py's docstring and arguments.py's --recompute-modules)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DEFAULT_MODULES = ("core_attn",)  # Megatron's default, and pipesim's plain --recompute selective


def canonical_modules(recompute: str, modules: Iterable[str]) -> tuple[str, ...]:
    """The modules as a Job and LayerOptions keep them: validated, in Megatron's order without repeats, and () for
    the default (core_attn alone), so that `--recompute selective` and `--recompute-modules core_attn` are one job.
    PipesimError (one line) for an unknown name, or modules without --recompute selective."""
    if isinstance(modules, str) or not all(isinstance(m, str) for m in modules):
        raise PipesimError(f"recompute modules must be a list of names, got {modules!r}")
    given = tuple(modules)
    if not given:
        return ()
    unknown = [m for m in given if m not in RECOMPUTE_MODULES]
    if unknown:
        raise PipesimError(f"unknown --recompute-modules {unknown[0]!r}; choose {', '.join(RECOMPUTE_MODULES)}")
    if recompute != "selective":
        raise PipesimError(f"--recompute-modules needs --recompute selective (Megatron's --recompute-granularity "
                           f"selective), got --recompute {recompute}")
    ordered = tuple(m for m in RECOMPUTE_MODULES if m in given)
    return () if ordered == DEFAULT_MODULES else ordered


def effective_modules(recompute: str, modules: tuple[str, ...]) -> tuple[str, ...]:
    """The modules recomputed: the given ones, core_attn when selective names none, none unless selective."""
    if recompute != "selective":
        return ()
    return modules or DEFAULT_MODULES


def check_modules(model: ModelConfig, modules: tuple[str, ...]) -> None:
    """PipesimError (one line) for a module with nothing to recompute in `model`, where Megatron asserts it
    (mla_up_proj without latent attention) or would silently recompute nothing (the rest)."""
    moe = model.moe
    layers = model.layers + model.mtp_layers
    for name in modules:
        if name in ("moe_act", "moe") and moe is None:
            raise PipesimError(f"--recompute-modules {name} needs a mixture-of-experts model")
        if name == "shared_experts" and (moe is None or not moe.shared_experts):
            raise PipesimError("--recompute-modules shared_experts needs a mixture-of-experts model with shared "
                               "experts")
        if name == "mla_up_proj" and model.mla is None:
            raise PipesimError("--recompute-modules mla_up_proj needs multi-head latent attention (Megatron-core: "
                               "only supported with multi_latent_attention)")
        if name == "mlp" and moe is not None and moe.moe_layers(0, layers) == layers:
            raise PipesimError("--recompute-modules mlp recomputes dense MLPs, and every layer of this model has "
                               "experts (use moe or moe_act)")
        if name in ("mlp", "core_attn") and model.hybrid is not None:  # a hybrid's layers: its pattern's symbols
            symbol, what = ("-", "MLP") if name == "mlp" else ("*", "attention")
            if not model.hybrid.count(symbol):
                raise PipesimError(f"--recompute-modules {name}: the hybrid model has no {what} layer "
                                   f"({symbol!r} in its pattern)")
        if name == "layernorm" and model.mla is None and moe is None:
            raise PipesimError("--recompute-modules layernorm: Megatron-core's Transformer-Engine layer fuses both "
                               "norms of a dense layer into the linears after them, so nothing is recomputed")


def norms_recomputed(model: ModelConfig, *, moe: bool) -> tuple[str, ...]:
    """Which of a layer's norms "layernorm" recomputes ("attention", "MLP"): latent attention's input norm, and a
    MoE layer's pre-MLP norm (the others are fused into a TE linear)."""
    out = ("attention",) if model.mla is not None else ()
    return out + ("MLP",) if moe else out


__all__ = ["DEFAULT_MODULES", "RECOMPUTE_MODULES", "canonical_modules", "check_modules",
           "effective_modules", "norms_recomputed"]
