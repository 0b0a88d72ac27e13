"""Each pipeline rank's peak memory: model state per ZeRO stage, stashed activations at the schedule's
peak, a recomputed layer's working set, communication buffers; and the check that refuses a rank
that does not fit.

The activation peak is exact for the schedule, not an upper bound: a rank's stash changes only at
its own compute actions, in program order (F stashes its stage's microbatch; B, or W under a split
backward, releases it), so walking the program gives the same peak as the simulator's memory
timeline. A recomputing stage's backward (B, or I under a split backward) re-creates one layer's
activations on top of what is stashed at that moment. Model state as the step holds it: ZeRO-3's
chunks gathered on top of their shard (`step_peak_state`; all of them, or the two units FSDP2 holds at once
when it reshards after each forward). Formulas:
docs/large_models.md.
"""

from __future__ import annotations

from dataclasses import replace

from pipesim.cost.model_costs import ParallelCosts
from pipesim.hardware.machine import Hardware
from pipesim.ir.deps import releases_activations
from pipesim.ir.schedule import Kind, Schedule
from pipesim.model.fsdp import fsdp_units, resident_fraction
from pipesim.model.memory import MemoryBreakdown, ModelState, check_rank_fits, named_precision, step_peak_state

RECOMPUTING = (Kind.B, Kind.I)  # the backward piece that re-runs a recomputed layer's forward first


def activation_peak(schedule: Schedule, costs: ParallelCosts, rank: int) -> tuple[int, int, int]:
    """(stashed bytes, recompute working bytes, in-flight microbatches) at `rank`'s peak of their sum."""
    stages = costs.table.stages
    live = held = 0
    best = (0, 0, 0)
    for a in schedule.programs[rank]:
        k = a.kind
        if k == Kind.F:
            live += stages[a.stage].activation_bytes
            held += 1
            if live > best[0] + best[1]:
                best = (live, 0, held)
        elif k in RECOMPUTING and stages[a.stage].recompute_bytes:
            extra = stages[a.stage].recompute_bytes
            if live + extra > best[0] + best[1]:
                best = (live, extra, held)
        if releases_activations(k):
            live -= stages[a.stage].activation_bytes
            held -= 1
    return best


def rank_memory(schedule: Schedule, costs: ParallelCosts) -> list[MemoryBreakdown]:
    """Peak memory of each pipeline rank (one tp/cp/dp replica; they are all alike)."""
    counts = costs.param_counts or tuple(round(c.param_bytes / costs.dtype_bytes) for c in costs.table.stages)
    precision = named_precision(costs.precision)
    out = []
    dims = costs.job.dims
    for r in range(schedule.num_ranks):
        params = sum(counts[s] for s in schedule.stages_of(r)) - _shared_copies(schedule, costs, r)
        experts = sum(costs.expert_param_counts[s] for s in schedule.stages_of(r)) if costs.expert_param_counts else 0
        resident = _resident(schedule, costs, r)
        state = step_peak_state(params - experts, dp=dims.dp_cp, zero=costs.job.zero, precision=precision,
                                resident=resident)  # its chunks
        if experts:  # the routed experts' state: sharded over the expert-data-parallel group
            more = step_peak_state(experts, dp=dims.edp, zero=costs.job.zero, precision=precision, resident=resident)
            state = ModelState(state.parameters + more.parameters, state.gradients + more.gradients,
                               state.optimizer_states + more.optimizer_states)
        if costs.muon_state_bytes:  # Muon's master and momentum (dist_muon: the rank's dealt share), Adam's the rest
            state = replace(state, optimizer_states=sum(costs.muon_state_bytes[s] for s in schedule.stages_of(r)))
        fp8_options = costs.job.fp8
        # Megatron's --fp8-param-gather: those parameters live in the FP8 copies' bytes (torchao's FSDP2 float8
        # all-gather keeps its 16-bit shards: nothing to drop)
        if costs.fp8_param_counts and fp8_options is not None and fp8_options.caches_weights:
            fp8_params = sum(costs.fp8_param_counts[s] for s in schedule.stages_of(r))
            state = replace(state, parameters=state.parameters - fp8_params * precision.param_bytes)
        stash, working, inflight = activation_peak(schedule, costs, r)
        fp8 = sum(costs.fp8_weight_bytes[s] for s in schedule.stages_of(r)) if costs.fp8_weight_bytes else 0
        out.append(MemoryBreakdown(parameters=state.parameters, gradients=state.gradients,
                                   optimizer_states=state.optimizer_states, activations=stash, inflight=inflight,
                                   recompute=working, comm_buffers=costs.comm_buffer_bytes,
                                   fp8_weights=fp8))
    return out


def _shared_copies(schedule: Schedule, costs: ParallelCosts, rank: int) -> int:
    """Parameters of the rank's last stages' embedding copies that its own first stage's embedding stands in for
    (pipesim.model.param_counts.embedding_copy_params: DualPipe's and the V placements' rank 0)."""
    held = schedule.stages_of(rank)
    if not costs.embedding_copy_counts or not any(schedule.model_stage(s) == 0 for s in held):
        return 0
    return sum(costs.embedding_copy_counts[s] for s in held)


def _resident(schedule: Schedule, costs: ParallelCosts, rank: int) -> float:
    """ZeRO 3: the fraction of the rank's chunks gathered at its peak (pipesim.model.fsdp.resident_fraction); its
    FSDP units are its layers, the embedding and the head (one computes at a time, whichever chunk holds it)."""
    policy = costs.job.with_pp(schedule.num_ranks).fsdp  # the schedule's pipeline, whatever the job's pp
    if policy is None:
        return 1.0
    last = schedule.num_stages - 1
    units = sum(fsdp_units(costs.layers_per_stage[s] if costs.layers_per_stage else 0, first=s == 0, last=s == last)
                for s in schedule.stages_of(rank))
    return resident_fraction(policy, units)


def check_memory(schedule: Schedule, costs: ParallelCosts, hw: Hardware,
                 memory: list[MemoryBreakdown] | None = None) -> list[MemoryBreakdown]:
    """Each rank's breakdown; PipesimError naming the first rank that does not fit, its total and largest term."""
    memory = memory if memory is not None else rank_memory(schedule, costs)
    for r, m in enumerate(memory):
        stages = schedule.stages_of(r)
        where = f"stage{'s' if len(stages) > 1 else ''} {','.join(map(str, stages))}"
        check_rank_fits(m, rank=r, capacity=hw.device.memory, device=hw.device.name, where=where)
    return memory


def memory_json(memory: list[MemoryBreakdown]) -> list[dict]:
    """Per rank: each term in bytes, the in-flight count at the peak, the total (`memory.ranks` in --json)."""
    return [{"rank": r, **m.to_dict()} for r, m in enumerate(memory)]


__all__ = ["activation_peak", "check_memory", "memory_json", "rank_memory"]
