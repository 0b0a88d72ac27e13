"""Megatron-core's --moe-shared-expert-overlap: the shared experts on a side stream beside the alltoall dispatcher's
exchanges (core_v0.15.3 megatron/core/transformer/moe/shared_experts.py and token_dispatcher.py,
MoEAlltoAllTokenDispatcher).

Forward: `pre_forward_comm` and `linear_fc1_forward_and_act` are issued on the shared experts' stream from the
dispatcher's dispatch_preprocess and token_dispatch, so FC1 and its activation run beside the dispatch all-to-all;
`linear_fc2_forward` from combine_postprocess, beside the combine's. Backward: their gradient functions are given the
largest sequence number (`set_tensor_grad_fn_sequence_sr`), so autograd runs the shared experts' backward first, on
their stream, beside the combine's backward exchange and, what outlasts it, the dispatch's. Per MoE layer, the seconds
each exchange has beside it (`ExpertExchange.beside`), the kernels timed as the stage's are (pipesim.cost.kernel_costs,
the layer's FP8 part's precision); what the side stream takes from the all-to-all's SMs is not charged (the shared
experts are small beside the routed ones), nor is their tensor-parallel all-gather and reduce-scatter moved beside.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from pipesim.comm.expert_exchange import ExpertExchange
from pipesim.cost.kernel_costs import fp8_layer, kernel_seconds, layer_profiles
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware, KernelFigures
from pipesim.model.config import ModelConfig
from pipesim.model.options import LayerOptions

SHARED = "shared "  # the shared experts' kernels' names (pipesim.model.layer_kernels)


@lru_cache(maxsize=1024)
def shared_seconds(model: ModelConfig, b: int, opts: LayerOptions, fused: bool, family: str,
                   kernels: KernelFigures | None = None) -> tuple[float, float, float, float]:
    """One MoE layer's shared-expert seconds (FC1 and its activation forward, FC2 forward, the input-gradient kernels,
    the weight-gradient GEMMs): the layer's own, not a recomputation's."""
    pk = fp8_layer(model, b, replace(opts, recompute="none", recompute_modules=()), fused, family, moe=True)
    profile, fp8 = layer_profiles(family, kernels, opts)

    def seconds(ks) -> float:
        return sum(kernel_seconds(k, model.dtype, profile, fp8=fp8) for k in ks if k.name.startswith(SHARED))

    forward = [k for k in pk.F if k.name.startswith(SHARED)]
    fc2 = next((i for i, k in enumerate(forward) if k.name.startswith(f"{SHARED}FC2")), len(forward))
    return seconds(forward[:fc2]), seconds(forward[fc2:]), seconds(pk.I), seconds(pk.W)


def check_shared_overlap(model: ModelConfig, hw: Hardware, opts: LayerOptions | None) -> None:
    """Shared experts to overlap (Megatron: 'Only effective when moe-shared-expert-intermediate-size is set'), not
    recomputed on their own (transformer_config.py raises), their kernels timed on a GPU device family."""
    if model.moe is None or not model.moe.shared_experts:
        raise PipesimError("--moe-shared-expert-overlap overlaps the shared experts with the all-to-alls: this model "
                           "has none (--moe-shared-expert-intermediate-size)")
    if opts is not None and "shared_experts" in opts.recompute_modules:
        raise PipesimError("--recompute-modules shared_experts cannot work with --moe-shared-expert-overlap (as "
                           "Megatron-core raises)")
    if not hw.device.family:
        raise PipesimError(f"--moe-shared-expert-overlap hides the exchanges behind the shared experts' kernels, "
                           f"timed kernel by kernel: {hw.name} has no GPU device family (use a GPU preset)")


def beside_exchanges(exchanges: tuple[ExpertExchange, ...], seconds: tuple[float, float, float, float],
                     kind: str) -> tuple[ExpertExchange, ...]:
    """The action's exchanges with the shared experts' seconds beside each: FC1 beside a dispatch (a recomputation's
    too), FC2 beside a combine, the backward beside the combine's backward exchange (its weight gradients too in a
    fused B, and in stage 0's W, which runs the whole backward), carried over to the dispatch's."""
    fc1, fc2, inp, wgt = seconds
    backward = inp + (wgt if kind in ("B", "W") else 0.0)
    side = {"MoE dispatch": fc1, "MoE combine": fc2, "MoE combine backward": backward}
    return tuple(x._replace(beside=side.get(x.what.removeprefix("recompute: "), 0.0),
                            carries=x.what == "MoE dispatch backward") for x in exchanges)


__all__ = ["beside_exchanges", "check_shared_overlap", "shared_seconds"]
