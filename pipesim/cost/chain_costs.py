"""Costs of a schedule whose stages run in several chains (DualPipe): a stage costs what its model stage costs.

The cost model cuts the model into `schedule.model_stages` stages; a schedule with chains runs each of
them once per chain (replicas: same layers, same parameters), so every per-stage figure is repeated by
`Schedule.model_stage`. One chain: the costs are returned as they are.
"""

from __future__ import annotations

from dataclasses import replace

from pipesim.cost.model_costs import ParallelCosts
from pipesim.ir.schedule import Schedule


def _per_stage(values: tuple, schedule: Schedule) -> tuple:
    return tuple(values[schedule.model_stage(s)] for s in range(schedule.num_stages)) if values else values


def _keyed(table: dict, schedule: Schedule) -> dict:
    """(model stage, kind) -> x as (stage, kind) -> x for every stage."""
    return {(s, kind): value for (base, kind), value in table.items()
            for s in schedule.replicas(base)} if table else table


def on_chains(costs: ParallelCosts, schedule: Schedule) -> ParallelCosts:
    """`costs` (one entry per model stage) spread over the schedule's stages."""
    if schedule.chains == 1:
        return costs
    step = costs.step
    if step is not None:
        step = replace(step, collectives=_per_stage(step.collectives, schedule),
                       optimizer_seconds=_per_stage(step.optimizer_seconds, schedule),
                       optimizer_bytes=_per_stage(step.optimizer_bytes, schedule))
    return replace(costs, table=replace(costs.table, stages=_per_stage(costs.table.stages, schedule)),
                   tp_collectives=_keyed(costs.tp_collectives, schedule),
                   dp_grad_bytes=_per_stage(costs.dp_grad_bytes, schedule),
                   layers_per_stage=_per_stage(costs.layers_per_stage, schedule),
                   param_counts=_per_stage(costs.param_counts, schedule), step=step,
                   cp_exchanges=_keyed(costs.cp_exchanges, schedule), sm_share=_keyed(costs.sm_share, schedule),
                   ep_exchanges=_keyed(costs.ep_exchanges, schedule),
                   expert_param_counts=_per_stage(costs.expert_param_counts, schedule),
                   fp8_weight_bytes=_per_stage(costs.fp8_weight_bytes, schedule),
                   fp8_param_counts=_per_stage(costs.fp8_param_counts, schedule),
                   embedding_copy_counts=_per_stage(costs.embedding_copy_counts, schedule),
                   muon_state_bytes=_per_stage(costs.muon_state_bytes, schedule))
