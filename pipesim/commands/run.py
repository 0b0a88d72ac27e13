"""`pipesim run`: execute a schedule for real under torchrun (gloo on CPU, NCCL on GPUs).

Configuration errors (grid arithmetic, layers < stages, m not admitted) exit 2 before launching.
The ranks get the checked configurations as one JSON argument (`python -m executor --config JSON`).
"""

from __future__ import annotations

import argparse

from executor.config import configs_to_json
from executor.launch import launch
from pipesim.commands.common import positive_int
from pipesim.commands.run_args import add_run_args, configs_from_args
from pipesim.errors import PipesimError

EXAMPLES = """examples:
  pipesim run 1f1b --nproc 2 --microbatches 8 --model mlp --hidden 1024 --layers 8 --batch 64 --steps 4 \\
      --trace measured.json --json measured-result.json
  pipesim run zb-h1 --nproc 4 --microbatches 8 --model gpt --layers 8 --steps 3
  pipesim run interleaved-1f1b --nproc 2 --virtual 2 --microbatches 4 --layers 8
  pipesim run 1f1b --nproc 4 --dp 2 --microbatches 4      # dp(2) x pp(2)
  pipesim run gpipe --nproc 4 --tp 2 --microbatches 4     # pp(2) x tp(2)
  pipesim run --from-csv my_schedule.csv --nproc 2 --microbatches 4
  pipesim run 1f1b --nproc 4 --dp 2 --then gpipe --tp 2   # two grids, one torchrun start-up
multi-node: run the same command on every node, e.g. `pipesim run NAME --nproc 8 --nnodes 2
  --rdzv-endpoint HOST:29500 ...` (torchrun's c10d rendezvous); or write the configuration with
  --print-config > run.json and start `torchrun ... -m executor --config run.json` yourself;
  see docs/executor.md.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="train a schedule for real under torchrun", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=positive_int, required=True, help="processes (ranks) on this node")
    launch_group = p.add_argument_group("launch")
    launch_group.add_argument("--nnodes", type=positive_int, default=1,
                              help="nodes, each running this command with the same --nproc (default 1)")
    launch_group.add_argument("--rdzv-endpoint", metavar="HOST:PORT", default=None,
                              help="torchrun's c10d rendezvous (needed with --nnodes > 1; default: --standalone)")
    launch_group.add_argument("--print-config", action="store_true",
                              help="print the checked configuration (JSON for `python -m executor --config`) "
                                   "instead of launching")
    add_run_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.nnodes > 1 and args.rdzv_endpoint is None:
        raise PipesimError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (a node every node can reach)")
    cfgs = configs_from_args(args)
    world = args.nproc * args.nnodes
    for cfg in cfgs:
        cfg.check(world)  # PipesimError -> one line, exit 2, nothing launched
    if args.print_config:
        print(configs_to_json(cfgs))
        return 0
    return launch(cfgs, args.nproc, nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint)
