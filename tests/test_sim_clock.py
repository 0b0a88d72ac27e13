"""The simulator's two clocks: exact absolute times, posting order on ties, and the same results bit for bit."""

from __future__ import annotations

import pytest

import schedules
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig
from pipesim.sim.clock import HeapClock, SimpyClock
from pipesim.sim.sim_setup import SimSetup
from pipesim.sim.simulator import simulate


@pytest.mark.parametrize("clock_type", [HeapClock, SimpyClock])
def test_clock_runs_at_absolute_times_in_posting_order(clock_type):
    clock, seen = clock_type(), []
    clock.at(1.1, lambda: clock.at(7.7, lambda: seen.append(("abs", clock.now))))
    clock.at(1.1, lambda: seen.append(("second at 1.1", clock.now)))
    clock.at(0.5, lambda: clock.after(7.25, lambda: seen.append(("rel", clock.now))))
    assert clock.next_time() == 0.5
    clock.run()
    # exact: 7.7, not 1.1 + (7.7 - 1.1) = 7.699999999999999, the time SimPy itself keeps for that event
    assert seen == [("second at 1.1", 1.1), ("abs", 7.7), ("rel", 7.75)]
    assert 1.1 + (7.7 - 1.1) != 7.7 and clock.next_time() == float("inf")


CASES = [  # (hardware, model): the CPU host plug-ins (time slices at 4 ranks on 2 cores) and a GPU preset
    ("local-cpu", ModelConfig(kind="mlp", hidden=256, layers=8, batch=16)),
    ("local-cpu", ModelConfig(kind="gpt", hidden=64, layers=8, heads=4, seq=32, vocab=128, batch=8)),
    ("dgx-h100", ModelConfig(kind="gpt", hidden=512, layers=8, heads=8, seq=256, vocab=1024, batch=16)),
]


@pytest.mark.parametrize("hardware,model", CASES, ids=["cpu-mlp", "cpu-gpt", "h100-gpt"])
@pytest.mark.parametrize("name", schedules.names())
def test_heap_clock_equals_simpy_clock_bit_for_bit(name, hardware, model):
    p = 4
    sched = schedules.build(name, p, 8, None)
    setup = SimSetup(hardware=load_hardware(hardware), model=model, check_memory=False)
    costs = setup.costs(sched)
    fast = simulate(sched, costs, setup.hardware, clock=HeapClock)
    reference = simulate(sched, costs, setup.hardware, clock=SimpyClock)
    assert fast.to_dict() == reference.to_dict()
