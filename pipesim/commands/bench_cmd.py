"""`pipesim bench`: collective bandwidths (under torchrun), executor vs torch.distributed.pipelining, simulator speed.

`collectives` launches torchrun itself on executor.collectives_bench; `executor`, `simulator`, `late-recv` and
`published` run the scripts in bench/ (source tree only). Flags of `collectives` are defined here and become a
`CollectivesConfig`, checked before any process starts and handed to the ranks as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import math
import os
import sys
from pathlib import Path

from executor.collectives_config import OPS, CollectivesConfig, parse_ops, parse_size
from executor.launch import rank_environment
from executor.supervisor import run_reported
from pipesim.commands.arg_types import positive_int
from pipesim.errors import PipesimError
from pipesim.outputs import check_distinct, check_file
from pipesim.units import format_bytes

EXAMPLES = """examples:
  pipesim bench collectives --nproc 2                              # all ops, sizes 1K,64K,1M,16M
  pipesim bench collectives --nproc 4 --sizes 1K,1M,64M --ops all_reduce,reduce_scatter --json c.json --plot c.html
  pipesim bench collectives --nproc 4 --lecture                    # the lecture's all_reduce/reduce_scatter demo
  pipesim bench executor -- --schedules gpipe,1f1b --steps 5        # pipesim executor vs torch pipelining
  pipesim bench simulator                                          # bench/bench_simulator.py
  pipesim bench late-recv -- --iters 150                           # bench/bench_late_recv.py
  pipesim bench published                                          # published GPU results -> docs/published.md
"""

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"  # present in a source checkout only


def add_collectives_args(p: argparse.ArgumentParser) -> None:
    """The flags of `pipesim bench collectives` (a CollectivesConfig, see collectives_config)."""
    p.add_argument("--sizes", default=None, help="buffer sizes S, K/M/G binary (default 1K,64K,1M,16M)")
    p.add_argument("--ops", default=None, help=f"collectives (default all: {','.join(OPS)})")
    p.add_argument("--iters", type=int, default=None, help="timed calls per size (default 20)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls per size (default 2)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: nccl with GPUs, else gloo")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="write results (seconds, bytes, bytes/s) to FILE, or to stdout without FILE")
    p.add_argument("--plot", metavar="FILE.html", help="write busbw vs size per op as self-contained HTML")
    p.add_argument("--lecture", action="store_true", help="run the lecture's all_reduce/reduce_scatter demo instead")
    p.add_argument("--elements", type=int, default=None,
                   help="--lecture: float32 elements (default 100M on GPU, 10M on CPU)")
    p.add_argument("--timeout", type=float, default=120.0, help="process-group timeout, seconds (default 120)")


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks: collectives, executor vs torch, simulator", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_subparsers(dest="bench", metavar="BENCH", parser_class=type(p))
    c = which.add_parser("collectives", help="collective time, algbw, busbw (nccl-tests conventions) under torchrun",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--nproc", type=positive_int, default=2, help="processes (ranks) torchrun starts (default 2)")
    add_collectives_args(c)
    c.set_defaults(func=run_collectives)
    for name, script, text in (("executor", "bench_executor.py", "step time: pipesim executor vs torch pipelining"),
                               ("simulator", "bench_simulator.py", "simulator speed (bench/bench_simulator.py)"),
                               ("late-recv", "bench_late_recv.py", "gloo's late RECV by what the sender does"),
                               ("published", "bench_published.py",
                                "published Megatron-LM results vs predictions (docs/published.md)")):
        e = which.add_parser(name, help=text, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
        e.add_argument("args", nargs=argparse.REMAINDER, help=f"flags for bench/{script} (after --)")
        e.set_defaults(func=run_script, script=script)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _torchrun(nproc: int, module: str, argv: list[str]) -> int:
    """Run `python -m <module> argv` on `nproc` local ranks; --standalone picks a free rendezvous port.

    Under executor.supervisor: Ctrl-C or SIGTERM stops every rank (exit 128 + signal), a failure ends
    in one line naming the rank; torchrun's own output goes to a log kept only then.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", module, *argv]
    env = rank_environment()  # ranks share the cores: one thread each, as `pipesim run` gives them
    return run_reported(cmd, env, prefix="pipesim-bench-")


MAX_TIMEOUT = 86400.0  # seconds: a day; more is a typo
MAX_BUFFERS = 3  # buffers of size S a rank holds at once (input, output, a scatter/gather list's share)


def size_bound(nproc: int) -> int:
    """Largest --sizes / --elements buffer in bytes: every rank's buffers within half this machine's memory."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # bytes
    return memory // (2 * MAX_BUFFERS * nproc)


TABLE_FLAGS = ("sizes", "ops", "iters", "warmup", "plot")  # the table's measurement, which --lecture does not run


def collectives_config(args: argparse.Namespace) -> CollectivesConfig:
    """The checked configuration of the flags; user mistakes fail here, with one line, before torchrun starts."""
    if args.lecture:
        given = [name for name in TABLE_FLAGS if getattr(args, name) is not None]
        if given:
            raise PipesimError(f"--{given[0]} is for the table of --sizes and --ops; --lecture runs the lecture's "
                               "demo instead (all_reduce and reduce_scatter of --elements floats, timed once)")
    elif args.elements is not None:
        raise PipesimError("--elements sizes the --lecture demo: give it with --lecture (the table's buffers are "
                           "--sizes)")
    json_path = check_file(args.json, "--json", "json")
    plot_path = check_file(args.plot, "--plot", "html")
    check_distinct(("--json", json_path), ("--plot", plot_path))
    default = CollectivesConfig()  # the table's sizes, ops, iters and warmup where not given
    sizes = default.sizes if args.sizes is None else tuple(parse_size(s) for s in args.sizes.split(",") if s.strip())
    bound = size_bound(getattr(args, "nproc", 1))
    too_big = [s for s in sizes if s > bound] + ([args.elements * 4] if args.elements and args.elements * 4 > bound
                                                 else [])
    if too_big:
        raise PipesimError(f"a {format_bytes(max(too_big))} buffer is above the bound of {format_bytes(bound)} per "
                           f"buffer ({MAX_BUFFERS} per rank, {getattr(args, 'nproc', 1)} ranks, within half of this "
                           "machine's memory)")
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= MAX_TIMEOUT):
        raise PipesimError(f"--timeout must be more than 0 and at most {MAX_TIMEOUT:g} seconds, got {args.timeout}")
    ops = default.ops if args.ops is None else tuple(parse_ops(args.ops))
    iters = default.iters if args.iters is None else args.iters
    warmup = default.warmup if args.warmup is None else args.warmup
    return CollectivesConfig(sizes=sizes, ops=ops, iters=iters, warmup=warmup, backend=args.backend,
                             json=args.json, plot=args.plot, lecture=args.lecture, elements=args.elements,
                             timeout=args.timeout).check()


def run_collectives(args: argparse.Namespace) -> int:
    cfg = collectives_config(args)
    return _torchrun(args.nproc, "executor.collectives_bench", ["--config", cfg.to_json()])  # 0, or the line said why


def run_script(args: argparse.Namespace) -> int:
    """Load bench/<script> and call its main(argv)."""
    path = BENCH_DIR / args.script
    if not path.exists():
        raise PipesimError(f"{path} not found; the bench scripts ship with the source checkout only")
    spec = importlib.util.spec_from_file_location(f"pipesim_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there (string annotations)
    spec.loader.exec_module(module)
    argv = args.args[1:] if args.args[:1] == ["--"] else list(args.args)
    if inspect.signature(module.main).parameters:
        return int(module.main(argv) or 0)
    saved, sys.argv = sys.argv, [str(path), *argv]  # a main() that reads sys.argv itself
    try:
        return int(module.main() or 0)
    finally:
        sys.argv = saved
