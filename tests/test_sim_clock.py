"""The simulator's SimPy clock: exact absolute times, posting order on ties; and the kernel's results pinned bit
for bit to the ones recorded before the kernel moved onto SimPy (tests/data/sim_golden.json)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import schedules
from pipesim.comm.comm_options import CommOptions
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.clock import Clock
from pipesim.sim.sim_setup import SimSetup

GOLDEN = json.loads((Path(__file__).parent / "data" / "sim_golden.json").read_text())


def test_clock_runs_at_absolute_times_in_posting_order():
    clock, seen = Clock(), []
    clock.at(1.1, lambda: clock.at(7.7, lambda: seen.append(("abs", clock.now))))
    clock.at(1.1, lambda: seen.append(("second at 1.1", clock.now)))
    clock.at(0.5, lambda: clock.after(7.25, lambda: seen.append(("rel", clock.now))))
    assert clock.next_time() == 0.5
    clock.run()
    # exact: 7.7, not 1.1 + (7.7 - 1.1) = 7.699999999999999, the time SimPy itself keeps for that event
    assert seen == [("second at 1.1", 1.1), ("abs", 7.7), ("rel", 7.75)]
    assert 1.1 + (7.7 - 1.1) != 7.7 and clock.next_time() == float("inf")


H100_GPT = ModelConfig(kind="gpt", hidden=512, layers=8, heads=8, seq=256, vocab=1024, batch=16)
# tp 2 with sequence parallelism (TP collectives and the GEMMs that hide them), ZeRO 1 over dp 2 with bucketed
# gradient reduction and the overlapped parameter gather, Megatron-core's held / interleaved-overlapped sends
MEGATRON_CORE = Job(ParallelDims(tp=2, dp=2), sp=True, zero=1,
                    comm=CommOptions(overlap_grad_reduce=True, ddp_bucket_size=2_000_000, blocking_p2p=True,
                                     overlap_p2p_comm=True, overlap_param_gather=True))
CASES = {  # the CPU host plug-ins (time slices at 4 ranks on 2 cores) and a GPU preset, plain and Megatron-core's
    "cpu-mlp": ("local-cpu", ModelConfig(kind="mlp", hidden=256, layers=8, batch=16), Job()),
    "cpu-gpt": ("local-cpu", ModelConfig(kind="gpt", hidden=64, layers=8, heads=4, seq=32, vocab=128, batch=8), Job()),
    "h100-gpt": ("dgx-h100", H100_GPT, Job()),
    "h100-gpt-tp2-dp2": ("2x-dgx-h100", H100_GPT, MEGATRON_CORE),  # recorded 2026-12-05 (issue 33's mechanisms)
}


def test_the_golden_file_covers_every_schedule_and_case():
    assert sorted(GOLDEN) == sorted(f"{n}/{c}" for n in schedules.names() for c in CASES)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", schedules.names())
def test_results_equal_the_recorded_ones_bit_for_bit(name, case):
    """Recorded with the hand-written heap clock the kernel ran on before SimPy became its engine (2026-12-05);
    a change of the model that moves a number on purpose re-records them (and says so in its commit)."""
    hardware, model, job = CASES[case]
    sched = schedules.build(name, 4, 8, None)
    setup = SimSetup(hardware=load_hardware(hardware), model=model, job=job, check_memory=False)
    result = setup.simulate(sched, setup.costs(sched))
    digest = hashlib.sha256(json.dumps(result.to_dict(), sort_keys=True).encode()).hexdigest()
    assert digest == GOLDEN[f"{name}/{case}"]
