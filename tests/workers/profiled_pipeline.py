"""Run torch.distributed.pipelining on 2 CPU ranks under torch.profiler; write one Chrome trace per rank.

Usage: python tests/workers/profiled_pipeline.py OUT_DIR M STEPS SCHEDULE [SCHEDULE ...]
(PROFILED_HIDDEN and PROFILED_BATCH in the environment size the model; default 256 and 32.)
Each SCHEDULE is `1f1b` (torch's Schedule1F1B, profiled with_stack so its stage calls show), `gpipe`
(ScheduleGPipe: "Forward i"/"Backward i" ranges) or a CSV path (loaded into _PipelineScheduleRuntime,
which names every action "PP:<action>"); they run one after the other, each under a profiler of its own,
in the same two processes (one start-up for all: tests/conftest.py's `profiled_traces`), and each writes
OUT_DIR/<1f1b|gpipe|the CSV's stem>/rank{r}.json. Ranks meet through a file store in OUT_DIR (no port);
gloo's timeout is 60 s so a broken run fails instead of hanging. The ranks are forked from a parent that
has already imported torch (not spawned: that would import it twice more).
"""

from __future__ import annotations

import os
import re
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
from torch.profiler import ProfilerActivity, profile

WORLD = 2


def sizes() -> tuple[int, int]:
    """(width of each stage's Linear, rows per step split into M microbatches), read when called: the
    factory below, loaded once per process, follows the environment of each call."""
    return int(os.environ.get("PROFILED_HIDDEN", "256")), int(os.environ.get("PROFILED_BATCH", "32"))


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output, target, reduction="sum")


def make() -> dict:
    """The 1f1b/gpipe run's model as a pipesim factory (`--model tests/workers/profiled_pipeline.py:make`): one
    Linear + ReLU per stage, the sum of squared errors; what `pipesim calibrate --from-trace` counts."""
    hidden, batch = sizes()
    layers = [torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU()) for _ in range(WORLD)]
    return {"layers": layers, "example_input": torch.randn(batch, hidden), "loss": _loss,
            "example_target": torch.randn(batch, hidden)}


def label(schedule: str) -> str:
    """The folder a schedule's traces go to: `1f1b`, `gpipe`, or the CSV file's stem."""
    return schedule if schedule in ("1f1b", "gpipe") else Path(schedule).stem


def _stages_of(rank: int, schedule: str) -> list[int]:
    """Stage indices this rank runs: its rank for the single-stage schedules, else those in its CSV row."""
    if schedule in ("1f1b", "gpipe"):
        return [rank]
    with open(schedule) as fh:
        rows = [line.strip().split(",") for line in fh if line.strip()]
    return sorted({int(s) for cell in rows[rank] for s in re.findall(r"(\d+)F\d+", cell)})


def _profile_one(rank: int, out_dir: str, schedule: str, m: int, steps: int) -> None:
    """One schedule's run under the profiler: fresh stages (seed 0), `steps` whole steps, rank{rank}.json."""
    hidden, batch = sizes()
    mine = _stages_of(rank, schedule)
    num_stages = WORLD if schedule in ("1f1b", "gpipe") else WORLD * len(mine)
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU()) for _ in range(num_stages)]
    stages = [PipelineStage(layers[s], s, num_stages, torch.device("cpu")) for s in mine]
    if schedule == "1f1b":
        sched = Schedule1F1B(stages[0], m, loss_fn=_loss)
    elif schedule == "gpipe":
        sched = ScheduleGPipe(stages[0], m, loss_fn=_loss)
    else:
        sched = _PipelineScheduleRuntime(stages, m, loss_fn=_loss)
        sched._load_csv(schedule, format="compute_only")
    x, y = torch.randn(batch, hidden), torch.randn(batch, hidden)
    first, last = 0 in mine, num_stages - 1 in mine
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False, with_stack=schedule == "1f1b") as prof:
        for _ in range(steps):
            sched.step(x if first else None, target=y if last else None, losses=[] if last else None)
            dist.barrier()
    folder = os.path.join(out_dir, label(schedule))
    os.makedirs(folder, exist_ok=True)
    prof.export_chrome_trace(os.path.join(folder, f"rank{rank}.json"))


def _worker(rank: int, out_dir: str, schedules: list[str], m: int, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    for schedule in schedules:
        _profile_one(rank, out_dir, schedule, m, steps)
        dist.barrier()  # the next schedule's messages never meet this one's
    dist.destroy_process_group()


def main() -> None:
    out_dir, m, steps, schedules = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    mp.start_processes(_worker, args=(out_dir, schedules, m, steps), nprocs=WORLD, join=True,
                       start_method="fork")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
