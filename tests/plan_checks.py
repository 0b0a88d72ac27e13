"""The planner's memory lower bound against the exact peak, the check several planner tests make."""

from __future__ import annotations

from collections.abc import Callable

from pipesim.errors import PipesimError
from pipesim.plan.evaluate import Evaluator
from pipesim.plan.space import Candidate, PlanRequest, enumerate_candidates


def bounds_hold(req: PlanRequest,
                keep: Callable[[Candidate], bool] = lambda c: True) -> list[tuple[Candidate, int, int]]:
    """(candidate, bound, exact peak bytes) of every candidate `keep` admits that costs without a refusal, each
    asserted to have a memory bound (what the planner prunes on) no larger than its peak (rank_memory's)."""
    ev = Evaluator(req)
    checked = []
    for c in enumerate_candidates(req):
        if not keep(c):
            continue
        try:
            costed = ev.cost(c)
        except PipesimError:
            continue
        bound = ev.memory_bound(c)
        assert bound <= costed.peak_memory, c.label()
        checked.append((c, bound, costed.peak_memory))
    return checked
