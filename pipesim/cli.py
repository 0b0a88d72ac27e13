"""The `pipesim` command: one vocabulary of flags across subcommands.

Each subcommand lives in `pipesim.commands.<name>_cmd` with `add_parser(subparsers)` and `run(args)`.
User mistakes (PipesimError) print one line and exit with code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pipesim import __version__
from pipesim.commands import megatron_import, torchtitan_import
from pipesim.commands.job_import import take_file
from pipesim.errors import PipesimError, ScheduleError

# the job files simulate and plan read as flags: their flag -> the function that expands the command line
IMPORTS = {torchtitan_import.FLAG: torchtitan_import.expand, megatron_import.FLAG: megatron_import.expand}
COMMANDS = ("schedule", "simulate", "sweep", "run", "plot", "bench", "calibrate", "validate", "plan",
            "import_trace", "whatif")

EPILOG = """examples:
  pipesim schedule 1f1b --stages 4 --microbatches 8
  pipesim simulate 1f1b --stages 4 --microbatches 8 --hardware dgx-h100 --model gpt --json
  pipesim sweep --schedules gpipe,1f1b,zb-h1 --stages 4 --microbatches 4,8,16
  pipesim run 1f1b --nproc 2 --microbatches 4 --model mlp --trace measured.json
  pipesim plot measured.json simulated.json -o timeline.html
  pipesim whatif measured.json --slow 1=1.5      # a measured step replayed, each rank's share (docs/whatif.md)
"""


class OneLineParser(argparse.ArgumentParser):
    """argparse that exits with code 2 and a single line on bad flags (the bench scripts' parsers too)."""

    def error(self, message: str):  # noqa: D401
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="pipesim",
        description="Design, simulate, run and plot pipeline-parallel training schedules.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pipesim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in COMMANDS:
        importlib.import_module(f"pipesim.commands.{name}_cmd").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    found = [flag for flag in IMPORTS if any(a == flag or a.startswith(flag + "=") for a in argv)]
    job_file = None  # (flag, path) of a job file, an input no output may replace (pipesim.outputs.check_apart)
    if argv[:1] in (["simulate"], ["plan"]) and found:
        try:  # a job file read as the flags it stands for, before the ones typed after it
            if len(found) > 1:
                raise PipesimError(f"{found[0]} and {found[1]}: give one job file")
            job_file = (found[0], take_file(argv[1:], found[0])[0])
            argv = IMPORTS[found[0]](argv)
        except PipesimError as exc:
            print(f"pipesim: error: {exc}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    args.job_file = job_file
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ScheduleError as exc:
        if exc.grid:
            print(exc.grid, file=sys.stderr)
        print(f"pipesim: error: {exc}", file=sys.stderr)
        return 2
    except PipesimError as exc:
        print(f"pipesim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pipesim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `pipesim ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
