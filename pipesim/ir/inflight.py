"""Schedule-level analysis that needs no hardware: in-flight microbatches (activation memory)."""

from __future__ import annotations

from pipesim.ir.deps import releases_activations
from pipesim.ir.schedule import Kind, Schedule


def inflight_by_stage(schedule: Schedule) -> list[int]:
    """Peak number of microbatches whose activations stage s holds at once."""
    live = [0] * schedule.num_stages
    peak = [0] * schedule.num_stages
    for prog in schedule.programs:
        for a in prog:
            if a.kind == Kind.F:
                live[a.stage] += 1
                peak[a.stage] = max(peak[a.stage], live[a.stage])
            elif releases_activations(a.kind):
                live[a.stage] -= 1
    return peak


def inflight_by_rank(schedule: Schedule) -> list[int]:
    """Peak in-flight (stage, microbatch) activations per rank, summed over its stages."""
    peaks = []
    for prog in schedule.programs:
        live = peak = 0
        for a in prog:
            if a.kind == Kind.F:
                live += 1
                peak = max(peak, live)
            elif releases_activations(a.kind):
                live -= 1
        peaks.append(peak)
    return peaks
