"""Costing one candidate the way `pipesim simulate` does (SimSetup), with the caches a search needs:
the memory lower bound (no costs, no schedule), per-chunk seconds for the estimate per (chunks, mbs, t,
recompute, sp, cp) (they do not depend on d, m or ZeRO), exact costs per (chunks, m, t, d, recompute, zero,
sp, cp),
one built schedule per (schedule, p, m, v), zb-auto / zb-2p's order per (schedule, costs). Exact memory is
checked here, before any simulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import schedules
from pipesim.cost.model_costs import ParallelCosts, model_costs
from pipesim.cost.rank_memory import rank_memory
from pipesim.errors import PipesimError
from pipesim.ir.schedule import Schedule
from pipesim.model.config import split_layers
from pipesim.model.memory import MemoryBreakdown
from pipesim.plan.memory_bound import MemoryBound
from pipesim.plan.space import Candidate, PlanRequest
from pipesim.sim.result import SimResult
from pipesim.sim.sim_setup import SimSetup


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
        self._chunk_seconds: dict[tuple, tuple[float, ...]] = {}
        self._pieces_cache: dict[tuple, tuple[float, float, float, float]] = {}
        self.schedules_built = 0
        self.simulated = 0
        self.flops = 0.0  # model FLOPs of one step (the search sets it; rows' MFU)
        self.attention = req.attention or SimSetup(req.hardware, req.model).attention_kernel  # every candidate's
        self.bounds = MemoryBound(req.model, self.attention, req.grad_fp32)

    def memory_bound(self, c: Candidate) -> int:
        """Bytes: a lower bound on `c`'s peak per GPU (pipesim.plan.memory_bound); PipesimError if the model refuses."""
        return self.bounds.bound(c)

    def chunk_seconds(self, c: Candidate) -> tuple[float, ...]:
        """F + I + W seconds per microbatch of each of `c`'s chunks, for the estimate (ordering only).

        A chunk's seconds are a per-stage constant, its layers', and the embedding's (first) and the head's
        (last): one `model_costs` call on the cut [0, 1, 2, L - 3] per (mbs, t, recompute, sp, cp) gives the four
        (the chunks' seconds do not depend on d, m or ZeRO), and every cut of every p x v is made from them.
        """
        key = (c.chunks, c.mbs, c.t, c.recompute, c.sp, c.cp)
        if key not in self._chunk_seconds:
            const, layer, first, last = self._pieces(c)
            chunks = c.chunks
            split = split_layers(self.req.model.layers, chunks)
            self._chunk_seconds[key] = tuple(const + n * layer + (first if s == 0 else 0.0)
                                             + (last if s == chunks - 1 else 0.0) for s, n in enumerate(split))
        return self._chunk_seconds[key]

    def _pieces(self, c: Candidate) -> tuple[float, float, float, float]:
        """Seconds per microbatch of (a stage's constant, one layer, the embedding, the head) under c's options."""
        key = (c.mbs, c.t, c.recompute, c.sp, c.cp)
        if key not in self._pieces_cache:
            m = self.req.model
            if m.layers >= 3:
                costs = model_costs(m, 4, m.batch // c.mbs, self.req.hardware, tp=c.t, sp=c.sp, cp=c.cp,
                                    recompute=c.recompute, attention=self.attention, grad_fp32=self.req.grad_fp32,
                                    layer_split=[0, 1, 2, m.layers - 3])
                t0, t1, t2, t3 = (x.forward + x.backward_input + x.backward_weight for x in costs.table.stages)
                layer = t2 - t1
                const = t1 - layer
                pieces = (const, layer, t0 - const, t3 - const - (m.layers - 3) * layer)
            else:  # one or two layers: a stage per layer, the first with the embedding, the last with the head
                costs = model_costs(m, m.layers, m.batch // c.mbs, self.req.hardware, tp=c.t, sp=c.sp, cp=c.cp,
                                    recompute=c.recompute, attention=self.attention, grad_fp32=self.req.grad_fp32)
                total = [x.forward + x.backward_input + x.backward_weight for x in costs.table.stages]
                pieces = (0.0, 0.0, total[0], total[-1] if m.layers > 1 else 0.0)
            self._pieces_cache[key] = pieces
        return self._pieces_cache[key]

    def setup(self, c: Candidate) -> SimSetup:
        """The SimSetup `pipesim simulate` would make from the exported command (memory checked here instead)."""
        key = (c.t, c.d, c.recompute, c.zero, c.sp, c.cp)
        if key not in self._setups:
            self._setups[key] = SimSetup(self.req.hardware, self.req.model, dp=c.d, tp=c.t, cp=c.cp, check_memory=False,
                                         recompute=c.recompute, sp=c.sp, zero=c.zero, attention=self.attention,
                                         comm_options=self.req.comm, grad_fp32=self.req.grad_fp32)
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
        # DualPipe: spread on its chains
        ckey = (c.chunks, sched.chains, c.m, c.t, c.d, c.recompute, c.zero, c.sp, c.cp)
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
