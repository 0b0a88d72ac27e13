"""What FP8 adds to a stage once per step: its linear weights' FP8 copies, their bytes in memory and their cast.

Transformer Engine casts each linear weight to FP8 on the first microbatch of a step and keeps the copy (with its
transpose on a TN-only device) for the step's other microbatches: Megatron-core's schedules.py sets
`is_first_microbatch` on the model chunk, and TE's Linear caches the workspace under it
(transformer_engine/pytorch/module/linear.py @ v2.8: `update_workspace = is_first_microbatch is None or
is_first_microbatch`). So a rank holds, for every chunk, pipesim.model.fp8.weight_copy_bytes of its FP8 linears
beside the unchanged bf16 parameters, float32 main gradients and Adam states, and pays one cast of those weights
per step: read d (tensorwise: twice, the amax pass first) and write the copies, one memory-bound kernel per
weight (two with tensorwise). The simulator's table is per microbatch and alike for all of them, so this
once-per-step cast is charged with the step's optimizer (after the pipeline, on every rank) rather than in each
chunk's first forward of the next step, where TE runs it; docs/cost_model.md, "FP8", says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache

from pipesim.cost.device_profiles import profile_of
from pipesim.cost.kernel_costs import fp8_layer
from pipesim.cost.step_costs import StepCosts
from pipesim.device.fp8_rates import check_fp8_recipe, fp8_figures
from pipesim.device.kernels import memory_bound_time
from pipesim.hardware.machine import Hardware
from pipesim.model.config import ModelConfig
from pipesim.model.fp8 import Fp8Options, weight_copy_bytes
from pipesim.model.fp8_kernels import fp8_expert_params, fp8_weight_params
from pipesim.model.layer_kinds import StageLayers, kind_options
from pipesim.model.options import LayerOptions


@lru_cache(maxsize=1024)
def _layer_fp8_counts(model: ModelConfig, b: int, opts: LayerOptions, family: str, moe: bool) -> tuple[int, int, int]:
    """(parameters, weights, routed experts' parameters) of one layer's FP8 linears on one rank, built once for all
    the stages that ask."""
    kernels = fp8_layer(model, b, opts, True, family, moe=moe)
    return (*fp8_weight_params(kernels), fp8_expert_params(kernels))


def stage_fp8_weights(model: ModelConfig, b: int, opts: LayerOptions, family: str, mix: StageLayers) -> tuple[int, int]:
    """(parameters, weights) of a stage's FP8 linears on one rank: its layers' `mix` (the experts' local share)."""
    counts = [(n, _layer_fp8_counts(model, b, kind_options(model, opts, kind), family, kind.moe)) for kind, n in mix]
    return sum(n * c[0] for n, c in counts), sum(n * c[1] for n, c in counts)


def stage_fp8_expert_params(model: ModelConfig, b: int, opts: LayerOptions, family: str, mix: StageLayers) -> int:
    """Of `stage_fp8_weights`' parameters, the routed experts' on one rank (0 without MoE layers)."""
    return sum(n * _layer_fp8_counts(model, b, kind_options(model, opts, kind), family, True)[2]
               for kind, n in mix if kind.moe)


def weight_cast(params: int, weights: int, fp8: Fp8Options, *, dtype_bytes: int, tn_only: bool) -> tuple[int, int]:
    """(bytes, kernels) of casting `weights` linear weights of `params` parameters to FP8 once: read the dtype
    (tensorwise and nvfp4: an amax pass reads it first, a kernel of its own), write the copies (weight_copy_bytes)."""
    reads = 2 if fp8.global_amax else 1
    return reads * dtype_bytes * params + weight_copy_bytes(params, fp8, tn_only=tn_only), reads * weights


def fp8_stage_costs(model: ModelConfig, b: int, opts: LayerOptions, hw: Hardware,
                    mixes: Sequence[StageLayers]) -> tuple[tuple[int, ...], tuple[float, ...], tuple[int, ...]]:
    """Per stage (its layers in FP8, `mixes`): (bytes of its FP8 weight copies, seconds of casting them once per step,
    its FP8 linears' parameters); empty without FP8. With --fp8-param-gather the copies are the parameters
    themselves (Megatron-core keeps each FP8 linear's parameter as TE's FP8 tensor, its transpose beside it on a
    TN-only device): the same bytes in place of the 16-bit parameter (rank_memory drops those), gathered in FP8
    (step_costs)."""
    fp8 = opts.fp8
    if fp8 is None:
        return (), (), ()
    family = hw.device.family
    tn_only = check_fp8_recipe(family, fp8.recipe, hw.device.name).tn_only
    profile = profile_of(family, hw.device.kernels)
    memory, seconds, counts = [], [], []
    for mix in mixes:
        params, weights = stage_fp8_weights(model, b, opts, family, mix)
        counts.append(params)
        if not fp8.caches_weights:  # torchao: no copy kept, each use casts (pipesim.model.fp8_kernels)
            memory.append(0)
            seconds.append(0.0)
            continue
        memory.append(weight_copy_bytes(params, fp8, tn_only=tn_only))
        nbytes, kernels = weight_cast(params, weights, fp8, dtype_bytes=model.dtype_bytes, tn_only=tn_only)
        seconds.append(memory_bound_time(nbytes, profile, kernels=kernels).seconds if weights else 0.0)
    return tuple(memory), tuple(seconds), tuple(counts)


def with_weight_casts(step: StepCosts, seconds: Sequence[float]) -> StepCosts:
    """The step's costs with each stage's once-per-step FP8 weight cast added to its optimizer seconds."""
    if not seconds:
        return step
    return replace(step, optimizer_seconds=tuple(a + c for a, c in zip(step.optimizer_seconds, seconds, strict=True)))


def mfu_peak(hw: Hardware, model: ModelConfig, fp8: Fp8Options | None) -> float:
    """The dense peak (FLOP/s per GPU) MFU and HFU are counted against: the FP8 tensor cores' when the job's linears
    run in FP8 (the FP4 ones' under NVFP4), the device's peak in the model's dtype otherwise. NVIDIA's convention
    (dgxc-benchmarking v25.04.02 llama3.1/README.md: its FP8 rows' MFU is over the FP8 peak, its BF16 rows' over the
    BF16 peak), and the one that keeps MFU at or below 1: no kernel of an FP8 step runs faster than that peak."""
    if fp8 is not None:
        return fp8_figures(hw.device.family, hw.device.name).peak_of(fp8.recipe)
    return hw.device.flops[model.dtype]


__all__ = ["fp8_stage_costs", "mfu_peak", "stage_fp8_expert_params", "stage_fp8_weights", "weight_cast",
           "with_weight_casts"]
