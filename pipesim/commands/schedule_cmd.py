"""`pipesim schedule`: print a schedule as a grid, torch CSV or JSON; validate an imported CSV."""

from __future__ import annotations

import argparse
import json
import sys

import schedules
from pipesim.commands.common import MAX_CHECKED_STAGE_MICROBATCHES, add_schedule_args, load_schedule
from pipesim.cost.table import CostTable, parse_cost_spec
from pipesim.cost.v_search import SEARCHED, V_SEARCHED, search_v, v_costs
from pipesim.cost.zb_auto_costs import (
    AUTO_SCHEDULES,
    SEARCHED_TEXT,
    MemoryLimit,
    Searched,
    auto_costs,
    exact,
    parse_memory_limit,
)
from pipesim.errors import PipesimError
from pipesim.ir import torch_csv
from pipesim.ir.inflight import inflight_by_rank
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Kind
from pipesim.outputs import check_file

DEFAULT_ILP_SECONDS = 10.0  # seconds HiGHS may search when --ilp is given bare

EXAMPLES = """examples:
  pipesim schedule 1f1b --stages 4 --microbatches 8
  pipesim schedule interleaved-1f1b --stages 4 --microbatches 8 --virtual 2 --format csv > il.csv
  pipesim schedule --from-csv il.csv          # validate; prints the grid or the deadlock
  pipesim schedule zb-h1 -p 4 -m 8 --comms --format json
  pipesim schedule zb-h1 -p 4 -m 8 --plot zb-h1.html   # unit-cost picture of the order
  pipesim schedule zb-auto -p 3 -m 6 --ilp 5                        # proven optimum for unit costs
  pipesim schedule zb-2p -p 4 -m 8 --ilp --cost F=1,I=2,W=1 --hop 0.1 --format json
  pipesim schedule zb-v -p 2 -m 3 --ilp 5 --cost F=1,I=1.5,W=0.7 --memory-limit 3   # V order, 3 chunk stashes
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
    g = p.add_argument_group("exact search (zb-auto, zb-2p, zb-v): the Zero Bubble paper's ILP, from the heuristic "
                                "(zb-v: from the best of zb-v, v-half, v-min within the limit)")
    g.add_argument("--ilp", type=float, nargs="?", const=DEFAULT_ILP_SECONDS, default=None, metavar="SECONDS",
                   help="search the order by integer linear programming (HiGHS) for up to SECONDS "
                        f"(default {DEFAULT_ILP_SECONDS:g})")
    g.add_argument("--cost", metavar="F=<s>,I=<s>,W=<s>", default=None,
                   help="seconds per stage of each action (default unit costs)")
    g.add_argument("--hop", type=float, default=None, metavar="S",
                   help="seconds to move a tensor between stages (default 0)")
    g.add_argument("--memory-limit", metavar="N|Nx", default=None,
                   help="activation limit: Nx 1F1B's (p microbatches) or N microbatches (zb-v: N chunk "
                        "stashes, a chunk half a stage; default 1x zb-auto, 2x zb-2p, zb-v's own peak for zb-v)")
    g.add_argument("--objective", choices=("makespan", "span"), default=None,
                   help="minimise the last action's end (default), or the paper's longest stage span (its eq. 3)")
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
    asked = args.ilp is not None or (args.memory_limit is not None and args.name in V_SEARCHED)
    if not asked:  # the search's own flags, given without a search, would change nothing
        for flag, value in (("--cost", args.cost), ("--hop", args.hop), ("--memory-limit", args.memory_limit),
                            ("--objective", args.objective)):
            if value is not None:
                raise PipesimError(f"{flag} sets the exact search: give --ilp (zb-auto, zb-2p, zb-v) with it")
    args.cost = args.cost or "F=1,I=1,W=1"  # the search's defaults, once flags left out have been told apart
    args.hop = 0.0 if args.hop is None else args.hop
    args.objective = args.objective or "makespan"
    found = search(args, sched) if asked else None
    if found is not None:
        sched = found.schedule
    shown = add_p2p(sched) if args.comms else sched
    if args.format == "csv":
        print(torch_csv.dumps(shown), end="")
    elif args.format == "json":
        data = shown.to_dict()
        data["peak_inflight_microbatches"] = inflight_by_rank(sched)
        if found is not None:
            data["search"] = search_report(found, args.objective)
        print(json.dumps(data, indent=2))
    else:
        print(f"{sched.name}: {plural(sched.num_ranks, 'rank')}, {plural(sched.num_stages, 'stage')}, "
              f"{plural(sched.num_microbatches, 'microbatch', 'microbatches')}; valid")
        if found is not None:
            print(search_line(found, args.objective))
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


def search(args: argparse.Namespace, sched) -> Searched:
    """The searched order of `sched` (zb-auto, zb-2p: the heuristic then the ILP; zb-v: the best handcrafted V
    order within the limit, then the ILP with --ilp) for --cost, --hop and --memory-limit."""
    if args.from_csv or args.name not in SEARCHED:
        raise PipesimError(f"--ilp searches {SEARCHED_TEXT}, not {args.name or args.from_csv}")
    hop, objective = args.hop, args.objective
    if not hop >= 0:
        raise PipesimError(f"--hop must be >= 0 seconds, got {hop:g}")
    p, m = sched.num_ranks, sched.num_microbatches
    cost = parse_cost_spec(args.cost)
    if args.name in V_SEARCHED:  # --cost is one rank's share, as `simulate --cost` reads it: each chunk takes half
        table = CostTable.uniform(2 * p, cost["F"] / 2, cost["I"] / 2, cost["W"] / 2)
        # bytes here count chunk stashes (one stashes 1); none given: what zb-v's own order holds
        limit = parse_memory_limit(args.memory_limit) if args.memory_limit else None
        costs = v_costs(table, p, m, limit, (hop,) * (2 * p - 1))
        return search_v(args.name, costs, p, m, time_limit=args.ilp, objective=objective)
    table = CostTable.uniform(p, cost["F"], cost["I"], cost["W"])
    limit = MemoryLimit(multiple=AUTO_SCHEDULES[args.name])
    if args.memory_limit:
        limit = parse_memory_limit(args.memory_limit)  # bytes here count microbatches: one stashes 1
    costs = auto_costs(table, p, m, limit, (hop,) * (p - 1))
    return exact(args.name, costs, p, m, time_limit=args.ilp, objective=objective)


def search_report(found: Searched, objective: str) -> dict:
    """What --format json says of the search (seconds of the cost units)."""
    ilp = found.ilp
    origin = found.schedule.meta.get("warm_start")
    return {"objective": objective, "heuristic": found.heuristic, **({"warm_start": origin} if origin else {}),
            "value": found.value, "bound": found.bound,
            "gap": found.gap, "ilp": None if ilp is None else {
                "optimal": ilp.optimal, "status": ilp.status, "solve_seconds": ilp.seconds},
            **({"ilp_skipped": found.reason} if ilp is None else {})}


def search_line(found: Searched, objective: str) -> str:
    ilp = found.ilp
    origin = found.schedule.meta.get("warm_start")  # zb-v: the handcrafted V order (or "serial") it started from
    start = "heuristic" if origin is None else f"start {origin}"
    if ilp is None:
        return (f"{objective}: {start} {found.heuristic:g}, lower bound {found.bound:g}, gap {found.gap:.2%} "
                f"(ILP not run: {found.reason})")
    verdict = "optimal" if ilp.optimal else f"best found, gap {found.gap:.2%} to the bound {found.bound:g}"
    return (f"{objective}: ILP {ilp.objective:g} ({verdict}; {start} {found.heuristic:g}), "
            f"solved in {ilp.seconds:.2f} s ({ilp.status})")
