"""The device profile a hardware file's GPUs are timed on: the family's shipped figures (pipesim/presets/gemm/),
with the file's measured figures and its board's HBM and power limit over them, and the profile FP8 GEMMs see."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from pipesim.device.fp8_rates import QUANTIZED, fp8_figures
from pipesim.device.power import at_power_limit
from pipesim.device.profile import DeviceProfile, device_profile
from pipesim.errors import PipesimError
from pipesim.hardware.machine import MEASURED_AT_CLOCK, KernelFigures
from pipesim.model.kernel_types import Gemm


@lru_cache(maxsize=64)
def profile_of(family: str, kernels: KernelFigures | None = None) -> DeviceProfile:
    """The shipped device profile of `family` (read once), with a hardware file's figures over it: measured ones,
    and its board's HBM and power limit (the limit as a tensor clock, pipesim.device.power, which the figures measured
    on that board keep: their rates are the board's own, not scaled again)."""
    profile = device_profile(family)
    if kernels is None or not kernels.figures():
        return profile
    source = kernels.source or "[device.kernels] of the hardware file"
    figures = kernels.figures()
    figures.pop("fp8_matmul_efficiency", None)  # FP8's own (fp8_profile_of)
    watts = figures.pop("power_limit", None)
    if watts is not None:  # the board's clock first; the figures measured on it keep their rates
        profile = at_power_limit(profile, watts, source)
        figures.update({f: _unclocked(f, figures[f], profile.clock_scale, watts) for f in MEASURED_AT_CLOCK
                        if f in figures})
    return profile.with_measured(source, **figures) if figures else profile


def _unclocked(name: str, value: float, scale: float, watts: float) -> float:
    """A figure measured on a board of `watts` as a fraction of the family's unclocked peak: value / scale, so that
    times the board's clock it is the rate measured."""
    if value / scale > 1:
        raise PipesimError(f"{name} {value:g} measured on a {watts:g} W board is above that board's peak "
                           f"(x {scale:.4f} of the family's): the figure or the limit is wrong")
    return value / scale


@lru_cache(maxsize=64)
def fp8_profile_of(family: str, kernels: KernelFigures | None = None, recipe: str | None = None) -> DeviceProfile:
    """The profile `recipe`'s FP8 GEMMs of `family` are timed on: its FP8 peak and achievable fraction over
    `profile_of`'s figures (a hardware file's measured BF16 matmul_efficiency does not carry over to FP8). A file's
    fp8_matmul_efficiency, measured on that board with per-tensor scales (bench/gpu_fp8.py's torch._scaled_mm, MAMF's
    FP8 table), replaces the family's per-tensor fraction; a recipe with a figure of its own (the B200's MXFP8) keeps
    its ratio to the family's per-tensor one on that board."""
    figures = fp8_figures(family)
    profile = figures.gemm_profile(profile_of(family, kernels), recipe)
    measured = kernels.fp8_matmul_efficiency if kernels is not None else None
    if measured is None:
        return profile
    value = measured if kernels.power_limit is None else \
        _unclocked("fp8_matmul_efficiency", measured, profile.clock_scale, kernels.power_limit)
    ratio = figures.efficiency(recipe) / figures.matmul_efficiency  # 1 for the per-tensor recipes
    return replace(profile, matmul_efficiency=value * ratio,
                   sources={**profile.sources, "matmul_efficiency": kernels.source or "[device.kernels]"})


def gemm_timing(shape: Gemm, dtype: str, family: str, kernels: KernelFigures | None = None,
                recipe: str | None = None) -> tuple[str, DeviceProfile]:
    """(dtype, profile) a GEMM shape is timed with: FP8's (`recipe`'s) for an FP8 GEMM, else the model's dtype on
    the family's."""
    if shape.dtype in QUANTIZED:
        return shape.dtype, fp8_profile_of(family, kernels, recipe)
    return dtype, profile_of(family, kernels)


__all__ = ["fp8_profile_of", "gemm_timing", "profile_of"]
