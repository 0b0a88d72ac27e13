"""The plan: enumerate by arithmetic, cost and prune by memory, order by the estimate, simulate the first
`max_candidates` (progress on stderr), rank by simulated step time.

No candidate over device memory is simulated; when none fits, the error names the closest one and its
largest memory term.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tqdm import tqdm

from pipesim.errors import PipesimError
from pipesim.plan.estimate import estimate
from pipesim.plan.evaluate import Costed, Evaluator
from pipesim.plan.ranking import PlanRow, make_row, model_flops
from pipesim.plan.space import NoLayout, PlanRequest, enumerate_candidates
from pipesim.units import format_bytes

DEFAULT_MAX_CANDIDATES = 200
RECOMPUTE_ORDER = ("none", "selective", "full")


@dataclass
class PlanResult:
    """Every row simulated (fastest first) and the counts of each pruning step."""

    request: PlanRequest
    rows: list[PlanRow]
    counts: dict[str, int] = field(default_factory=dict)  # enumerated, refused_*, over_memory, simulated, ...

    @property
    def best(self) -> PlanRow:
        return self.rows[0]


def _refused_lighter(costed: Costed, over: set) -> bool:
    """True when the same layout with a lighter recomputation was over memory."""
    c = costed.candidate
    lighter = RECOMPUTE_ORDER[:RECOMPUTE_ORDER.index(c.recompute)]
    return any((c.schedule, c.p, c.v, c.t, c.d, c.mbs, rc, c.zero) in over for rc in lighter)


def _key(c) -> tuple:
    return (c.schedule, c.p, c.v, c.t, c.d, c.mbs, c.recompute, c.zero)


def plan(req: PlanRequest, *, max_candidates: int = DEFAULT_MAX_CANDIDATES, progress: bool = True,
         evaluator: Evaluator | None = None) -> PlanResult:
    """Search `req`'s space; PipesimError (one line) when nothing fits."""
    ev = evaluator or Evaluator(req)
    candidates = enumerate_candidates(req)
    counts = {"enumerated": len(candidates), "refused_by_schedule": 0, "over_memory": 0}
    fitting: list[tuple[float, int, Costed]] = []
    over: set = set()
    closest: Costed | None = None
    refusals: list[str] = []
    for c in tqdm(candidates, desc="plan: memory", unit="cand", disable=None if progress else True, leave=False):
        try:
            costed = ev.cost(c)
        except PipesimError as exc:  # the schedule or the model options refuse this combination
            counts["refused_by_schedule"] += 1
            refusals.append(str(exc))
            continue
        if not ev.fits(costed):
            counts["over_memory"] += 1
            over.add(_key(c))
            if closest is None or costed.peak_memory < closest.peak_memory:
                closest = costed
            continue
        fitting.append((estimate(c, costed.costs), c.p * c.v * c.m, costed))
    if not fitting:
        if closest is None:
            raise NoLayout(f"no schedule admits any layout: {refusals[0] if refusals else 'none enumerated'}")
        f = closest.fullest
        term, size = f.largest()
        cap = req.hardware.device.memory
        raise NoLayout(f"no configuration fits {format_bytes(cap)} per GPU: the closest, "
                       f"{closest.candidate.label()}, needs {format_bytes(closest.peak_memory)} "
                       f"({term} {format_bytes(size)})")
    fitting.sort(key=lambda x: (x[0], x[1], x[2].candidate))
    chosen = fitting[:max_candidates]
    counts["fits_memory"] = len(fitting)
    counts["not_simulated_cap"] = len(fitting) - len(chosen)
    flops = model_flops(req, ev.attention)
    rows = []
    for _, _, costed in tqdm(chosen, desc="plan: simulate", unit="sim", disable=None if progress else True,
                             leave=False):
        row = make_row(req, costed, ev.simulate(costed), flops)
        if _refused_lighter(costed, over):
            row = PlanRow(**{**row.__dict__, "refused_recompute": True})
        rows.append(row)
    counts["simulated"] = ev.simulated
    counts["schedules_built"] = ev.schedules_built
    rows.sort(key=PlanRow.sort_key)
    return PlanResult(req, rows, counts)


__all__ = ["DEFAULT_MAX_CANDIDATES", "PlanResult", "plan"]
