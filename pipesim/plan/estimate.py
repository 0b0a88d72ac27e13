"""The order in which surviving candidates are simulated: a closed-form step-time estimate, cheapest first.

estimate = (m + E) x (the busiest rank's F + I + W seconds per microbatch), where E is the schedule's
bubble in microbatch-times (its closed form, or an approximation documented here). It ignores links,
data-parallel synchronisation and the optimizer, so it only orders the candidates: with --max-candidates
smaller than the survivors, the ones it ranks last are not simulated (docs/planner.md).
"""

from __future__ import annotations

from pipesim.model_costs import ParallelCosts
from pipesim.plan.space import Candidate

# bubble in microbatch-times as a function of (p, v, m); unknown schedules: 1F1B's p - 1
BUBBLE_UNITS = {
    "naive": lambda p, v, m: (p - 1) * m,  # every microbatch crosses every stage alone
    "gpipe": lambda p, v, m: p - 1,
    "1f1b": lambda p, v, m: p - 1,
    "interleaved-1f1b": lambda p, v, m: (p - 1) / v,
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


def rank_seconds(c: Candidate, costs: ParallelCosts) -> float:
    """The busiest rank's compute seconds per microbatch (its v chunks, looped placement approximated)."""
    stages = costs.table.stages
    per_rank = [0.0] * c.p
    for s, sc in enumerate(stages):
        per_rank[s % c.p] += sc.forward + sc.backward_input + sc.backward_weight
    return max(per_rank)


def estimate(c: Candidate, costs: ParallelCosts) -> float:
    """Seconds: the heuristic step time (ordering only)."""
    units = BUBBLE_UNITS.get(c.schedule, lambda p, v, m: p - 1)(c.p, c.v, c.m)
    return (c.m + units) * rank_seconds(c, costs)


__all__ = ["BUBBLE_UNITS", "estimate", "rank_seconds"]
