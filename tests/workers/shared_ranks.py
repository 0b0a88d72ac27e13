"""Under torchrun: one rank of tests/launch_shared.py's launch, running every case of CASES.json in order in one
gloo process group, each marked done (or failed, with the traceback) in its folder by every rank.

Usage: torchrun --standalone --nproc-per-node N -m tests.workers.shared_ranks CASES.json (from the repository
root). A case is a chain of `pipesim run` configurations (trained by executor.__main__.run_chain, as
`python -m executor` trains them) or a "module:function" called as function(folder, *args).
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from executor.__main__ import _exit_now, run_chain  # leave as `python -m executor` does
from executor.run_config import configs_from_json
from tests.launch_shared import BEGIN, END


def run_case(case: dict, rank: int, world: int) -> None:
    folder = Path(case["folder"])
    if case.get("configs") is not None:
        plan = [(cfg, cfg.check(world)) for cfg in configs_from_json(case["configs"])]
        if any(cfg.backend not in (None, "gloo") for cfg, _ in plan):  # the group is up already: gloo, on CPU
            raise ValueError(f"case {case['name']}: the shared launch runs gloo only")
        run_chain(plan, world, rank, torch.device("cpu"), "gloo")  # a failing schedule ends the rank (die)
    else:
        module, function = case["call"].split(":")
        getattr(importlib.import_module(module), function)(folder, *case["args"])


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=spec["pg_timeout"]))
    # what is alive now (torch and its modules, imported once) lives as long as the rank: the full collection
    # executor.api.free_runtimes runs after each training then walks only what the cases made since, the runtimes
    # it must free among them (0.1 to 0.3 s a collection otherwise on 2 loaded cores, 34 in tests/test_api.py's case)
    gc.freeze()
    rank, world = dist.get_rank(), dist.get_world_size()
    for case in spec["cases"]:
        folder = Path(case["folder"])
        if rank == 0:
            print(BEGIN + case["name"], file=sys.stderr, flush=True)
        try:
            run_case(case, rank, world)
        except BaseException:  # noqa: BLE001 - any failure is the case's; its peers then fail or time out
            (folder / f"failed.rank{rank}").write_text(traceback.format_exc())
            print(f"shared-launch: rank {rank} failed in case {case['name']}", file=sys.stderr, flush=True)
            _exit_now(1)
        (folder / f"done.rank{rank}").write_text("")
        if rank == 0:
            print(END + case["name"], file=sys.stderr, flush=True)
    dist.destroy_process_group()
    _exit_now(0)


if __name__ == "__main__":
    main()
