"""The other replicas' ranks on a CPU host's cores (pipesim.sim.host.copies): exact finish times of the copies
under both host models, and the simulator's steps with dp > 1 on uniform costs as closed forms."""

from __future__ import annotations

from dataclasses import replace

import pytest

import schedules
from pipesim.cost.model_costs import ParallelCosts
from pipesim.cost.table import CostTable
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.clock import Clock
from pipesim.sim.host.copies import HostCopies, expand
from pipesim.sim.host.sharing import HostSharing
from pipesim.sim.host.slices import HostTimeSlices
from pipesim.sim.simulator import simulate
from tests.host_jobs import run_jobs


def _copies_run(inner_kind: str, copies: int, cores: int, corun: float, oversub: float,
                jobs: list[tuple[int, float, float]], time_slice: float = 0.0) -> tuple[dict[int, float], dict]:
    """Finish time and first-core time of each (pipeline rank, start, work) job, every rank with `copies` copies
    on one node."""
    ranks = 1 + max(r for r, _, _ in jobs)
    nodes, ids = expand([[0] * copies for _ in range(ranks)])
    clock = Clock()
    inner = (HostSharing(clock, nodes, cores, corun, oversub) if inner_kind == "fluid"
             else HostTimeSlices(clock, nodes, cores, corun, time_slice, oversub))
    host = HostCopies(inner, ids)
    return run_jobs(clock, host, jobs)


def test_expand_numbers_each_ranks_copies_after_the_previous_ones():
    assert expand([[0, 0], [0, 1], [1]]) == ([0, 0, 0, 1, 1], [[0, 1], [2, 3], [4]])


def test_fluid_sharing_counts_every_copy():
    c, o = 0.25, 0.5
    # one pipeline rank, 2 copies (dp 2) on 2 cores: a core each, the co-run slowdown of one other: 1 + c
    ends, first = _copies_run("fluid", 2, 2, c, o, [(0, 0.0, 1.0)])
    assert ends == {0: pytest.approx(1 + c)} and first == {0: 0.0}
    # two pipeline ranks x 2 copies = 4 on 2 cores: each at (2 / 4) / ((1 + c)(1 + 2 o))
    ends, _ = _copies_run("fluid", 2, 2, c, o, [(0, 0.0, 1.0), (1, 0.0, 1.0)])
    assert ends == {0: pytest.approx(2 * (1 + c) * (1 + 2 * o)), 1: pytest.approx(2 * (1 + c) * (1 + 2 * o))}
    # with a core per copy and no co-run cost, copies change nothing
    assert _copies_run("fluid", 2, 4, 0.0, o, [(0, 0.0, 1.0), (1, 0.0, 1.0)])[0] == {0: 1.0, 1: 1.0}


def test_time_slices_queue_the_copies_and_wait_for_the_last():
    o = 0.5
    # 2 copies on 1 core, slices longer than the work: the drawn copy runs first, slower by o while the other
    # waits (w (1 + o)), then the other alone (w): the rank is done at w (2 + o); it started at 0
    ends, first = _copies_run("slices", 2, 1, 0.0, o, [(0, 0.0, 2.0)], time_slice=10.0)
    assert ends == {0: pytest.approx(2.0 * (2 + o))} and first == {0: 0.0}
    # slices of 1 s: the copies alternate at 1 + o per slice while one waits; both done at 4 s of work...
    ends, _ = _copies_run("slices", 2, 1, 0.0, 0.0, [(0, 0.0, 2.0)], time_slice=1.0)
    assert ends == {0: pytest.approx(4.0)}  # ...the last copy's end, not the drawn one's (3.0)


def _cpu(cores: int, corun: float, time_slice: float = 0.0, oversub: float = 0.0):
    hw = load_hardware("local-cpu")
    return replace(hw, host=replace(hw.host, cores=cores, node_corun_slowdown=corun, oversubscription_slowdown=oversub,
                                    time_slice=time_slice))


def _dp(sched, dp: int, tp: int = 1) -> ParallelCosts:
    n = sched.num_stages
    return ParallelCosts(CostTable.uniform(n, 1.0, 1.0, 1.0), Job(ParallelDims(pp=sched.num_ranks, dp=dp, tp=tp)),
                         tp_collectives={}, dp_grad_bytes=(0,) * n, layers_per_stage=(0,) * n)


def test_simulated_step_with_data_parallel_replicas_on_the_host():
    naive = schedules.build("naive", 2, 1)  # one pipeline rank computes at a time: m p (F + B) = 6 of work
    c, o = 0.25, 0.5
    assert simulate(naive, _dp(naive, 1), _cpu(2, c), comm=False).makespan == 6.0  # alone on its core
    # dp 2: each action's two copies share the 2 cores, both paying the co-run slowdown
    assert simulate(naive, _dp(naive, 2), _cpu(2, c), comm=False).makespan == pytest.approx(6 * (1 + c))
    # tensor-parallel shards are copies too: tp 2 is dp 2 here, and dp 2 x tp 2 puts 4 processes on the 2 cores
    assert simulate(naive, _dp(naive, 1, 2), _cpu(2, c), comm=False).makespan == pytest.approx(6 * (1 + c))
    eight = replace(_cpu(2, c, 0.0, o), devices_per_node=8)  # the 8 processes of dp 2 x tp 2 x pp 2 on one host
    assert simulate(naive, _dp(naive, 2, 2), eight, comm=False).makespan == pytest.approx(
        6 * 2 * (1 + c) * (1 + 2 * o))  # fluid: each of 4 at (2 / 4) / ((1 + c)(1 + 2 o))
    # one core: the two copies take turns in slices longer than any action: w (1 + o) then w, per action
    assert simulate(naive, _dp(naive, 2), _cpu(1, 0.0, 10.0, o), comm=False).makespan == pytest.approx(6 * (2 + o))
    # 1F1B p 2, dp 2 on 2 cores (fluid, no co-run cost): k runnable pipeline ranks are 2k processes at 1 / k
    # each, exactly the dp 1 pipeline on 1 core (tests/test_host_sharing.py: 24 = all the work, never idle)
    one = schedules.build("1f1b", 2, 4)
    two = simulate(one, _dp(one, 2), _cpu(2, 0.0), comm=False)
    alone = simulate(one, _dp(one, 1), _cpu(1, 0.0), comm=False)
    assert two.makespan == 24.0 and two.starts == alone.starts and two.ends == alone.ends
    # a core per process: dp changes nothing
    assert simulate(one, _dp(one, 2), _cpu(4, 0.0), comm=False).makespan == (4 + 2 - 1) * 3.0
