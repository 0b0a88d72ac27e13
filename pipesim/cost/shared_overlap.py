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
from pipesim.cost.device_profiles import fp8_profile_of, profile_of
from pipesim.cost.kernel_costs import fp8_layer, kernel_seconds
from pipesim.hardware.machine import KernelFigures
from pipesim.model.config import ModelConfig
from pipesim.model.options import LayerOptions

SHARED = "shared "  # the shared experts' kernels' names (pipesim.model.layer_kernels)


@lru_cache(maxsize=1024)
def shared_seconds(model: ModelConfig, b: int, opts: LayerOptions, fused: bool, family: str,
                   kernels: KernelFigures | None = None) -> tuple[float, float, float, float]:
    """One MoE layer's shared-expert seconds (FC1 and its activation forward, FC2 forward, the input-gradient kernels,
    the weight-gradient GEMMs): the layer's own, not a recomputation's."""
    pk = fp8_layer(model, b, replace(opts, recompute="none", recompute_modules=()), fused, family, moe=True)
    profile, fp8 = _profiles(family, kernels, opts)

    def seconds(ks) -> float:
        return sum(kernel_seconds(k, model.dtype, profile, fp8=fp8) for k in ks if k.name.startswith(SHARED))

    forward = [k for k in pk.F if k.name.startswith(SHARED)]
    fc2 = next((i for i, k in enumerate(forward) if k.name.startswith(f"{SHARED}FC2")), len(forward))
    return seconds(forward[:fc2]), seconds(forward[fc2:]), seconds(pk.I), seconds(pk.W)


def _profiles(family: str, kernels: KernelFigures | None, opts: LayerOptions):
    """The profiles `kernel_costs.layer_seconds` times a layer's kernels on (its attention's, its FP8 GEMMs')."""
    profile = profile_of(family, kernels)
    fp8 = fp8_profile_of(family, kernels, opts.fp8.recipe) if opts.fp8 is not None else None
    return profile.with_flash2() if opts.attention == "flash2" else profile, fp8


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


__all__ = ["beside_exchanges", "shared_seconds"]
