"""`pipesim import-trace`: a real run's PyTorch profiler traces -> a pipesim timeline for `pipesim plot`."""

from __future__ import annotations

import argparse
import json
import sys

from pipesim.outputs import check_apart, check_file, write_text
from pipesim.trace_import import import_traces

EXAMPLES = """examples:
  pipesim import-trace traces/ -o measured.json                  # a folder of rank<N>.json profiler traces
  pipesim import-trace rank0.json rank1.json -o measured.json --schedule 1f1b
  pipesim simulate 1f1b -p 2 -m 4 --hardware local-cpu --trace sim.json
  pipesim plot sim.json measured.json -o compare.html            # the real run beside the prediction

TRACE files are torch.profiler Chrome traces (export_chrome_trace or the TensorBoard handler, .json or
.json.gz), one per rank, of a torch.distributed.pipelining run. Schedule1F1B names no range of its own:
profile it with with_stack=True. See docs/your_model.md.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("import-trace", help="PyTorch profiler traces of a real pipeline run -> pipesim timeline",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACE", help="Chrome trace files (one per rank) or a folder of them")
    p.add_argument("-o", "--output", required=True, metavar="OUT.json", help="timeline file to write (- for stdout)")
    p.add_argument("--schedule", metavar="NAME", default=None,
                   help="registered schedule the run used (default: inferred from the actions' order)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = check_file(args.output, "-o", "json")
    check_apart([("-o", out)], [("import-trace", t) for t in args.traces])
    timeline = import_traces(args.traces, schedule=args.schedule)
    text = json.dumps(timeline.to_dict(), separators=(",", ":"))
    if out is None:  # -o -: the timeline on stdout, the summary on stderr
        print(text)
    else:
        write_text(out, text)
    meta = timeline.meta
    computes = sum(1 for e in timeline.events if e.stream == "compute")
    print(f"import-trace: {timeline.schedule}, {timeline.num_ranks} ranks, {meta['stages']} stages, "
          f"{meta['microbatches']} microbatches, {meta['steps']} steps ({computes} compute actions, found as "
          f"{meta['recognized']}); step {meta['step_time'] * 1e3:.3f} ms (median after warm-up)"
          + (f"; wrote {out}" if out else ""), file=sys.stderr if out is None else sys.stdout)
    return 0
