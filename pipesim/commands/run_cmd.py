"""`pipesim run`: execute a schedule for real under torchrun (gloo on CPU, NCCL on GPUs).

Configuration errors (grid arithmetic, layers < stages, m not admitted) exit 2 before launching.
The ranks get the checked configurations as one JSON argument (`python -m executor --config JSON`).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from executor.launch import launch
from executor.run_config import RunConfig, configs_to_json
from pipesim.commands.arg_types import positive_int
from pipesim.commands.run_args import add_run_args, configs_from_args
from pipesim.commands.run_memory import check_host_memory
from pipesim.commands.run_orders import check_order_flags, searched_orders
from pipesim.commands.setup_args import ilp_seconds
from pipesim.errors import PipesimError
from pipesim.outputs import check_distinct, check_file, check_folder

MAX_PG_TIMEOUT = 86400.0  # seconds: a day; longer is a typo (a hung rank would hold the job that long)

EXAMPLES = """examples:
  pipesim run 1f1b --nproc 2 --microbatches 8 --model mlp --hidden 1024 --layers 8 --batch 64 --steps 4 \\
      --trace measured.json --json measured-result.json
  pipesim run zb-h1 --nproc 4 --microbatches 8 --model gpt --layers 8 --steps 3
  pipesim run interleaved-1f1b --nproc 2 --virtual 2 --microbatches 4 --layers 8
  pipesim run 1f1b --nproc 4 --dp 2 --microbatches 4      # dp(2) x pp(2)
  pipesim run gpipe --nproc 4 --tp 2 --microbatches 4     # pp(2) x tp(2)
  pipesim run --from-csv my_schedule.csv --nproc 2    # its ranks and microbatches from the file
  pipesim run 1f1b --nproc 2 --model examples/conv_net.py:make --layer-split 5,3   # your own model
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
    launch_group.add_argument("--verbose", action="store_true",
                              help="show torchrun's own output (banner, tracebacks) too; by default it goes to a "
                                   "log file that a failure's line names")
    launch_group.add_argument("--print-config", action="store_true",
                              help="print the checked configuration (JSON for `python -m executor --config`) "
                                   "instead of launching")
    add_run_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.nnodes > 1 and args.rdzv_endpoint is None:
        raise PipesimError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (a node every node can reach)")
    world = args.nproc * args.nnodes
    cfgs = configs_from_args(args)
    check_order_flags(cfgs, args.hardware, ilp_seconds(args))
    cfgs = [searched_orders(cfg, world, args.hardware, ilp_seconds(args)) for cfg in cfgs]
    for cfg in cfgs:
        check_numbers(cfg, world)
        built = cfg.check(world)  # PipesimError -> one line, exit 2, nothing launched
        if cfg.factory:  # the factory is called and its stages shape-inferred here, before any process starts
            from executor.user_model import check_run  # local import: torch only with --model MODULE:FACTORY

            check_run(cfg, [sched.model_stages for sched in built])
        check_host_memory(cfg, world, args.nproc)  # weights that cannot fit here, refused before any rank starts
    check_outputs(cfgs)  # before torchrun: a result that cannot be written is known now, not after training
    if args.print_config:
        print(configs_to_json(cfgs))
        return 0
    if not cfgs[0].quiet:  # progress from the start: torchrun and the ranks' imports take seconds before step 1
        names = ", ".join(c.names[0] if c.names else "csv schedule" for c in cfgs)
        nodes = (f" on {args.nnodes} nodes, this one waiting at {args.rdzv_endpoint} until every node has joined"
                 if args.nnodes > 1 else "")
        print(f"pipesim run: starting {world} ranks under torchrun ({names}; {cfgs[0].steps} steps){nodes}",
              file=sys.stderr, flush=True)
    return launch(cfgs, args.nproc, nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint, verbose=args.verbose)


def check_outputs(cfgs: list[RunConfig]) -> None:
    """Every run's --json, --trace and --save-dir can be written (pipesim.outputs), and no two collide."""
    named: list[tuple[str, Path | None]] = []
    for cfg in cfgs:
        named += [("--json", check_file(cfg.json, "--json", "json")),
                  ("--trace", check_file(cfg.trace, "--trace", "json"))]
        check_folder(cfg.save_dir, "--save-dir")
    check_distinct(*named)


def check_numbers(cfg: RunConfig, world: int) -> None:
    """Numeric flags in range, up front: a NaN learning rate or a rank that does not exist is a typo."""
    if not (math.isfinite(cfg.lr) and cfg.lr > 0):
        raise PipesimError(f"--lr must be a positive finite number, got {cfg.lr}")
    if not (math.isfinite(cfg.pg_timeout) and 0 < cfg.pg_timeout <= MAX_PG_TIMEOUT):
        raise PipesimError(f"--pg-timeout must be between 0 and {MAX_PG_TIMEOUT:g} seconds (exclusive of 0), "
                           f"got {cfg.pg_timeout}")
    if cfg.fail_rank is not None and not 0 <= cfg.fail_rank < world:
        raise PipesimError(f"--fail-rank {cfg.fail_rank}: the run has ranks 0 to {world - 1}")
    if cfg.warmup >= cfg.steps:
        raise PipesimError(f"--warmup {cfg.warmup} leaves no measured step of --steps {cfg.steps}")
