"""`pipesim validate`: measure the validation grid, calibrate on its 2-rank part, predict the rest, write the report."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from pipesim.calibration.launch import CYCLES
from pipesim.errors import PipesimError

EXAMPLES = """examples:
  pipesim validate                              # the full grid, 48 runs each (~35 min on 2 cores) -> docs/validation.md
  pipesim validate --rounds 3 --out /tmp/v.md   # a quarter of the runs (~9 min): noisier, see docs/validation.md
  pipesim validate --quick --out /tmp/v.md --img-dir /tmp/img   # 4 small 2-rank runs (the test uses this)
  pipesim validate --keep runs/                 # keep the measured timelines for pipesim plot
  pipesim validate --reuse runs/                # refit and rewrite the report from kept timelines
  pipesim validate --reuse a/ b/ c/             # pool kept campaigns: every configuration's runs from all
"""

VALIDATE_ROUNDS = 12  # torchrun launches per world size (x CYCLES passes: 48 runs per configuration; fewer: noisier)


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="simulated vs measured step time and bubble -> docs/validation.md",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few small 2-rank runs (seconds; for tests)")
    p.add_argument("--out", default="docs/validation.md", metavar="FILE.md", help="report (default docs/validation.md)")
    p.add_argument("--img-dir", default=None, metavar="DIR", help="plots (default docs/img next to the report)")
    p.add_argument("--no-png", action="store_true", help="skip the PNG plots (they need Chromium)")
    p.add_argument("--keep", metavar="DIR", help="keep the measured timelines in DIR")
    p.add_argument("--reuse", metavar="DIR", nargs="+",
                   help="do not measure: refit and report the timelines kept in DIR (several: pooled)")
    p.add_argument("--rounds", type=int, default=None, metavar="N",
                   help=f"torchrun launches per world size, each {CYCLES} passes over the plan (default "
                        f"{VALIDATE_ROUNDS}: {CYCLES * VALIDATE_ROUNDS} runs per configuration, ~35 min on 2 cores; "
                        "calibrate's default is fewer); fewer are quicker, noisier")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if not out.parent.is_dir():
        raise PipesimError(f"cannot write {out}: directory {out.parent} does not exist")
    img = Path(args.img_dir) if args.img_dir else out.parent / "img"
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
            rounds=args.rounds or (1 if args.quick else VALIDATE_ROUNDS), reuse=bool(args.reuse)))
    out.write_text(render(report))
    h = report.held
    print(f"held-out: {h.count} configurations, mean error {h.mean_error:.1%}, max {h.max_error:.1%}; "
          f"fit: mean {report.fit.mean_error:.1%}; ranking {h.pairs_preserved}/{h.pairs_checked} pairs kept")
    print(f"wrote {out}")
    return 0
