"""Costing one candidate the way `pipesim simulate` does (SimSetup), with the caches a search needs:
costs per (chunks, m, t, d, recompute, zero), one built schedule per (schedule, p, m, v), zb-auto /
zb-2p's order per (schedule, costs). Memory is checked here, before any simulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import schedules
from pipesim.errors import PipesimError
from pipesim.ir import Schedule
from pipesim.model.memory import MemoryBreakdown
from pipesim.model_costs import ParallelCosts
from pipesim.plan.space import Candidate, PlanRequest
from pipesim.rank_memory import rank_memory
from pipesim.sim_result import SimResult
from pipesim.sim_setup import SimSetup


@dataclass(frozen=True)
class Costed:
    """A candidate with its costs, its (tuned) schedule and its peak memory per GPU."""

    candidate: Candidate
    costs: ParallelCosts
    schedule: Schedule
    memory: list[MemoryBreakdown]

    @property
    def peak_memory(self) -> int:
        """Bytes on the fullest GPU."""
        return max(m.total for m in self.memory)

    @property
    def fullest(self) -> MemoryBreakdown:
        return max(self.memory, key=lambda m: m.total)


class Evaluator:
    """Costs, prunes and simulates candidates of one request; counts what it built and simulated."""

    def __init__(self, req: PlanRequest) -> None:
        self.req = req
        self._setups: dict[tuple, SimSetup] = {}
        self._costs: dict[tuple, ParallelCosts] = {}
        self._schedules: dict[tuple, Schedule | PipesimError] = {}
        self._tuned: dict[tuple, Schedule] = {}
        self.schedules_built = 0
        self.simulated = 0

    @property
    def attention(self) -> str:
        """The attention kernel every candidate is costed with (SimSetup's default for this model and device)."""
        return SimSetup(self.req.hardware, self.req.model).attention_kernel

    def setup(self, c: Candidate) -> SimSetup:
        """The SimSetup `pipesim simulate` would make from the exported command (memory checked here instead)."""
        key = (c.t, c.d, c.recompute, c.zero)
        if key not in self._setups:
            self._setups[key] = SimSetup(self.req.hardware, self.req.model, dp=c.d, tp=c.t, check_memory=False,
                                         recompute=c.recompute, sp=c.sp, zero=c.zero)
        return self._setups[key]

    def schedule(self, c: Candidate) -> Schedule:
        """The registered schedule, built once per (schedule, p, m, v); a refusal is remembered too."""
        key = c.schedule_key
        if key not in self._schedules:
            self.schedules_built += 1
            try:
                self._schedules[key] = schedules.build(c.schedule, c.p, c.m, c.v)
            except PipesimError as exc:
                self._schedules[key] = exc
        built = self._schedules[key]
        if isinstance(built, PipesimError):
            raise built
        return built

    def cost(self, c: Candidate) -> Costed:
        """Costs, tuned schedule and memory of `c`; PipesimError when the schedule or model refuses it."""
        setup = self.setup(c)
        sched = self.schedule(c)
        ckey = (c.p * c.v, c.m, c.t, c.d, c.recompute, c.zero)
        if ckey not in self._costs:
            self._costs[ckey] = setup.costs(sched)
        costs = self._costs[ckey]
        tkey = (c.schedule_key, ckey)
        if tkey not in self._tuned:
            self._tuned[tkey] = setup.tuned(sched, costs)
        tuned = self._tuned[tkey]
        return Costed(c, costs, tuned, rank_memory(tuned, costs))

    def fits(self, costed: Costed) -> bool:
        return costed.peak_memory <= self.req.hardware.device.memory

    def simulate(self, costed: Costed) -> SimResult:
        """One simulation, only of a candidate that fits (PipesimError otherwise: pruning comes first)."""
        if not self.fits(costed):
            raise PipesimError(f"{costed.candidate.label()} does not fit device memory; it is not simulated")
        self.simulated += 1
        return self.setup(costed.candidate).simulate(costed.schedule, costed.costs)


__all__ = ["Costed", "Evaluator"]
