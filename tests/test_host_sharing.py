"""Ranks sharing a host's cores: the speed rule, the runnable profile read off timelines, and processor
sharing in the simulator, as exact closed forms and event times."""

from __future__ import annotations

import pytest

from pipesim.hardware.toml_io import load_hardware
from pipesim.sim.clock import Clock
from pipesim.sim.host.sharing import HostSharing, runnable_profile, speed


def test_speed_and_runnable_profile_closed_forms():
    assert speed(1, 2, 0.1) == 1.0 and speed(0, 2, 0.1) == 1.0
    assert speed(2, 2, 0.1) == pytest.approx(1 / 1.1)  # a core each, shared memory
    assert speed(4, 2, 0.1) == pytest.approx(0.5 / 1.1)  # 4 runnable on 2 cores take turns
    assert speed(4, 2, 0.0, 0.25) == pytest.approx(0.5 / 1.5)  # and pay 0.25 per runnable rank beyond the cores
    assert speed(3, 2, 0.0) == pytest.approx(2 / 3)
    busy = [[(0.0, 1.0), (2.0, 4.0)], [(0.5, 3.0)]]
    assert runnable_profile([(0.0, 4.0), (5.0, 6.0)], busy, 3) == [[0.0, 2.5, 1.5], [1.0, 0.0, 0.0]]
    assert runnable_profile([(0.0, 4.0)], busy, 2) == [[0.0, 4.0]]  # counts above max_count are clipped


def _sharing_run(cores: int, corun: float, oversub: float, jobs: list[tuple[int, float, float]]) -> dict[int, float]:
    """Finish time of each (rank, start, work) job under HostSharing on one node."""
    clock = Clock()
    host = HostSharing(clock, [0] * len(jobs), cores, corun, oversub)
    ends: dict[int, float] = {}
    for rank, start, work in jobs:
        clock.at(start, lambda r=rank, w=work: host.start(r, w, lambda: ends.__setitem__(r, clock.now)))
    clock.run()
    return ends


def test_host_sharing_retimes_running_work_when_ranks_start_and_stop():
    # one core: rank 0 alone for 0.5 s (1.5 s of work left), then both at half speed until rank 1's 1 s
    # of work is done at 2.5, then rank 0's last 0.5 s alone
    assert _sharing_run(1, 0.0, 0.0, [(0, 0.0, 2.0), (1, 0.5, 1.0)]) == {1: 2.5, 0: 3.0}
    # two cores, co-run 0.25: both at 0.8 from 0.5; rank 1 done at 0.5 + 1 / 0.8, rank 0 then has 0.5 left
    ends = _sharing_run(2, 0.25, 0.0, [(0, 0.0, 2.0), (1, 0.5, 1.0)])
    assert ends[1] == pytest.approx(1.75) and ends[0] == pytest.approx(2.25)
    # three ranks on two cores with 0.5 per rank beyond: 2/3 / 1.5 speed each while all three run
    ends = _sharing_run(2, 0.0, 0.5, [(0, 0.0, 1.0), (1, 0.0, 1.0), (2, 0.0, 1.0)])
    assert ends == {0: pytest.approx(2.25), 1: pytest.approx(2.25), 2: pytest.approx(2.25)}


def cpu_hardware(cores: int, corun: float):
    """local-cpu with `cores` host cores and co-run slowdown `corun`, fluid sharing, no turn-taking penalty."""
    from dataclasses import replace

    hw = load_hardware("local-cpu")
    return replace(hw, host=replace(hw.host, cores=cores, node_corun_slowdown=corun, oversubscription_slowdown=0.0,
                                    time_slice=0.0))


def test_simulator_host_sharing():
    import schedules
    from pipesim.cost.table import CostTable
    from pipesim.sim.simulator import simulate

    table = CostTable.uniform(2, 1.0, 1.0, 1.0)
    naive = schedules.build("naive", 2, 1)
    # no two ranks ever compute at once: sharing changes nothing, the closed form m * p * (F + B) holds
    assert simulate(naive, table, cpu_hardware(1, 0.5), comm=False).makespan == 6.0
    one = schedules.build("1f1b", 2, 4)
    free = simulate(one, table, None, comm=False).makespan
    assert free == (4 + 2 - 1) * 3.0
    assert simulate(one, table, cpu_hardware(2, 0.0), comm=False).makespan == free  # a core each, no co-run cost
    shared = simulate(one, table, cpu_hardware(1, 0.0), comm=False)
    corun = simulate(one, table, cpu_hardware(2, 0.25), comm=False)
    assert free < corun.makespan and free < shared.makespan
    # one core, processor sharing: both ranks runnable -> each at half speed, re-timed whenever one
    # starts or stops (0F1 and 1F0 share 1..3; 0B0 runs 1 unit beside 1F1, then 1 beside 1B1, ...)
    assert shared.makespan == 24.0  # = all 2 x 4 x (F + B) of work; the core is never idle
    rank0 = [(str(a), s, e) for a, s, e in zip(shared.schedule.programs[0], shared.starts[0], shared.ends[0])
             if a.kind.value in ("F", "B")]
    assert rank0 == [("0F0", 0.0, 1.0), ("0F1", 1.0, 3.0), ("0B0", 5.0, 9.0), ("0F2", 9.0, 11.0),
                     ("0B1", 11.0, 15.0), ("0F3", 15.0, 17.0), ("0B2", 17.0, 21.0), ("0B3", 22.0, 24.0)]
    again = simulate(one, table, cpu_hardware(1, 0.0), comm=False)
    assert again.starts == shared.starts and again.ends == shared.ends  # deterministic
