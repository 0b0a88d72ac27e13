"""The order in which surviving candidates are simulated: a closed-form step-time estimate, cheapest first.

estimate = (m + E) x (the busiest rank's F + I + W seconds per microbatch) + the slowest rank's optimizer step
(Adam's over the parameters it owns, or Megatron-core's Muon step of its chunks, pipesim.cost.muon_step),
where E is the schedule's bubble in microbatch-times (its closed form, or an approximation documented
here). It ignores links and data-parallel synchronisation, so it only orders the candidates: the ones it
ranks past --max-candidates / --max-work are not simulated (docs/planner.md).
"""

from __future__ import annotations

from pipesim.cost.step_costs import optimizer_seconds
from pipesim.hardware.machine import Hardware
from pipesim.plan.memory_bound import MIRRORED, rank_chunks
from pipesim.plan.space import Candidate

# bubble in microbatch-times as a function of (p, v, m); unknown schedules: 1F1B's p - 1
BUBBLE_UNITS = {
    "naive": lambda p, v, m: (p - 1) * m,  # every microbatch crosses every stage alone
    "gpipe": lambda p, v, m: p - 1,
    "1f1b": lambda p, v, m: p - 1,
    "interleaved-1f1b": lambda p, v, m: (p - 1) / v,
    "combined-1f1b": lambda p, v, m: (p - 1) / v,  # interleaved 1F1B's order, steady F and B overlapped
    "looped-bfs": lambda p, v, m: (p - 1) / v,
    "interleaved-zb": lambda p, v, m: (p - 1) / (2 * v),  # about half of interleaved 1F1B's
    "zb-h1": lambda p, v, m: (p - 1) / 3,  # Qi et al. 2024: a third of 1F1B's
    "zb-h2": lambda p, v, m: 0.0,
    "zb-2p": lambda p, v, m: 0.0,
    "zb-auto": lambda p, v, m: (p - 1) / 3,
    "zb-v": lambda p, v, m: 0.0,
    "v-half": lambda p, v, m: (p - 1) / 2,
    "v-min": lambda p, v, m: p - 1,
    "dualpipev": lambda p, v, m: 0.0,
}


def _held(c: Candidate) -> list[list[int]]:
    """Chunks per rank (the family's placement; looped for a schedule memory_bound does not list)."""
    return rank_chunks(c.schedule, c.p, c.v) or [[r + k * c.p for k in range(c.k)] for r in range(c.p)]


def rank_seconds(c: Candidate, chunk_seconds: tuple[float, ...]) -> float:
    """The busiest rank's compute seconds per microbatch (its v chunks; DualPipe's two replicas each see half
    of the microbatches)."""
    share = 0.5 if c.schedule in MIRRORED else 1.0
    return share * max(sum(chunk_seconds[s] for s in ids) for ids in _held(c))


def rank_tail(c: Candidate, chunk_tail: tuple[float, ...]) -> float:
    """Seconds: the slowest rank's sum of a per-chunk step (each rank steps the chunks it holds)."""
    return max(sum(chunk_tail[s] for s in ids) for ids in _held(c))


def optimizer_tail(c: Candidate, params: tuple[int, ...], precision: str, hw: Hardware, *,
                   loss_scaling: bool = False) -> float:
    """Seconds: the slowest rank's optimizer step over the parameters it owns, as step_costs times it."""
    return max(optimizer_seconds(sum(params[s] for s in ids), dp=c.dp, zero=c.zero, hw=hw, precision=precision,
                                 loss_scaling=loss_scaling) for ids in _held(c))


def estimate(c: Candidate, chunk_seconds: tuple[float, ...], tail: float = 0.0) -> float:
    """Seconds: the heuristic step time (ordering only): (m + E) x the busiest rank's seconds, plus `tail`."""
    units = BUBBLE_UNITS.get(c.schedule, lambda p, v, m: p - 1)(c.p, c.v, c.m)
    return (c.m + units) * rank_seconds(c, chunk_seconds) + tail


__all__ = ["BUBBLE_UNITS", "estimate", "optimizer_tail", "rank_seconds", "rank_tail"]
