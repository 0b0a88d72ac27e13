"""`pipesim whatif`: a measured run's step replayed through the simulator, and what each rank and link cost it."""

from __future__ import annotations

import argparse

from pipesim.commands.arg_types import bounded_int
from pipesim.commands.common import json_text
from pipesim.commands.whatif_args import perturbation_from_args, whatif_lines
from pipesim.errors import PipesimError
from pipesim.outputs import check_apart, check_distinct, check_file, write_files
from pipesim.plots.perfetto import trace_text
from pipesim.sim import replay
from pipesim.sim.blame import blame_rows, what_if
from pipesim.timeline import Timeline

EXAMPLES = """examples:
  pipesim import-trace traces/ -o measured.json && pipesim whatif measured.json
  pipesim run 1f1b --nproc 2 --model mlp --trace run.json && pipesim whatif run.json --json
  pipesim whatif measured.json --slow 1=1.5      # the recorded step with rank 1's compute 1.5x as long
  pipesim whatif measured.json --slow 1=1.5 --trace slow.json && pipesim plot slow.json -o slow.html
"""


def add_parser(sub) -> None:
    p = sub.add_parser("whatif", help="replay a measured run's step and say what each rank and link cost it",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("timeline", metavar="TIMELINE", help="a measured timeline: pipesim import-trace -o, pipesim run "
                                                        "--trace")
    p.add_argument("--step", type=int, default=None,
                   help="the measured step to replay, numbered from 1 as pipesim plot --step (default: the median "
                        "one after the warm-up)")
    p.add_argument("--slow", action="append", default=[], metavar="RANK=FACTOR",
                   help="also replay with rank RANK's compute FACTOR times as long (repeatable)")
    p.add_argument("--slow-link", action="append", default=[], metavar="A-B=FACTOR",
                   help="also replay with the messages between ranks A and B FACTOR times as long")
    p.add_argument("--jitter", type=float, default=0.0, metavar="SIGMA",
                   help="also replay with every compute times a lognormal factor exp(SIGMA z)")
    p.add_argument("--jitter-seed", type=lambda t: bounded_int(t, 0), default=None, metavar="N",
                   help="with --jitter: seed of the jitter (default 0)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="write the report as JSON to FILE, or to stdout without FILE")
    p.add_argument("--trace", metavar="FILE.json", default=None,
                   help="write the replayed step (with --slow/--slow-link/--jitter: the perturbed one) as a Perfetto "
                        "trace, who waited on whom drawn (pipesim plot FILE.json -o view.html)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    json_path = check_file(args.json, "--json", "json")
    trace_path = check_file(args.trace, "--trace", "json")
    check_distinct(("--json", json_path), ("--trace", trace_path))
    check_apart([("--json", json_path), ("--trace", trace_path)], [("whatif", args.timeline)])
    tl = Timeline.read(args.timeline)
    if tl.source != "measured":
        raise PipesimError(f"{args.timeline} is a {tl.source} timeline: give a measured one (pipesim import-trace, "
                           "pipesim run --trace)")
    if not tl.events:  # a step is replayed: one with no events has nothing to replay
        raise PipesimError(f"{args.timeline} has no events: no step to replay")
    pert = perturbation_from_args(args)
    if pert is not None:
        pert.check(tl.num_ranks)  # ranks the trace does not have: one line, before any work
    steps = [s + 1 for s in tl.steps()]
    if args.step is not None and args.step not in steps:
        raise PipesimError(f"--step {args.step}: the timeline has steps {steps[0]}-{steps[-1]} (numbered from 1)")
    rec = replay.record(tl, args.step - 1 if args.step is not None else None)
    report = {**replay.what_ifs(rec), "step": rec.step + 1}  # numbered from 1, as pipesim run and plot number them
    base = replay.run(rec)
    changed = replay.run(rec, pert) if pert is not None else base
    if pert is not None:
        report["what_if"] = {"perturbation": pert.describe(), **pert.to_dict(), **what_if(base, changed)}
    files = {}
    if json_path:
        files[json_path] = json_text(report)
    if trace_path:  # the replayed step, its attributed waits drawn (pipesim.sim.blame)
        drawn = changed.timeline()
        drawn.meta = {**drawn.meta, "replayed_from": args.timeline, "blame": blame_rows(changed),
                      **({"what_if": pert.describe()} if pert is not None else {})}
        files[trace_path] = trace_text(drawn)
    write_files(files)
    if args.json == "-":
        print(json_text(report), end="")
        return 0
    print("\n".join(lines(report)))
    return 0


def _faster(share: float) -> str:
    return f"{share:.1%} faster" if share >= 0 else f"{-share:.1%} slower"


def lines(r: dict) -> list[str]:
    """The report in words."""
    out = [f"{r['schedule']}, {r['ranks_count']} ranks, step {r['step']}: measured {r['measured_step'] * 1e3:.3f} ms, "
           f"replayed through the simulator {r['replayed_step'] * 1e3:.3f} ms ({r['replay_error']:+.2%})",
           f"each rank's compute replaced by the median rank's (rank {r['median_rank']}):"]
    for x in sorted(r["ranks"], key=lambda x: -x["share"]):
        out.append(f"  rank {x['rank']}: compute {x['compute'] * 1e3:.3f} ms; the step would be "
                   f"{_faster(x['share'])} with it at the median ({x['step_without'] * 1e3:.3f} ms)")
    if r["links"]:
        out.append(f"each link's deliveries replaced by the median link's ({r['median_link_delivery'] * 1e6:.0f} us):")
    for x in sorted(r["links"], key=lambda x: -x["share"]):
        out.append(f"  link {x['link']}: median delivery {x['median_delivery'] * 1e6:.0f} us; the step would be "
                   f"{_faster(x['share'])} with it at the median ({x['step_without'] * 1e3:.3f} ms)")
    if "what_if" in r:
        out += whatif_lines(r["what_if"])
    return out
