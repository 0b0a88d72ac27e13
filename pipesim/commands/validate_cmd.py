"""`pipesim validate`: measure the validation grid, calibrate on its 2-rank part, predict the rest, write the report."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from executor.supervisor import interruptible
from pipesim.calibration.launcher import CYCLES
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.outputs import check_file, check_folder, write_text

DEFAULT_OUT = "pipesim-validate/validation.md"  # a folder of its own: never the tracked docs/ by accident

EXAMPLES = """examples:
  pipesim validate                              # the full grid, 48 runs each (~35 min on 2 cores) -> pipesim-validate/
  pipesim validate --hardware hw.toml           # predict with hw.toml (pipesim calibrate -o hw.toml), no refit
  pipesim validate --out docs/validation.md     # regenerate the repository's report (--out: overwrite on purpose)
  pipesim validate --rounds 3 --out /tmp/v.md   # a quarter of the runs (~9 min): noisier, see docs/validation.md
  pipesim validate --quick --out /tmp/v.md --img-dir /tmp/img   # 4 small 2-rank runs (the test uses this)
  pipesim validate --keep runs/                 # keep the measured timelines for pipesim plot
  pipesim validate --reuse runs/                # refit and rewrite the report from kept timelines
  pipesim validate --reuse a/ b/ c/             # pool kept campaigns: every configuration's runs from all
"""

VALIDATE_ROUNDS = 12  # torchrun launches per world size (x CYCLES passes: 48 runs per configuration; fewer: noisier)


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help=f"simulated vs measured step time and bubble -> {DEFAULT_OUT}",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few small 2-rank runs (seconds; for tests)")
    p.add_argument("--out", default=None, metavar="FILE.md",
                   help=f"report (default {DEFAULT_OUT}; a file tracked by git is only overwritten when named here)")
    p.add_argument("--img-dir", default=None, metavar="DIR", help="plots (default img/ next to the report)")
    p.add_argument("--hardware", metavar="PRESET|FILE",
                   help="predict with this hardware (e.g. what `pipesim calibrate -o` wrote) instead of fitting "
                        "one to the grid's 2-rank runs")
    p.add_argument("--no-png", action="store_true", help="skip the PNG plots (they need Chromium)")
    p.add_argument("--keep", metavar="DIR", help="keep the measured timelines in DIR")
    p.add_argument("--reuse", metavar="DIR", nargs="+",
                   help="do not measure: refit and report the timelines kept in DIR (several: pooled)")
    p.add_argument("--rounds", type=int, default=None, metavar="N",
                   help=f"torchrun launches per world size, each {CYCLES} passes over the plan (default "
                        f"{VALIDATE_ROUNDS}: {CYCLES * VALIDATE_ROUNDS} runs per configuration, ~35 min on 2 cores; "
                        "calibrate's default is fewer); fewer are quicker, noisier")
    p.set_defaults(func=interruptible(run))  # Ctrl-C/SIGTERM during a launch: every rank stopped, one line


def run(args: argparse.Namespace) -> int:
    if args.out is None:  # the default folder is made when the report is written
        out = Path(DEFAULT_OUT)
        check_folder(out.parent, "the report folder")
        if out.exists() and _tracked(out):
            raise PipesimError(f"{out} is tracked by git; name the report with --out to overwrite it")
    else:
        out = check_file(args.out, "--out", "md")
    img = check_folder(args.img_dir, "--img-dir") or out.parent / "img"
    check_folder(args.keep, "--keep")
    hardware = load_hardware(args.hardware) if args.hardware else None
    if hardware is not None and hardware.host is None:  # the runs are the executor's on this machine's CPU
        raise PipesimError(f"--hardware {args.hardware}: validate predicts the executor's CPU runs here, which need a "
                           "[host] profile (pipesim calibrate -o FILE writes one; local-cpu has one)")
    if args.rounds is not None and not 1 <= args.rounds <= 100:
        raise PipesimError(f"--rounds {args.rounds}: must be between 1 and 100")
    if args.reuse and args.rounds is not None:
        raise PipesimError("--rounds measures; --reuse refits kept timelines: give one of them")
    for d in args.reuse or []:
        if not Path(d).is_dir():
            raise PipesimError(f"--reuse {d}: no such directory")

    from pipesim.calibration.campaign import CampaignConfig, run_campaign  # local import: numpy, not at start-up
    from pipesim.calibration.report import render  # local import: numpy (via the fit), not at start-up

    command = (" ".join(["pipesim", "validate", *sys.argv[2:]]) if sys.argv[1:2] == ["validate"]
               else "pipesim validate")
    with tempfile.TemporaryDirectory(prefix="pipesim-validate-") as tmp:
        workdirs = tuple(Path(d) for d in args.reuse) if args.reuse else (Path(args.keep or tmp),)
        report = run_campaign(CampaignConfig(
            quick=args.quick, workdirs=workdirs, img=img, out=out, png=not args.no_png, command=command,
            rounds=args.rounds or (1 if args.quick else VALIDATE_ROUNDS), reuse=bool(args.reuse),
            hardware=hardware, hardware_source=args.hardware or ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, render(report))
    h = report.held
    print(f"held-out: {h.count} configurations, mean error {h.mean_error:.1%}, max {h.max_error:.1%}; "
          f"fit: mean {report.fit.mean_error:.1%}; ranking {h.pairs_preserved}/{h.pairs_checked} pairs kept")
    print(f"wrote {out}")
    return 0


def _tracked(path: Path) -> bool:
    """Whether git tracks `path` (False outside a repository or without git)."""
    try:
        done = subprocess.run(["git", "ls-files", "--error-unmatch", path.name], capture_output=True, check=False,
                              cwd=path.parent)
    except OSError:
        return False
    return done.returncode == 0
