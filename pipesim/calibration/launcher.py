"""Launching measurement campaigns: torchrun over a plan, repeated, and reading the timelines back.

The worker that runs inside torchrun is `pipesim.calibration.runs`; this side plans the launches
(world sizes interleaved, several launches, several passes inside each, because a shared VM's
speed drifts within minutes), retries gloo's teardown abort once, and loads what the ranks wrote.
`pipesim calibrate` and `pipesim validate` both measure through it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from executor.launch import rank_environment
from executor.supervisor import LaunchInterrupted, supervise
from pipesim.calibration.reused import checked_comm, checked_timeline
from pipesim.calibration.runs import timeline_name  # the worker's module, torch-free at import
from pipesim.errors import PipesimError
from pipesim.timeline import Timeline, read_json

ROUNDS, CYCLES = 3, 4  # torchrun launches per world size, and passes over the plan in each (see measure_rounds)


def run_plan(runs: list[dict], nproc: int, workdir: Path, *, comm: bool = False, cycles: int = 1,
             timeout: float = 900.0) -> tuple[dict[str, list[Timeline]], dict | None]:
    """Run `runs` `cycles` times over under one torchrun with `nproc` ranks; returns each run's measured
    timelines (one per cycle) by id, and the comm figures."""
    workdir.mkdir(parents=True, exist_ok=True)
    plan = workdir / f"plan-{nproc}.json"
    plan.write_text(json.dumps({"runs": runs, "comm": comm, "cycles": cycles}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "pipesim.calibration.runs", str(plan), str(workdir)]
    env = rank_environment({**os.environ, "OMP_NUM_THREADS": "1"})  # the environment `pipesim run` gives ranks
    log = workdir / f"torchrun-{nproc}.log"
    for attempt in (1, 2):  # a gloo teardown abort on a loaded host is retried once; the log keeps both
        with log.open("a") as fh:
            fh.write(f"--- attempt {attempt}\n")
        start = log.stat().st_size
        # supervised: Ctrl-C or SIGTERM stops every rank (LaunchInterrupted), all output goes to the log
        outcome = supervise(cmd, env, log, echo=False, stdout_to_log=True, timeout=timeout)
        with log.open("a") as fh:
            fh.write(f"--- attempt {attempt}: exit {outcome.code}\n")
        if outcome.signum is not None:
            raise LaunchInterrupted(outcome)
        if outcome.code == 0 or b"Signal 6" not in log.read_bytes()[start:]:
            break
    if outcome.code == 124:
        raise PipesimError(f"measurement runs on {nproc} ranks did not finish within {timeout:.0f} s (output: {log})")
    if outcome.code:
        raise PipesimError(f"measurement runs on {nproc} ranks failed: {outcome.line}")
    return load_runs(runs, workdir, comm=comm)


def measure_rounds(runs: list[dict], workdir: Path, rounds: int, *, cycles: int = 1, reuse: bool = False,
                   say=None) -> tuple[dict[str, list[Timeline]], dict | None]:
    """Every run `rounds` x `cycles` times: `rounds` torchrun launches per world size (world sizes
    interleaved), each cycling `cycles` times through its runs, so that every configuration samples
    the machine at many moments spread over the campaign; returns all timelines per run id, and the
    comm figures of the first round.
    """
    got_all: dict[str, list[Timeline]] = {}
    comm = None
    for rnd in range(rounds):
        for nproc in sorted({r["p"] for r in runs}):
            group = [r for r in runs if r["p"] == nproc]
            where = workdir / f"round{rnd}" / f"p{nproc}"
            if reuse:
                got, c = load_runs(group, where, comm=nproc == 2)
            else:
                if say:
                    say(f"measuring {len(group)} runs on {nproc} ranks (round {rnd + 1} of {rounds}) ...")
                got, c = run_plan(group, nproc, where, comm=nproc == 2, cycles=cycles)
            comm = comm or c
            for key, tls in got.items():
                got_all.setdefault(key, []).extend(tls)
    return got_all, comm


def load_runs(runs: list[dict], workdir: Path, *,
              comm: bool = False) -> tuple[dict[str, list[Timeline]], dict | None]:
    """The timelines (every cycle's) and comm figures that `run_plan` left in `workdir`; PipesimError if
    one is missing."""
    missing = [r["id"] for r in runs if not (workdir / f"{r['id']}.json").is_file()]
    if missing or (comm and not (workdir / "comm.json").is_file()):
        raise PipesimError(f"{workdir}: no measurement for {', '.join(missing) or 'comm.json'}")
    timelines = {}
    for r in runs:
        cycle, found = 0, []
        while (path := workdir / timeline_name(r["id"], cycle)).is_file():
            found.append(checked_timeline(Timeline.read(path), r, path))
            cycle += 1
        timelines[r["id"]] = found
    comm_data = checked_comm(read_json(workdir / "comm.json"), workdir / "comm.json") if comm else None
    return timelines, comm_data


__all__ = ["CYCLES", "ROUNDS", "load_runs", "measure_rounds", "run_plan"]
