"""`pipesim plot`: turn traces and sweeps into self-contained interactive HTML (and PNG).

One trace gives its timeline; a simulated and a measured trace give the compare view; a sweep
JSON ("pipesim.sweep/1") gives the sweep plots. Which one is decided by the files' contents.
"""

from __future__ import annotations

import argparse

from pipesim.commands.arg_types import positive_int
from pipesim.commands.sweep_cmd import setting_line
from pipesim.errors import PipesimError
from pipesim.outputs import check_distinct, check_file
from pipesim.timeline import Timeline, read_json

EXAMPLES = """examples:
  pipesim plot out/simulated.json -o timeline.html                     # one timeline
  pipesim plot out/simulated.json out/measured.json -o compare.html    # simulated vs measured
  pipesim plot out/measured.json -o step2.html --step 2 --unit us      # the 2nd measured step, in us
  pipesim plot sim.json measured.json -o c.html --force                # compare runs of different shape
  pipesim plot out/sweep.json -o sweep.html --png sweep.png            # sweep plots, plus a PNG

TRACE files are what --trace writes (Perfetto JSON with the pipesim timeline inside) or a bare
pipesim timeline; the HTML embeds plotly.js and opens offline. --png needs Chromium.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="plot timelines, simulated vs measured, or a sweep (HTML, PNG)",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace/timeline JSON files, or one sweep JSON")
    p.add_argument("-o", "--output", required=True, metavar="OUT.html", help="HTML file to write")
    p.add_argument("--png", metavar="OUT.png", help="also write a PNG (needs Chromium for kaleido)")
    p.add_argument("--step", type=positive_int, default=None, metavar="K",
                   help="measured step to show, from 1 as `pipesim run` numbers them "
                        "(default: the median step after warm-up by duration)")
    p.add_argument("--force", action="store_true",
                   help="compare a simulated and a measured run even when their shapes differ")
    p.add_argument("--unit", choices=("ms", "us"), default=None, help="time axis unit (default: ms if the "
                   "step is longer than 1 ms, else us)")
    p.add_argument("--title", default=None, help="figure title (default: schedule, makespan, bubble)")
    p.add_argument("--width", type=positive_int, default=None, help="PNG width in pixels (default 1400)")
    p.set_defaults(func=run)


def build_figure(paths: list[str], *, step: int | None = None, unit: str | None = None, title: str | None = None,
                 force: bool = False):
    """The figure the files call for: sweep plots, compare view, or timeline(s)."""
    from pipesim.plots import compare_figure, sweep_figure, timeline_figure  # plotly: out of `pipesim`'s start-up
    from pipesim.plots.compare import pick_step
    from pipesim.plots.sweep_figure import SCHEMA as SWEEP_SCHEMA

    docs = [(p, read_json(p)) for p in paths]  # the reader `pipesim whatif` uses too
    sweeps = [p for p, d in docs if isinstance(d, dict) and d.get("schema") == SWEEP_SCHEMA]
    if sweeps:
        if len(docs) > 1:
            raise PipesimError(f"plot a sweep on its own: {sweeps[0]} is a sweep, the other files are not")
        given = [flag for flag, value in (("--step", step), ("--unit", unit), ("--force", force)) if value]
        if given:
            raise PipesimError(f"{given[0]} acts on timelines; {sweeps[0]} is a sweep, whose plots have no step or "
                               "time axis")
        rows = docs[0][1].get("rows")
        if not isinstance(rows, list):
            raise PipesimError(f"{sweeps[0]} has no 'rows' list")
        doc = docs[0][1]
        notes = doc.get("notes") if isinstance(doc.get("notes"), list) else []
        return sweep_figure(rows, title=title, setting=doc.get("setting") or setting_line(doc), notes=notes)
    timelines = [Timeline.from_dict(d, p) for p, d in docs]
    sources = sorted(t.source for t in timelines)
    if len(timelines) == 2 and sources == ["measured", "simulated"]:
        sim, meas = sorted(timelines, key=lambda t: t.source != "simulated")
        fig = compare_figure(sim, meas, step=step, unit=unit, force=force)
        if title:
            fig.update_layout(title_text=title)
        return fig
    if force:
        raise PipesimError("--force compares a simulated and a measured timeline of different shapes: give it with "
                           "one of each")
    if step is not None and all(t.source != "measured" for t in timelines):
        raise PipesimError(f"--step picks a step of a measured run; {paths[0]} is {timelines[0].source}")
    shown = [pick_step(t, step) if t.source == "measured" else pick_step(t, None) if len(t.steps()) > 1 else t
             for t in timelines]
    return timeline_figure(shown, unit=unit, title=title)


def run(args: argparse.Namespace) -> int:
    out = check_file(args.output, "-o", "html")
    png = check_file(args.png, "--png", "png")
    check_distinct(("-o", out), ("--png", png))
    if args.width and not png:
        raise PipesimError("--width sizes the PNG: give it with --png")
    from pipesim.plots import write_html, write_png  # plotly: kept out of `pipesim`'s start-up

    fig = build_figure(args.traces, step=args.step, unit=args.unit, title=args.title, force=args.force)
    write_html(fig, out)
    print(f"wrote {out}")
    if png:
        if args.width:
            fig.update_layout(width=args.width)
        write_png(fig, png)
        print(f"wrote {png}")
    return 0
