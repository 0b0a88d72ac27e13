"""Ranks beyond a host's cores taking turns in time slices: exact finish times of the scheduler model,
and what the simulator does with it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesim.hardware.toml_io import hardware_to_toml, load_hardware
from pipesim.sim.clock import Clock
from pipesim.sim.host.slices import HostTimeSlices
from tests.host_jobs import run_jobs


def _slices_run(cores: int, time_slice: float, oversub: float,
                jobs: list[tuple[int, float, float]]) -> tuple[dict[int, float], list]:
    """Finish time of each (rank, start, work) job under HostTimeSlices on one node, and first-core times."""
    clock = Clock()
    host = HostTimeSlices(clock, [0] * len(jobs), cores, 0.0, time_slice, oversub)
    return run_jobs(clock, host, jobs)


def test_three_ranks_on_two_cores_take_turns_in_slices():
    # 10 s of work each, 4 s slices. 0..4: ranks 0 and 1 run, 2 waits; at 4 both slices end and the
    # queue is [2, 0, 1]: 2 and 0 run; at 8: [1, 0, 2]: 1 and 0 run; rank 0 is done at 10 and 2 takes
    # its core; nobody waits from then on, so 1 (2 s left at 12) ends at 14 and 2 (6 s left at 10) at 16
    ends, first = _slices_run(2, 4.0, 0.0, [(0, 0.0, 10.0), (1, 0.0, 10.0), (2, 0.0, 10.0)])
    assert ends == {0: 10.0, 1: 14.0, 2: 16.0}
    assert first == {0: 0.0, 1: 0.0, 2: 4.0}  # rank 2 first had a core at 4
    # fluid sharing would end all three at 15: slices leave a core idle at the end, as the OS does


def test_slowdown_while_ranks_wait():
    # the same with 1/1.5 speed while anyone waits: up to 15 s the queue is never empty (0 done at
    # 12 + 2 / (2/3)); then 1 (4 2/3 s left) and 2 (5 1/3 s left) run at full speed
    ends, _ = _slices_run(2, 4.0, 0.5, [(0, 0.0, 10.0), (1, 0.0, 10.0), (2, 0.0, 10.0)])
    assert ends[0] == pytest.approx(15.0)
    assert ends[1] == pytest.approx(15.0 + 14 / 3) and ends[2] == pytest.approx(15.0 + 16 / 3)


def test_a_rank_alone_or_with_a_free_core_never_waits():
    ends, first = _slices_run(2, 0.5, 0.5, [(0, 0.0, 3.0), (1, 1.0, 1.0)])  # slices end, nobody waits
    assert ends == {0: 3.0, 1: 2.0} and first == {0: 0.0, 1: 1.0}


def _cpu(cores: int, time_slice: float):
    hw = load_hardware("local-cpu")
    return replace(hw, host=replace(hw.host, cores=cores, node_corun_slowdown=0.0, oversubscription_slowdown=0.0,
                                    time_slice=time_slice))


def test_simulator_with_slices_longer_than_any_action_runs_each_action_whole():
    """Slices longer than every action: nobody is preempted, a woken rank waits for a free core, so
    every action runs uninterrupted (end - start is its cost, from when it got a core) and never more
    than `cores` compute at once; the same input gives the same output."""
    import schedules
    from pipesim.cost.table import CostTable
    from pipesim.sim.simulator import simulate

    table = CostTable.uniform(4, 1.0, 1.0, 1.0)
    sched = schedules.build("1f1b", 4, 8)
    res = simulate(sched, table, _cpu(2, 100.0), comm=False)
    spans = []
    for rank, prog in enumerate(res.schedule.programs):
        for a, s, e in zip(prog, res.starts[rank], res.ends[rank], strict=True):
            if a.kind.value in ("F", "B"):
                assert e - s == pytest.approx(table.duration(a), abs=1e-12)
                spans.append((s, e))
    edges = sorted({t for s, e in spans for t in (s, e)})
    crowd = max(sum(1 for s, e in spans if s <= (a + b) / 2 < e) for a, b in zip(edges, edges[1:]))
    assert crowd == 2  # 4 ranks on 2 cores: two at a time, at full speed
    assert res.makespan >= 4 * 8 * 3.0 / 2  # all the work, on 2 cores
    free = simulate(sched, table, None, comm=False)
    assert res.makespan > free.makespan
    again = simulate(sched, table, _cpu(2, 100.0), comm=False)
    assert (again.starts, again.ends) == (res.starts, res.ends)


def test_with_a_core_per_rank_slices_change_nothing():
    import schedules
    from pipesim.cost.table import CostTable
    from pipesim.sim.simulator import simulate

    table = CostTable.uniform(2, 1.0, 1.0, 1.0)
    sched = schedules.build("1f1b", 2, 4)
    a = simulate(sched, table, _cpu(2, 0.003), comm=False)
    b = simulate(sched, table, _cpu(2, 0.0), comm=False)
    assert a.makespan == pytest.approx(b.makespan, abs=1e-12) == (4 + 2 - 1) * 3.0


def test_time_slice_round_trips_in_the_hardware_file(tmp_path):
    hw = _cpu(2, 0.004)
    path = tmp_path / "hw.toml"
    path.write_text(hardware_to_toml(hw))
    back = load_hardware(str(path))
    assert back.host.time_slice == 0.004 and back == hw
    path.write_text(hardware_to_toml(hw).replace("time_slice = 0.004", "time_slice = -1"))
    from pipesim.errors import PipesimError

    with pytest.raises(PipesimError, match=r"\[host\].time_slice must be a number >= 0"):
        load_hardware(str(path))
