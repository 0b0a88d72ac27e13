"""zb-auto ordered with the cost model's seconds: a model's per-stage F, I, W and each boundary's P2P time (not
unit costs), reaching the makespan lower bound with unlimited memory on stages that differ."""

from __future__ import annotations

import json

import pytest

import schedules
from pipesim.cli import main
from pipesim.cost.table import CostTable
from pipesim.cost.zb_auto_costs import MemoryLimit, auto_costs, makespan_lower_bound
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.sim_setup import SimSetup
from schedules.zb_auto import zb_auto_schedule

UNLIMITED = MemoryLimit(bytes=float("inf"))
HW = load_hardware("dgx-h100")


def gpt(layers: int, m: int) -> ModelConfig:
    """Small enough that the embedding (first stage) and the head (last) weigh like blocks: unequal stages."""
    return ModelConfig(kind="gpt", hidden=64, heads=4, seq=32, vocab=512, layers=layers, batch=2 * m, dtype="bfloat16")


def boundary_seconds(table: CostTable, p: int) -> tuple[float, ...]:
    par = ParallelDims(pp=p)
    return tuple(HW.p2p_time(par.rank(pp=s), par.rank(pp=s + 1), table.stages[s].boundary_bytes) for s in range(p - 1))


@pytest.mark.parametrize(("f", "i", "w"), [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 2.0, 1.0), (1.0, 3.0, 1.0)])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_lower_bound_is_the_closed_form_on_equal_stages(f, i, w, p):
    m = 2 * p
    bound = makespan_lower_bound(CostTable.uniform(p, f, i, w), p, m)
    assert bound == max((p - 1) * f + m * (f + i + w), (p - 1) * f + m * (f + i) + (p - 1) * i + w)


@pytest.mark.parametrize(("layers", "split", "p", "m"), [
    (12, (4, 3, 3, 2), 4, 8), (12, (2, 3, 3, 4), 4, 12), (16, None, 4, 8), (8, None, 2, 6),
    (14, (1, 2, 2, 2, 3, 4), 6, 12),
])
def test_unlimited_zb_auto_on_model_costs_is_within_one_percent_of_the_lower_bound(layers, split, p, m):
    setup = SimSetup(hardware=HW, model=gpt(layers, m), layer_split=split, memory_limit=UNLIMITED)
    registry = schedules.build("zb-auto", p, m)
    costs = setup.costs(registry)
    table = costs.table
    assert len({(c.forward, c.backward_input, c.backward_weight) for c in table.stages}) > 1  # stages differ
    comm = boundary_seconds(table, p)
    tuned = setup.tuned(registry, costs)
    # searched with these seconds: exactly the heuristic fed by the table and the links
    assert tuned.programs == zb_auto_schedule(p, m, auto_costs(table, p, m, UNLIMITED, comm)).programs
    makespan = setup.simulate(tuned, costs).makespan
    bound = makespan_lower_bound(table, p, m, comm)
    assert bound <= makespan * (1 + 1e-12) and makespan <= 1.01 * bound
    assert makespan <= setup.simulate(registry, costs).makespan  # never behind the unit-cost order


def test_model_costs_change_the_order_and_beat_the_unit_cost_one():
    """GPT's first stage has no input gradient (I = 0, all its backward is W): the unit-cost order leaves it
    waiting with W's to run; the order searched on the model's seconds reaches the bound, 5 % shorter."""
    setup = SimSetup(hardware=HW, model=gpt(12, 8), layer_split=(4, 3, 3, 2), memory_limit=UNLIMITED)
    registry = schedules.build("zb-auto", 4, 8)
    costs = setup.costs(registry)
    assert costs.table.stages[0].backward_input == 0.0
    tuned = setup.tuned(registry, costs)
    assert tuned.programs != registry.programs
    ours, unit = setup.simulate(tuned, costs).makespan, setup.simulate(registry, costs).makespan
    assert ours < 0.96 * unit
    assert ours == pytest.approx(makespan_lower_bound(costs.table, 4, 8, boundary_seconds(costs.table, 4)), rel=1e-9)


def test_simulate_command_orders_zb_auto_with_the_model(capsys):
    argv = ["simulate", "zb-auto", "-p", "4", "-m", "8", "--model", "gpt", "--hidden", "64", "--heads", "4", "--seq",
            "32", "--vocab", "512", "--layers", "12", "--batch", "16", "--dtype", "bfloat16", "--layer-split",
            "4,3,3,2", "--hardware", "dgx-h100", "--memory-limit", "inf", "--json", "-"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    setup = SimSetup(hardware=HW, model=gpt(12, 8), layer_split=(4, 3, 3, 2), memory_limit=UNLIMITED)
    costs = setup.costs(schedules.build("zb-auto", 4, 8))
    assert data["makespan"] == pytest.approx(makespan_lower_bound(costs.table, 4, 8, boundary_seconds(costs.table, 4)),
                                             rel=1e-9)
