"""A board's power limit as its tensor clock: the same die on a board of a lower limit sustains a lower clock.

NVIDIA rates each board of a die at its own power limit (the datasheet's dense peak is the SM count times the
tensor throughput per clock times the clock the board is rated at). A family's profile lists those ratings
(`power_ratings`: watts -> dense BF16 peak) beside the limit of the board its figures were measured on
(`power_limit`). A board of another limit between two ratings takes the peak interpolated linearly in watts; its
clock, and so every tensor rate of the profile (GEMMs of every dtype, flash attention), scales by that peak over the
reference board's. Memory-bound kernels keep their rate: HBM does not run on the SM clock. The rule and its
sources: docs/gpu_model.md, "A board's power limit".
"""

from __future__ import annotations

from dataclasses import replace

from pipesim.device.profile import DeviceProfile
from pipesim.errors import PipesimError


def rated_peak(ratings: tuple[tuple[float, float], ...], watts: float) -> float:
    """The dense peak at `watts`: linear between the two ratings around it (watts within their span)."""
    points = sorted(ratings)
    for (w0, f0), (w1, f1) in zip(points, points[1:]):
        if w0 <= watts <= w1:
            return f0 + (f1 - f0) * (watts - w0) / (w1 - w0)
    if len(points) == 1 and points[0][0] == watts:
        return points[0][1]
    raise PipesimError(f"no rating spans {watts:g} W")


def clock_scale(profile: DeviceProfile, watts: float) -> float:
    """The tensor clock of a `watts` board of `profile`'s die over the reference board's; one line when the family
    has no ratings, or `watts` lies outside their span."""
    where = f"power_limit {watts:g} W on device {profile.name!r}"
    if profile.power_limit is None or len(profile.power_ratings) < 2:
        raise PipesimError(f"{where}: its family lists no rated boards to take a clock from (power_ratings in "
                           "pipesim/presets/gemm/devices.toml)")
    low, high = min(w for w, _ in profile.power_ratings), max(w for w, _ in profile.power_ratings)
    if not low <= watts <= high:
        raise PipesimError(f"{where}: outside the {low:g}-{high:g} W its rated boards span")
    return rated_peak(profile.power_ratings, watts) / rated_peak(profile.power_ratings, profile.power_limit)


def at_power_limit(profile: DeviceProfile, watts: float, source: str) -> DeviceProfile:
    """`profile` on a board limited to `watts` (`clock_scale` set; `source` names where the limit is stated)."""
    scale = clock_scale(profile, watts)
    note = (f"{source}: a {watts:g} W board, its peaks x {scale:.4f} (pipesim.device.power, the rated boards "
            f"{', '.join(f'{w:g} W' for w, _ in sorted(profile.power_ratings))})")
    return replace(profile, clock_scale=scale, sources={**profile.sources, "clock_scale": note})


__all__ = ["at_power_limit", "clock_scale", "rated_peak"]
