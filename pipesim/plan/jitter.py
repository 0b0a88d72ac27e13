"""Ranking under jitter (`pipesim plan --jitter SIGMA`): the shown candidates' expected step when every compute
action's seconds vary, re-ranked by it.

The same spread costs schedules different amounts (docs/whatif.md: a late action waits on its neighbours, and
1F1B, interleaved, zero-bubble and DualPipe orders absorb it differently), so the fastest ideal step need not be
the fastest expected one. Each draw is one simulation with pipesim.sim.perturb's lognormal factor exp(sigma z) on
every compute action; draw k of every candidate uses seed + k (common random numbers: candidates compared on the
same draws), and the expected step is the draws' mean.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from pipesim.errors import PipesimError
from pipesim.plan.evaluate import Evaluator
from pipesim.plan.ranking import PlanRow
from pipesim.sim.perturb import Perturbation


@dataclass(frozen=True)
class PlanJitter:
    """The stated jitter: lognormal sigma on every compute action, the first seed, the draws per candidate."""

    sigma: float
    seed: int = 0
    samples: int = 8

    def __post_init__(self) -> None:
        if not (isinstance(self.sigma, float | int) and math.isfinite(self.sigma) and self.sigma > 0):
            raise PipesimError(f"--jitter must be a sigma > 0 to rank under it, got {self.sigma!r}")
        if not isinstance(self.samples, int) or self.samples < 1:
            raise PipesimError(f"--samples must be a positive integer, got {self.samples!r}")


def expected_step(ev: Evaluator, row: PlanRow, jitter: PlanJitter) -> tuple[float, float]:
    """(mean, population standard deviation) of the row's step time over the jitter's draws, in seconds."""
    costed = ev.cost(row.candidate)
    setup = ev.setup(row.candidate)
    steps = [replace(setup, perturb=Perturbation(jitter=jitter.sigma, seed=jitter.seed + k))
             .simulate(costed.schedule, costed.costs).step_time for k in range(jitter.samples)]
    return statistics.fmean(steps), statistics.pstdev(steps)


def rank_under_jitter(ev: Evaluator, rows: list[PlanRow], jitter: PlanJitter, top: int) -> list[PlanRow]:
    """The first `top` rows with their expected step, re-ranked by it (ties: the ideal order); the rows after
    them keep their ideal order, unscored."""
    scored = []
    for row in rows[:top]:
        mean, std = expected_step(ev, row, jitter)
        scored.append(replace(row, expected_step_time=mean, expected_step_std=std))
    scored.sort(key=lambda r: (r.expected_step_time, r.sort_key()))
    return scored + rows[top:]


__all__ = ["PlanJitter", "expected_step", "rank_under_jitter"]
