"""Run torch.distributed.pipelining on 2 CPU ranks under torch.profiler; write one Chrome trace per rank.

Usage: python tests/workers/profiled_pipeline.py OUT_DIR SCHEDULE M STEPS
SCHEDULE is `1f1b` (torch's Schedule1F1B, profiled with_stack so its stage calls show), `gpipe`
(ScheduleGPipe: "Forward i"/"Backward i" ranges) or a CSV path (loaded into _PipelineScheduleRuntime,
which names every action "PP:<action>"). Ranks meet through a file store in OUT_DIR (no port);
gloo's timeout is 60 s so a broken run fails instead of hanging. Writes OUT_DIR/rank{r}.json.
"""

from __future__ import annotations

import os
import re
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
from torch.profiler import ProfilerActivity, profile

WORLD, HIDDEN, BATCH = 2, 16, 16


def _stages_of(rank: int, schedule: str) -> list[int]:
    """Stage indices this rank runs: its rank for the single-stage schedules, else those in its CSV row."""
    if schedule in ("1f1b", "gpipe"):
        return [rank]
    with open(schedule) as fh:
        rows = [line.strip().split(",") for line in fh if line.strip()]
    return sorted({int(s) for cell in rows[rank] for s in re.findall(r"(\d+)F\d+", cell)})


def _worker(rank: int, out_dir: str, schedule: str, m: int, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    mine = _stages_of(rank, schedule)
    num_stages = WORLD if schedule in ("1f1b", "gpipe") else WORLD * len(mine)
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()) for _ in range(num_stages)]
    stages = [PipelineStage(layers[s], s, num_stages, torch.device("cpu")) for s in mine]

    def loss_fn(output, target):
        return torch.nn.functional.mse_loss(output, target, reduction="sum")

    if schedule == "1f1b":
        sched = Schedule1F1B(stages[0], m, loss_fn=loss_fn)
    elif schedule == "gpipe":
        sched = ScheduleGPipe(stages[0], m, loss_fn=loss_fn)
    else:
        sched = _PipelineScheduleRuntime(stages, m, loss_fn=loss_fn)
        sched._load_csv(schedule, format="compute_only")
    x, y = torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)
    first, last = 0 in mine, num_stages - 1 in mine
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False, with_stack=schedule == "1f1b") as prof:
        for _ in range(steps):
            sched.step(x if first else None, target=y if last else None, losses=[] if last else None)
            dist.barrier()
    prof.export_chrome_trace(os.path.join(out_dir, f"rank{rank}.json"))
    dist.destroy_process_group()


def main() -> None:
    out_dir, schedule, m, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    mp.spawn(_worker, args=(out_dir, schedule, m, steps), nprocs=WORLD, join=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
