"""torchrun worker: load a pipesim-exported CSV into torch.distributed.pipelining's runtime and step.

Usage: torchrun --nproc-per-node 2 tests/workers/torch_runtime_csv.py CSV STAGES_PER_RANK M OUT_JSON
       torchrun --nproc-per-node 2 tests/workers/torch_runtime_csv.py --cases CASES_JSON OUT_JSON
Rank 0 writes the summed losses and the reference loss of the unsplit model to OUT_JSON; with --cases
(a list of {"csv", "per_rank", "m"}) one such result per case, in order, from one process group.
`exported_on_rank` is the same as a case of tests/launch_shared.py's shared launch.
"""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

import schedules
from pipesim.ir import torch_csv

HIDDEN, BATCH = 8, 8


def main() -> None:
    if sys.argv[1] == "--cases":
        with open(sys.argv[2]) as fh:
            cases = json.load(fh)
        out = sys.argv[3]
    else:
        cases = [{"csv": sys.argv[1], "per_rank": int(sys.argv[2]), "m": int(sys.argv[3])}]
        out = sys.argv[4]
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    results = [run_case(c["csv"], c["per_rank"], c["m"]) for c in cases]
    if dist.get_rank() == 0:
        with open(out, "w") as fh:
            json.dump(results if sys.argv[1] == "--cases" else results[0], fh)
    dist.destroy_process_group()


def exported_on_rank(folder, exported: list, m: int) -> None:
    """A case of tests/launch_shared.py's 2-rank launch: each (name, stages per rank) schedule exported to a CSV by
    rank 0 (torch_csv.dump), stepped in torch's runtime on every rank; rank 0 writes the results to out.json."""
    folder = Path(folder)
    if dist.get_rank() == 0:
        for name, per_rank in exported:
            torch_csv.dump(schedules.build(name, dist.get_world_size(), m, per_rank), folder / f"{name}.csv")
    dist.barrier()
    results = [run_case(str(folder / f"{name}.csv"), per_rank, m) for name, per_rank in exported]
    if dist.get_rank() == 0:
        (folder / "out.json").write_text(json.dumps(dict(zip((n for n, _ in exported), results, strict=True))))


def run_case(csv_path: str, per_rank: int, m: int) -> dict:
    """One schedule's step in torch's runtime: the summed losses, and (rank 0) the unsplit model's loss."""
    rank, world = dist.get_rank(), dist.get_world_size()
    num_stages = world * per_rank
    torch.manual_seed(0)
    layers = [torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(num_stages)]
    x, y = torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)
    with open(csv_path) as fh:
        rows = [line.strip().split(",") for line in fh if line.strip()]
    # the stages this rank runs forwards of: `0F3`, also inside `(0F3;3B1)OVERLAP_F_B`, not `0SEND_F1`
    my_stages = sorted({int(stage) for cell in rows[rank] for stage in re.findall(r"(\d+)F\d+", cell)})
    stages = [PipelineStage(layers[s], s, num_stages, torch.device("cpu")) for s in my_stages]

    def loss_fn(output, target):
        return torch.nn.functional.mse_loss(output, target, reduction="sum")

    sched = _PipelineScheduleRuntime(stages, m, loss_fn=loss_fn)
    sched._load_csv(csv_path, format="compute_only")
    losses: list[torch.Tensor] = []
    has_first = 0 in my_stages
    has_last = num_stages - 1 in my_stages
    sched.step(x if has_first else None, target=y if has_last else None, losses=losses)
    total = torch.tensor([float(sum(loss.item() for loss in losses))])
    dist.all_reduce(total)
    ref = x
    for layer in layers:
        ref = layer(ref)
    expected = float(torch.nn.functional.mse_loss(ref, y, reduction="sum"))
    return {"loss_sum": float(total), "expected": expected, "world": world}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
