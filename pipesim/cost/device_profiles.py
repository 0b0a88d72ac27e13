"""The device profile a hardware file's GPUs are timed on: the family's shipped figures (pipesim/presets/gemm/),
with the file's measured figures and its board's HBM and power limit over them, and the profile FP8 GEMMs see."""

from __future__ import annotations

from functools import lru_cache

from pipesim.device.fp8_rates import FP8, fp8_figures
from pipesim.device.power import at_power_limit
from pipesim.device.profile import DeviceProfile, device_profile
from pipesim.errors import PipesimError
from pipesim.hardware.machine import KernelFigures
from pipesim.model.kernel_types import Gemm

# measured figures that already run at the measured board's clock (a power limit must not scale them again)
CLOCKED = ("matmul_efficiency", "flash_forward_efficiency", "flash_backward_efficiency")


@lru_cache(maxsize=64)
def profile_of(family: str, kernels: KernelFigures | None = None) -> DeviceProfile:
    """The shipped device profile of `family` (read once), with a hardware file's figures over it: measured ones,
    and its board's HBM and power limit (the limit as a tensor clock, pipesim.device.power)."""
    profile = device_profile(family)
    if kernels is None or not kernels.figures():
        return profile
    source = kernels.source or "[device.kernels] of the hardware file"
    figures = kernels.figures()
    watts = figures.pop("power_limit", None)
    measured = [f for f in CLOCKED if f in figures]
    if watts is not None and measured:
        raise PipesimError(f"power_limit {watts:g} W: the device's [device.kernels] also gives {', '.join(measured)}, "
                           "measured at that board's own clock; give the limit or the measured figures, not both")
    profile = profile.with_measured(source, **figures) if figures else profile
    return at_power_limit(profile, watts, source) if watts is not None else profile


@lru_cache(maxsize=64)
def fp8_profile_of(family: str, kernels: KernelFigures | None = None, recipe: str | None = None) -> DeviceProfile:
    """The profile `recipe`'s FP8 GEMMs of `family` are timed on: its FP8 peak and achievable fraction over
    `profile_of`'s figures (a hardware file's measured BF16 matmul_efficiency does not carry over to FP8)."""
    return fp8_figures(family).gemm_profile(profile_of(family, kernels), recipe)


def gemm_timing(shape: Gemm, dtype: str, family: str, kernels: KernelFigures | None = None,
                recipe: str | None = None) -> tuple[str, DeviceProfile]:
    """(dtype, profile) a GEMM shape is timed with: FP8's (`recipe`'s) for an FP8 GEMM, else the model's dtype on
    the family's."""
    if shape.dtype == FP8:
        return FP8, fp8_profile_of(family, kernels, recipe)
    return dtype, profile_of(family, kernels)


__all__ = ["CLOCKED", "fp8_profile_of", "gemm_timing", "profile_of"]
