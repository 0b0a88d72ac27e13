"""`pipesim schedule`: print a schedule as a grid, torch CSV or JSON; validate an imported CSV."""

from __future__ import annotations

import argparse
import json

from pipesim.commands.common import add_schedule_args, load_schedule

EXAMPLES = """examples:
  pipesim schedule 1f1b --stages 4 --microbatches 8
  pipesim schedule interleaved-1f1b --stages 4 --microbatches 8 --virtual 2 --format csv > il.csv
  pipesim schedule --from-csv il.csv          # validate; prints the grid or the deadlock
  pipesim schedule zb-h1 -p 4 -m 8 --comms --format json
  pipesim schedule --list
"""


def add_parser(sub) -> None:
    p = sub.add_parser("schedule", help="print or validate a schedule", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_schedule_args(p)
    p.add_argument("--format", choices=("grid", "csv", "json"), default="grid")
    p.add_argument("--comms", action="store_true", help="include the SEND/RECV actions (lowered form)")
    p.add_argument("--list", action="store_true", help="list the registered schedules")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import schedules
    from pipesim import torch_csv
    from pipesim.analysis import inflight_by_rank
    from pipesim.lowering import add_p2p
    from pipesim.validate import render_grid

    if args.list:
        for name in schedules.names():
            entry = schedules.spec(name)
            print(f"{name:<18} {entry.summary}")
        return 0
    sched = load_schedule(args)
    shown = add_p2p(sched) if args.comms else sched
    if args.format == "csv":
        print(torch_csv.dumps(shown), end="")
    elif args.format == "json":
        data = shown.to_dict()
        data["peak_inflight_microbatches"] = inflight_by_rank(sched)
        print(json.dumps(data, indent=2))
    else:
        print(f"{sched.name}: {sched.num_ranks} ranks, {sched.num_stages} stages, "
              f"{sched.num_microbatches} microbatches; valid")
        print(render_grid(shown))
    return 0
