"""`pipesim sweep`: simulate schedules x stages x microbatches (x virtual); a table, JSON, a plot.

Outputs are checked and the grid is bounded (device capacity, schedule size) before any schedule is
built; every output names the hardware and model it assumed, and says when 1F1B's bubble comes out
above GPipe's because link latency is large against the microbatches' compute.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import schedules as registry
from pipesim.commands.arg_types import positive_int
from pipesim.commands.common import (
    add_model_args,
    add_transformer_args,
    check_schedule_size,
    input_files,
    int_list,
    json_text,
)
from pipesim.commands.setup_args import add_setup_args, setup_from_args
from pipesim.commands.whatif_args import add_whatif_args, perturbation_from_args
from pipesim.cost.v_search import SEARCHED
from pipesim.cost.zb_auto_costs import SEARCHED_TEXT
from pipesim.errors import PipesimError
from pipesim.outputs import check_apart, check_distinct, check_file, write_files
from pipesim.sim.sim_setup import SimSetup
from pipesim.sim.simulator import check_devices
from pipesim.sim.sweep import format_table, run_sweep, to_dict

EXAMPLES = """examples:
  pipesim sweep --schedules gpipe,1f1b,zb-h1 --stages 2,4 --microbatches 4,8,16
  pipesim sweep --schedules 1f1b,interleaved-1f1b --stages 4 --microbatches 8,16 --virtual 2,4 --model gpt
  pipesim sweep --schedules gpipe,1f1b --stages 4 --microbatches 4,8 --cost F=1,B=2 --json sweep.json
  pipesim sweep --schedules 1f1b,zb-h1 --stages 4,8 --microbatches 8,16,32 --plot sweep.html
  pipesim sweep --schedules 1f1b,interleaved-1f1b,zb-h1,dualpipe --stages 4 -m 16 --model gpt --jitter 0.1
"""


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="simulate a grid of schedules, stages and microbatches", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schedules", required=True, metavar="A,B,..", help="comma-separated schedule names")
    p.add_argument("--stages", "-p", type=int_list, default=[4], metavar="P,..", help="pipeline ranks (default 4)")
    p.add_argument("--microbatches", "-m", type=int_list, default=None, metavar="M,..",
                   help="microbatches per step (default 8)")
    p.add_argument("--microbatch-size", type=int_list, default=None, metavar="N,..",
                   help="sequences per microbatch instead of -m: m = batch / (dp x N); with -m too, pairwise equal")
    p.add_argument("--virtual", "-v", type=int_list, default=None, metavar="V,..",
                   help="chunks per rank for interleaved schedules (default the schedule's)")
    add_setup_args(p)
    add_model_args(p)
    add_transformer_args(p)
    add_whatif_args(p)
    p.add_argument("--samples", type=positive_int, default=8, metavar="N",
                   help="with --jitter: draws per combination; rows rank by their mean makespan (default 8)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="write the rows as JSON to FILE, or to stdout without FILE")
    p.add_argument("--plot", metavar="FILE.html", help="write the sweep figure (plotly HTML)")
    p.add_argument("--pareto", metavar="FILE.html",
                   help="write the Pareto view: bubble against peak activation memory, per (p, m) (plotly HTML)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    json_path = check_file(args.json, "--json", "json")
    plot_path = check_file(args.plot, "--plot", "html")
    pareto_path = check_file(args.pareto, "--pareto", "html")
    check_distinct(("--json", json_path), ("--plot", plot_path), ("--pareto", pareto_path))
    check_apart([("--json", json_path), ("--plot", plot_path), ("--pareto", pareto_path)], input_files(args))
    names = [n.strip() for n in args.schedules.split(",") if n.strip()]
    if not names:
        raise PipesimError("--schedules needs at least one schedule name")
    for name in names:
        registry.spec(name)  # an unknown name: one line, before anything is built
    setup = setup_from_args(args)
    for flag, given in (("--ilp", setup.ilp_time_limit), ("--memory-limit", setup.memory_limit)):
        if given is not None and not set(names) & set(SEARCHED):
            raise PipesimError(f"{flag} applies to {SEARCHED_TEXT}; the sweep has none of them")
    if args.virtual and not any(registry.spec(n).virtual for n in names):
        raise PipesimError(f"--virtual applies to schedules with several stages per rank; {', '.join(names)} have one")
    pert = perturbation_from_args(args)
    if pert is not None:
        if pert.slow_links and not setup.comm:
            raise PipesimError("--slow-link needs links: give --hardware (and not --comm none)")
        for p in args.stages:
            pert.check(p)  # a rank or link beyond the smallest pipeline: one line, before any work
        setup = replace(setup, perturb=pert)
    args.microbatches = _microbatches(setup, args.microbatches, args.microbatch_size)
    skipped: list[dict] = []
    stages = _admissible_stages(args.stages, setup, names, args.microbatches, skipped)
    for name in names:
        spec = registry.spec(name)
        for v in (args.virtual if spec.virtual and args.virtual else [spec.default_virtual]):
            for p in stages:
                for m in args.microbatches:
                    check_schedule_size(p, v, m)
    rows = run_sweep(names, stages, args.microbatches, args.virtual, setup, skipped=skipped,
                     progress=sys.stderr.isatty(), samples=args.samples) if stages else []
    if not rows:  # nothing written: a failed sweep leaves no file behind
        reasons = list(dict.fromkeys(s["reason"] for s in skipped))
        raise PipesimError("no combination could be simulated: " + "; ".join(reasons[:3]))
    doc = to_dict(rows, setup, skipped)
    doc["setting"] = setting_line(doc)
    doc["notes"] = bubble_notes(rows, setup)
    files = {}
    if json_path:
        files[json_path] = json_text(doc)
    if plot_path:
        files[plot_path] = _plot_html(doc)
    if pareto_path:
        files[pareto_path] = _pareto_html(doc)
    write_files(files)
    if args.json == "-":
        sys.stdout.write(json_text(doc))
    else:
        print(f"sweep {doc['setting']}")
        print(format_table(rows, skipped))
        for note in doc["notes"]:
            print(f"note: {note}")
    return 0


def _microbatches(setup: SimSetup, microbatches: list[int] | None, sizes: list[int] | None) -> list[int]:
    """The m values: -m as given, or each --microbatch-size turned into m; both given: pairwise, and equal."""
    if sizes is None:
        return [setup.microbatches(m, None) for m in microbatches] if microbatches else [setup.microbatches(None, None)]
    if microbatches is not None and len(microbatches) != len(sizes):
        raise PipesimError(f"-m has {len(microbatches)} values and --microbatch-size {len(sizes)}; give them pairwise")
    pairs = zip(microbatches, sizes, strict=True) if microbatches is not None else ((None, n) for n in sizes)
    return [setup.microbatches(m, n) for m, n in pairs]


def _admissible_stages(stages: list[int], setup: SimSetup, names: list[str], microbatches: list[int],
                       skipped: list[dict]) -> list[int]:
    """The stage counts the hardware has devices for; the others skipped with the reason, unbuilt."""
    kept = []
    for p in stages:
        try:
            check_devices(setup.job.with_pp(p).dims, setup.hardware)
            kept.append(p)
        except PipesimError as exc:
            skipped.extend({"schedule": n, "stages": p, "microbatches": m, "virtual": registry.spec(n).default_virtual,
                            "reason": str(exc)} for n in names for m in microbatches)
    return kept


def setting_line(doc: dict) -> str:
    """What the sweep assumed, in words: 'on dgx-h100 (links modeled), model mlp (hidden 1024, ...), dp 1 tp 1'."""
    if doc.get("cost"):
        where = f"on {doc['hardware']}" if doc.get("hardware") else "without hardware"
        cost = ",".join(f"{k}={v:g}" for k, v in doc["cost"].items())
        return f"{where} (links {'modeled' if doc.get('comm') == 'links' else 'off'}), --cost {cost} (seconds)"
    model = doc.get("model") or {}
    shape = ", ".join(f"{k} {model[k]}" for k in ("hidden", "layers", "heads", "seq", "batch", "dtype")
                      if k in model and not (model.get("kind") == "mlp" and k in ("heads", "seq")))
    return (f"on {doc.get('hardware')} (links {'modeled' if doc.get('comm') == 'links' else 'off'}), "
            f"model {model.get('kind', '?')} ({shape}), dp {doc.get('dp', 1)} tp {doc.get('tp', 1)}")


NOTE_GAP = 0.01  # bubble fraction: 1F1B above GPipe by more than a point gets explained


def bubble_notes(rows: list[dict], setup: SimSetup) -> list[str]:
    """Why 1F1B's bubble can exceed GPipe's: with tiny microbatches the transfer time it exposes decides."""
    by_key = {(r["schedule"], r["stages"], r["microbatches"]): r for r in rows}
    notes = []
    for (name, p, m), row in by_key.items():
        gpipe = by_key.get(("gpipe", p, m))
        if name != "1f1b" or gpipe is None or row["bubble_fraction"] <= gpipe["bubble_fraction"] + NOTE_GAP:
            continue
        stage = setup.costs(registry.build("gpipe", p, m)).table.stages[0]
        link = setup.hardware.intra if setup.hardware is not None and setup.comm else None
        hop = (f"a transfer takes {(link.latency + stage.boundary_bytes / link.bandwidth) * 1e6:.3g} us "
               f"({link.latency * 1e6:.3g} us of it link latency)" if link is not None else "transfers take time")
        notes.append(
            f"1f1b's bubble is above gpipe's at p={p} m={m} ({row['bubble_fraction']:.1%} vs "
            f"{gpipe['bubble_fraction']:.1%}): a forward takes {stage.forward * 1e6:.3g} us per microbatch and "
            f"stage and {hop}; 1F1B exposes a transfer at every forward/backward hand-off, GPipe overlaps it with "
            f"the next forward. Without links (--comm none) both bubbles are (p-1)/(m+p-1); a larger model "
            f"(--hidden, --batch) makes the comparison mean something")
    return notes


def _plot_html(doc: dict) -> str:
    from pipesim.plots import sweep_figure  # plotly: kept out of `pipesim`'s start-up
    from pipesim.plots.export import html_text

    return html_text(sweep_figure(doc["rows"], setting=doc["setting"], notes=doc["notes"]))


def _pareto_html(doc: dict) -> str:
    from pipesim.plots.export import html_text  # plotly: kept out of `pipesim`'s start-up
    from pipesim.plots.pareto import pareto_figure

    return html_text(pareto_figure(doc["rows"], title=f"Bubble against peak activation memory: {doc['setting']}"))
