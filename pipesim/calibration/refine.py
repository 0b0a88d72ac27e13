"""Host figures refined on whole steps: the simulator run on a grid of values against the measured step times.

The compute fit (`pipesim.calibration.fit`) reads single actions; what two busy ranks cost each other
between their actions, and how ranks beyond the cores take turns, shows only over whole steps, so
these figures are chosen by simulating the fit runs (`simulate_run`) and comparing step times.
"""

from __future__ import annotations

from pipesim.calibration.plan import simulate_run
from pipesim.hardware.machine import Hardware


def _grid_best(hw: Hardware, field: str, top: float, runs: list[dict], measured: dict[str, float],
               steps: int) -> Hardware:
    """`hw` with `field` set to the grid value in [0, top] that best explains the runs' step times."""
    best = (float("inf"), hw)
    for i in range(steps + 1):
        cand = hw.with_host(**{field: top * i / steps})
        err = sum(abs(simulate_run(cand, r).makespan / measured[r["id"]] - 1) for r in runs) / len(runs)
        if err < best[0]:
            best = (err, cand)
    return best[1]


def _fair(hw: Hardware, runs: list[dict]) -> list[dict]:
    """The runs in which every rank has a core (all runs when there are none such)."""
    cores = hw.host.cores if hw.host is not None else 10**9
    return [r for r in runs if r["p"] <= cores] or runs


def refine_corun(hw: Hardware, runs: list[dict], measured: dict[str, float], steps: int = 50) -> Hardware:
    """The co-run slowdown (per other runnable rank) that best explains the fit runs' step times, on a grid.

    Per action it is hard to see under the noise (a 20 % spread between repeats of one action); over
    whole steps, where ranks overlap for most of the time, it is the main term after the rates, and
    it also carries what two busy ranks cost each other between their actions (isend posting, gloo's
    threads, the executor's loop). The per-action overhead is not refined so: seen directly on the
    actions, it is better determined there, and on step times it trades off against this one (it
    reached 350 us in one campaign, doubling on interleaved schedules' twice as many actions).
    Runs with more ranks than cores are left to `refine_time_slice`.
    """
    return _grid_best(hw, "node_corun_slowdown", 0.5, _fair(hw, runs), measured, steps)


def refine_oversubscription(hw: Hardware, runs: list[dict], measured: dict[str, float],
                            steps: int = 50) -> Hardware:
    """The `oversubscription_slowdown` that best explains the step times of the fit runs with more ranks
    than cores (unchanged when there are none): turn-taking costs more than the cores' share (switches,
    caches, the waiting ranks' threads), and whole steps show it where single actions, preempted at
    random, do not. With time slices it applies while any rank waits (`pipesim.sim.host.slices`)."""
    over = [r for r in runs if hw.host is not None and r["p"] > hw.host.cores]
    return _grid_best(hw, "oversubscription_slowdown", 1.0, over, measured, steps) if over else hw


def refine_time_slice(hw: Hardware, runs: list[dict], measured: dict[str, float], bubbles: dict[str, float],
                      slices: int = 16) -> Hardware:
    """Time slices for the fit runs with more ranks than cores (unchanged when there are none): for each
    slice on a grid (0.5 to 8 ms), the slowdown while ranks wait that best explains their step times;
    of those pairs, the one whose bubble is closest to the measured one.

    The slice decides where turn-taking shows (a woken rank waiting for a core, a preempted action:
    waits against compute, so the bubble); the slowdown, how much work it costs (the step time). The
    late-RECV surcharge of crowded runs goes: the wake-ups queueing for a core are now simulated.
    """
    over = [r for r in runs if hw.host is not None and r["p"] > hw.host.cores]
    if not over:
        return hw
    best = (float("inf"), hw)
    for i in range(1, slices + 1):
        cand = refine_oversubscription(hw.with_host(time_slice=0.5e-3 * i),
                                       runs, measured)
        err = 0.0
        for r in over:
            res = simulate_run(cand, r)
            err += abs(res.makespan / measured[r["id"]] - 1) + abs(res.bubble_fraction - bubbles[r["id"]])
        if err < best[0]:
            best = (err, cand)
    return best[1]


__all__ = ["refine_corun", "refine_oversubscription", "refine_time_slice"]
