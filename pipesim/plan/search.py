"""The plan: enumerate by arithmetic, drop by the memory lower bound (no schedule built), order the rest by
the estimate, then walk that order: exact memory (schedule built, `rank_memory`), and simulate those that
fit until `max_candidates` simulations or `max_work` work units are spent: p x v x m per candidate built
(simulated or found over memory), plus REBUILD_WEIGHT x p x m for the schedules reordered for their costs.
The walk runs on a backend (pipesim/plan/backends.py: a local process pool of `workers`, or a Dask / Ray
cluster); results are consumed in order, so the set simulated and every figure are the same as the serial walk's.
Progress on stderr (tqdm, only on a terminal).

No candidate over device memory is simulated; when none fits, the error names the closest one and its
largest memory term.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from tqdm import tqdm

from pipesim.cost.model_costs import precision_of
from pipesim.cost.zb_auto_costs import AUTO_SCHEDULES
from pipesim.errors import PipesimError
from pipesim.model.op_recompute import OP
from pipesim.plan.backends import Backend, LocalPool
from pipesim.plan.estimate import estimate
from pipesim.plan.evaluate import Costed, Evaluator
from pipesim.plan.finalists import DEFAULT_FINALISTS, search_finalists
from pipesim.plan.ranking import PlanRow, step_model_flops
from pipesim.plan.space import Candidate, NoLayout, PlanRequest, enumerate_candidates
from pipesim.units import format_bytes

DEFAULT_MAX_CANDIDATES = 200
DEFAULT_MAX_WORK = 250_000  # work units (chunk-microbatches) spent at most: about 40 s on one core
REBUILD_WEIGHT = 20  # zb-auto / zb-2p: reordering for the costs takes about 20x a simulation per chunk-microbatch
# lightest stash last: Megatron's selective drops the attention core, torchtitan's op policy half the matmuls' outputs
RECOMPUTE_ORDER = ("none", "selective", OP, "full")


@dataclass
class PlanResult:
    """Every row simulated (fastest first), the counts of each pruning step, and what the walk met."""

    request: PlanRequest
    rows: list[PlanRow]
    counts: dict[str, int] = field(default_factory=dict)  # enumerated, over_memory_bound, over_memory, ...
    over: list[tuple[Candidate, int]] = field(default_factory=list)  # (candidate, peak bytes) over memory, exact

    @property
    def best(self) -> PlanRow:
        return self.rows[0]


def _key(c: Candidate) -> tuple:
    return (c.schedule, c.p, c.v, c.tp, c.dp, c.mbs, c.recompute, c.zero, c.sp, c.cp)


def _refused_lighter(c: Candidate, over: set) -> bool:
    """True when the same layout with a lighter recomputation was over memory."""
    lighter = RECOMPUTE_ORDER[:RECOMPUTE_ORDER.index(c.recompute)]
    return any(_key(replace(c, recompute=rc)) in over for rc in lighter)


def work_units(c: Candidate) -> int:
    """What building, checking and simulating `c` costs, in chunk-microbatches (deterministic, unlike seconds)."""
    units = c.chunks * c.m
    return units + (REBUILD_WEIGHT * c.p * c.m if c.schedule in AUTO_SCHEDULES else 0)


def default_workers() -> int:
    return os.cpu_count() or 1


def plan(req: PlanRequest, *, max_candidates: int = DEFAULT_MAX_CANDIDATES, max_work: int = DEFAULT_MAX_WORK,
         progress: bool = True, evaluator: Evaluator | None = None, workers: int = 1, backend: Backend | None = None,
         include: tuple[Candidate, ...] = (), ilp_seconds: float | None = None,
         finalists: int = DEFAULT_FINALISTS) -> PlanResult:
    """Search `req`'s space; PipesimError (one line) when nothing fits.

    include: candidates of the space simulated first, whatever the estimate and the caps (a published
    configuration to compare with); PipesimError if one is not in the space.
    backend: where the walk's candidates run (default a LocalPool of `workers`); the result is the same.
    ilp_seconds: also search zb-auto / zb-2p on the top `finalists` layouts, by the ILP for so long each
    (pipesim/plan/finalists.py); None: the walk's rows only.
    """
    ev = evaluator or Evaluator(req)
    ev.flops = step_model_flops(req)
    candidates = enumerate_candidates(req)
    missing = [c.label() for c in include if c not in set(candidates)]
    if missing:
        raise PipesimError(f"not in the search space: {missing[0]}")
    counts = {"enumerated": len(candidates), "refused_by_model": 0, "over_memory_bound": 0}
    cap = req.hardware.device.memory
    survivors: list[tuple[float, int, Candidate]] = []
    over: set = set()
    closest: tuple[int, Candidate] | None = None
    precision = precision_of(req.model, req.job.kernels.grad_fp32, req.job.adam_states, req.job.fp8)
    fp16 = req.model.dtype == "float16"  # trained under a loss scale
    disable = None if progress else True
    for c in tqdm(candidates, desc="plan: bound", unit="cand", disable=disable, leave=False):
        try:
            bound = ev.memory_bound(c)
        except PipesimError:
            counts["refused_by_model"] += 1
            continue
        if bound > cap:
            counts["over_memory_bound"] += 1
            over.add(_key(c))
            if closest is None or (bound, c) < closest:
                closest = (bound, c)
            continue
        tail = ev.optimizer_tail(c, precision, loss_scaling=fp16)
        survivors.append((estimate(c, ev.chunk_seconds(c), tail), c.chunks * c.m, c))
    survivors.sort()
    forced = list(include)
    order = forced + [c for _, _, c in survivors if c not in set(forced)]
    counts.update(fits_memory_bound=len(survivors), refused_by_schedule=0, over_memory=0, simulated=0,
                  work=0, not_simulated_cap=0)
    rows: list[PlanRow] = []
    met_over: list[tuple[Candidate, int]] = []
    refusals: list[str] = []
    backend = backend or LocalPool(workers)
    bar = tqdm(total=min(len(order), max_candidates), desc="plan: simulate", unit="sim", disable=disable, leave=False)
    examined = 0
    walk = backend.outcomes(ev, order)
    try:
        for c, (kind, value) in zip(order, walk, strict=True):
            examined += 1
            if kind != "refused":
                counts["work"] += work_units(c)
            if kind == "refused":
                counts["refused_by_schedule"] += 1
                refusals.append(value)
            elif kind == "over":
                counts["over_memory"] += 1
                over.add(_key(c))
                met_over.append((c, value))
            else:
                rows.append(value)
                counts["simulated"] += 1
                bar.update()
            if examined >= len(forced) and (counts["simulated"] >= max_candidates
                                            or counts["work"] >= max_work):
                break
    finally:
        bar.close()
        walk.close()  # drops the work still queued
    counts["not_simulated_cap"] = len(order) - examined
    counts["schedules_built"] = ev.schedules_built
    if not rows:
        _raise_nothing_fits(req, ev, closest, met_over, refusals)
    rows = [replace(r, refused_recompute=True) if _refused_lighter(r.candidate, over) else r for r in rows]
    rows.sort(key=PlanRow.sort_key)
    if ilp_seconds is not None:
        rows, report = search_finalists(ev, rows, count=finalists, seconds=ilp_seconds)
        counts.update(finalists_tried=report.tried, finalists_simulated=report.simulated,
                      finalists_improved=report.improved, finalists_added=report.added)
    return PlanResult(req, rows, counts, met_over)


def _raise_nothing_fits(req: PlanRequest, ev: Evaluator, closest, met_over, refusals) -> None:
    """One line: the candidate closest to fitting, its peak and its largest term; or why every one was refused."""
    near = [(peak, c) for c, peak in met_over]
    if closest is not None:
        near.append(closest)
    if not near:
        raise NoLayout(f"no schedule admits any layout: {refusals[0] if refusals else 'none enumerated'}")
    _, c = min(near)
    try:
        costed: Costed = ev.cost(c)
    except PipesimError as exc:
        raise NoLayout(f"no configuration fits: the closest, {c.label()}, is refused: {exc}") from None
    term, size = costed.fullest.largest()
    raise NoLayout(f"no configuration fits {format_bytes(req.hardware.device.memory)} per GPU: the closest, "
                   f"{c.label()}, needs {format_bytes(costed.peak_memory)} ({term} {format_bytes(size)})")


__all__ = ["DEFAULT_MAX_CANDIDATES", "DEFAULT_MAX_WORK", "PlanResult", "default_workers", "plan"]
