"""Shared by the host-model tests: run (rank, start, work) jobs on a host model and read each rank's finish time
and the time it first got a core."""

from __future__ import annotations

from pipesim.sim.clock import Clock


def run_jobs(clock: Clock, host, jobs: list[tuple[int, float, float]]) -> tuple[dict[int, float], dict[int, float]]:
    """Start each job at its time on `host` (built on `clock`), run the clock dry: (finish, first core) per rank."""
    ends: dict[int, float] = {}
    first: dict[int, float] = {}

    def done(rank: int) -> None:
        ends[rank], first[rank] = clock.now, host.started[rank]

    for rank, start, work in jobs:
        clock.at(start, lambda r=rank, w=work: host.start(r, w, lambda: done(r)))
    clock.run()
    return ends, first
