"""`pipesim schedule`: print a schedule as a grid, torch CSV or JSON; validate an imported CSV."""

from __future__ import annotations

import argparse
import json
import sys

import schedules
from pipesim.commands.common import MAX_CHECKED_STAGE_MICROBATCHES, add_schedule_args, load_schedule
from pipesim.ir import torch_csv
from pipesim.ir.inflight import inflight_by_rank
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Kind
from pipesim.outputs import check_file

EXAMPLES = """examples:
  pipesim schedule 1f1b --stages 4 --microbatches 8
  pipesim schedule interleaved-1f1b --stages 4 --microbatches 8 --virtual 2 --format csv > il.csv
  pipesim schedule --from-csv il.csv          # validate; prints the grid or the deadlock
  pipesim schedule zb-h1 -p 4 -m 8 --comms --format json
  pipesim schedule zb-h1 -p 4 -m 8 --plot zb-h1.html   # unit-cost picture of the order
  pipesim schedule --list
"""


def add_parser(sub) -> None:
    p = sub.add_parser("schedule", help="print or validate a schedule", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_schedule_args(p)
    p.add_argument("--format", choices=("grid", "csv", "json"), default="grid")
    p.add_argument("--comms", action="store_true", help="include the SEND/RECV actions (lowered form)")
    p.add_argument("--list", action="store_true", help="list the registered schedules")
    p.add_argument("--plot", metavar="FILE.html",
                   help="also write a timeline of the schedule with unit costs (F=1, B=2 or I=W=1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipesim.ir.schedule_check import fifo_mismatches, render_grid  # networkx: kept out of `pipesim`'s start-up

    if args.list:
        for name in schedules.names():
            entry = schedules.spec(name)
            print(f"{name:<18} {entry.summary}")
        return 0
    plot = check_file(args.plot, "--plot", "html")
    sched = load_schedule(args, limit=MAX_CHECKED_STAGE_MICROBATCHES)
    shown = add_p2p(sched) if args.comms else sched
    if args.format == "csv":
        print(torch_csv.dumps(shown), end="")
    elif args.format == "json":
        data = shown.to_dict()
        data["peak_inflight_microbatches"] = inflight_by_rank(sched)
        print(json.dumps(data, indent=2))
    else:
        print(f"{sched.name}: {plural(sched.num_ranks, 'rank')}, {plural(sched.num_stages, 'stage')}, "
              f"{plural(sched.num_microbatches, 'microbatch', 'microbatches')}; valid")
        print(render_grid(shown))
    if fifo_mismatches(add_p2p(sched)):
        print("note: some rank pairs receive in a different order than they send; fine on gloo (tagged), "
              "but NCCL matches in issue order", file=sys.stderr)
    if plot:
        write_unit_plot(sched, plot)
    return 0


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def write_unit_plot(sched, path: str) -> None:
    """Timeline of the contention-free order with F=1, B=2 (I=W=1): what the schedule looks like."""
    from pipesim.plots import timeline_figure, write_html  # plotly: kept out of `pipesim`'s start-up
    from pipesim.plots.from_schedule import unit_timeline

    unit = {Kind.F: 1e-3, Kind.B: 2e-3, Kind.I: 1e-3, Kind.W: 1e-3}  # 1 unit drawn as 1 ms
    timeline = unit_timeline(sched, lambda a: unit.get(a.kind, 0.0))
    title = f"{sched.name}: unit costs F=1, B=2, I=W=1 (1 unit = 1 ms on the axis), no communication"
    write_html(timeline_figure([timeline], unit="ms", title=title), path)
