"""`pipesim sweep`: simulate schedules x stages x microbatches (x virtual); a table, JSON, a plot."""

from __future__ import annotations

import argparse
import sys

from pipesim.commands.common import add_model_args, emit_json, int_list
from pipesim.commands.setup_args import add_setup_args, setup_from_args
from pipesim.errors import PipesimError
from pipesim.sweep import format_table, run_sweep, to_dict

EXAMPLES = """examples:
  pipesim sweep --schedules gpipe,1f1b,zb-h1 --stages 2,4 --microbatches 4,8,16
  pipesim sweep --schedules 1f1b,interleaved-1f1b --stages 4 --microbatches 8,16 --virtual 2,4 --model gpt
  pipesim sweep --schedules gpipe,1f1b --stages 4 --microbatches 4,8 --cost F=1,B=2 --json sweep.json
  pipesim sweep --schedules 1f1b,zb-h1 --stages 4,8 --microbatches 8,16,32 --plot sweep.html
"""


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="simulate a grid of schedules, stages and microbatches", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schedules", required=True, metavar="A,B,..", help="comma-separated schedule names")
    p.add_argument("--stages", "-p", type=int_list, default=[4], metavar="P,..", help="pipeline ranks (default 4)")
    p.add_argument("--microbatches", "-m", type=int_list, default=[8], metavar="M,..",
                   help="microbatches per step (default 8)")
    p.add_argument("--virtual", "-v", type=int_list, default=None, metavar="V,..",
                   help="chunks per rank for interleaved schedules (default the schedule's)")
    add_setup_args(p)
    add_model_args(p)
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="write the rows as JSON to FILE, or to stdout without FILE")
    p.add_argument("--plot", metavar="FILE.html", help="write the sweep figure (plotly HTML)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.schedules.split(",") if n.strip()]
    if not names:
        raise PipesimError("--schedules needs at least one schedule name")
    setup = setup_from_args(args)
    skipped: list[dict] = []
    rows = run_sweep(names, args.stages, args.microbatches, args.virtual, setup, skipped=skipped,
                     progress=sys.stderr.isatty())
    emit_json(args.json, to_dict(rows, setup, skipped))
    if args.json != "-":
        print(format_table(rows, skipped))
    if not rows:
        raise PipesimError("no combination could be simulated: " + "; ".join(s["reason"] for s in skipped[:3]))
    if args.plot:
        _plot(rows, args.plot)
    return 0


def _plot(rows: list[dict], path: str) -> None:
    from pipesim.plots import sweep_figure, write_html  # plotly: kept out of `pipesim`'s start-up

    write_html(sweep_figure(rows), path)
