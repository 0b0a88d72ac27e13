"""Costing one candidate the way `pipesim simulate` does (SimSetup), with the caches a search needs:
the memory lower bound (no costs, no schedule), per-chunk seconds for the estimate per (chunks, mbs, the
job's layer options) (they do not depend on dp, m or ZeRO), exact costs per (candidate's Job, chunks, chains,
m), one SimSetup per Job, one built schedule per (schedule, p, m, v), zb-auto / zb-2p's order per (schedule,
costs). Exact memory is checked here, before any simulation.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

import schedules
from pipesim.cost.model_costs import ParallelCosts, model_costs, muon_stages
from pipesim.cost.rank_memory import rank_memory
from pipesim.errors import PipesimError
from pipesim.ir.schedule import Schedule
from pipesim.job import Job
from pipesim.model.memory import MemoryBreakdown, named_precision
from pipesim.plan.estimate import optimizer_tail, rank_tail
from pipesim.plan.memory_bound import MemoryBound, muon_deal_key
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

    def __init__(self, req: PlanRequest, ilp_seconds: float | None = None) -> None:
        self.req = req
        self.ilp_seconds = ilp_seconds  # zb-auto / zb-2p also searched by the ILP for so long (finalists only)
        self._setups: dict[tuple, SimSetup] = {}
        self._costs: dict[tuple, ParallelCosts] = {}
        self._schedules: dict[tuple, Schedule | PipesimError] = {}
        self._tuned: dict[tuple, Schedule] = {}
        self._chunk_seconds: dict[tuple, tuple[float, ...]] = {}
        self._pieces_cache: dict[tuple, tuple[float, float, float, float]] = {}
        self._muon_seconds: dict[tuple, tuple[float, ...]] = {}
        self.schedules_built = 0
        self.simulated = 0
        self.flops = 0.0  # model FLOPs of one step (the search sets it; rows' MFU)
        self.shared = req.shared_job  # what every candidate's Job shares (its attention decided)
        self.attention = self.shared.attention_kernel  # every candidate's
        self.bounds = MemoryBound(req.model, self.shared, req.stage_split)

    def with_ilp(self, seconds: float) -> Evaluator:
        """This evaluator with zb-auto / zb-2p also ILP-searched for `seconds`: its costs, schedules and bounds
        shared (they do not depend on the search), its setups and searched orders its own."""
        other = copy.copy(self)
        other.ilp_seconds = seconds
        other._setups, other._tuned = {}, {}
        return other

    def memory_bound(self, c: Candidate) -> int:
        """Bytes: a lower bound on `c`'s peak per GPU (pipesim.plan.memory_bound); PipesimError if the model refuses."""
        return self.bounds.bound(c)

    def chunk_seconds(self, c: Candidate) -> tuple[float, ...]:
        """F + I + W seconds per microbatch of each of `c`'s chunks, for the estimate (ordering only).

        A chunk's seconds are a per-stage constant, its layers', and the embedding's (first) and the head's
        (last): one `model_costs` call on the cut [0, 1, 2, L - 3] per (mbs, layer options) gives the four
        (the chunks' seconds do not depend on dp, m or ZeRO), and every cut of every p x v is made from them.
        """
        key = (c.chunks, c.mbs, self._layer_job(c))
        if key not in self._chunk_seconds:
            const, layer, first, last = self._pieces(c)
            chunks = c.chunks
            split = self.req.stage_split(chunks)
            self._chunk_seconds[key] = tuple(const + n * layer + (first if s == 0 else 0.0)
                                             + (last if s == chunks - 1 else 0.0) for s, n in enumerate(split))
        return self._chunk_seconds[key]

    def optimizer_tail(self, c: Candidate, precision: str, *, loss_scaling: bool = False) -> float:
        """Seconds of the slowest rank's optimizer step, for the estimate (ordering only): Adam's over the parameters
        each rank owns (`estimate.optimizer_tail`), or under Muon each chunk's step as model_costs times it
        (`muon_stages`: the dist_muon deal over dp x cp), cached by what the deal depends on."""
        if self.shared.muon is None:
            return optimizer_tail(c, self.bounds.params(c.chunks, c.tp), precision, self.req.hardware,
                                  loss_scaling=loss_scaling)
        job = self.job(c)
        key = muon_deal_key(c, job.dims)
        if key not in self._muon_seconds:
            model, split = self.req.model, self.req.stage_split(c.chunks)
            self._muon_seconds[key] = tuple(m.seconds for m in muon_stages(
                model, split, job, self.req.hardware, job.layer_options(model), named_precision(precision)))
        return rank_tail(c, self._muon_seconds[key])

    def _pieces(self, c: Candidate) -> tuple[float, float, float, float]:
        """Seconds per microbatch of (a stage's constant, one layer, the embedding, the head) under c's options.

        A mixture of experts' stage keeps its dp (the experts' edp needs it) but its seconds per microbatch do
        not depend on it: they are costed on the smallest dp the expert layout admits, one microbatch each; and
        every layer as a MoE layer (its dense first or interleaved layers are few: the estimate only orders); and every
        layer in the job's FP8, the few --first-last-layers-bf16 keeps in bf16 too (the cut [0, 1, 2, L - 3] would
        otherwise mix the two precisions into one layer's seconds)."""
        job = replace(self._layer_job(c), bf16_layers=None)
        m = self.req.model
        if m.moe is not None:
            dims = job.dims
            width = dims.ep * dims.expert_tp
            dp = width // math.gcd(width, dims.tp * dims.cp)  # ep x etp divides tp cp dp
            job = replace(job, dims=replace(dims, dp=dp))
            m = replace(m, batch=c.mbs * dp, moe=replace(m.moe, dense_layers=0, every=1))
        key = (c.mbs, job)
        if key not in self._pieces_cache:
            per_replica = m.batch // (c.mbs * job.dims.dp)  # microbatches
            if m.layers >= 3:
                costs = model_costs(m, 4, per_replica, self.req.hardware, job, layer_split=[0, 1, 2, m.layers - 3])
                t0, t1, t2, t3 = (x.microbatch_seconds for x in costs.table.stages)
                layer = t2 - t1
                const = t1 - layer
                pieces = (const, layer, t0 - const, t3 - const - (m.layers - 3) * layer)
            else:  # one or two layers: a stage per layer, the first with the embedding, the last with the head
                costs = model_costs(m, m.layers, per_replica, self.req.hardware, job)
                total = [x.microbatch_seconds for x in costs.table.stages]
                pieces = (0.0, 0.0, total[0], total[-1] if m.layers > 1 else 0.0)
            self._pieces_cache[key] = pieces
        return self._pieces_cache[key]

    def job(self, c: Candidate) -> Job:
        """`c`'s Job: its layout and options over the request's shared ones (the caches' key)."""
        return c.job(self.shared)

    def _layer_job(self, c: Candidate) -> Job:
        """`c`'s Job as a stage's seconds see it (Job.per_stage: not dp, ZeRO or p)."""
        return self.job(c).per_stage()

    def setup(self, c: Candidate) -> SimSetup:
        """The SimSetup `pipesim simulate` would make from the exported command (memory checked here instead)."""
        job = self.job(c)
        if job not in self._setups:
            self._setups[job] = SimSetup(self.req.hardware, self.req.model, job=job, check_memory=False,
                                         ilp_time_limit=self.ilp_seconds, split_rule=self.req.split_rule)
        return self._setups[job]

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
        ckey = (setup.job, c.chunks, sched.chains, c.m)  # DualPipe: spread on its chains
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
