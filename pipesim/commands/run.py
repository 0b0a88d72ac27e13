"""`pipesim run`: execute a schedule for real under torchrun (gloo on CPU, NCCL on GPUs).

Configuration errors (grid arithmetic, layers < stages, m not admitted) exit 2 before launching.
"""

from __future__ import annotations

import argparse

from pipesim.commands.common import positive_int

EXAMPLES = """examples:
  pipesim run 1f1b --nproc 2 --microbatches 8 --model mlp --hidden 1024 --layers 8 --batch 64 --steps 4 \\
      --trace measured.json --json measured-result.json
  pipesim run zb-h1 --nproc 4 --microbatches 8 --model gpt --layers 8 --steps 3
  pipesim run interleaved-1f1b --nproc 2 --virtual 2 --microbatches 4 --layers 8
  pipesim run 1f1b --nproc 4 --dp 2 --microbatches 4      # dp(2) x pp(2)
  pipesim run gpipe --nproc 4 --tp 2 --microbatches 4     # pp(2) x tp(2)
  pipesim run --from-csv my_schedule.csv --nproc 2 --microbatches 4
  pipesim run 1f1b --nproc 4 --dp 2 --then gpipe --tp 2   # two grids, one torchrun start-up
multi-node: run `torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500
  -m executor NAME ...` on every node (same flags as here, without --nproc); see docs/executor.md.
"""


def add_parser(sub) -> None:
    from executor.config import add_run_args

    p = sub.add_parser("run", help="train a schedule for real under torchrun", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=positive_int, required=True, help="processes (ranks) on this node")
    add_run_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from executor.config import configs_from_args
    from executor.launch import launch

    cfgs = configs_from_args(args)
    for cfg in cfgs:
        cfg.check(args.nproc)  # PipesimError -> one line, exit 2, nothing launched
    return launch(cfgs, args.nproc)
