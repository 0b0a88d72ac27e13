"""`pipesim calibrate`: measure this machine inside real 2-rank runs and write a hardware TOML file."""

from __future__ import annotations

import argparse
from pathlib import Path

from executor.supervisor import interruptible
from pipesim.errors import PipesimError
from pipesim.hardware_toml import hardware_to_toml
from pipesim.outputs import check_file, check_folder, write_text

EXAMPLES = """examples:
  pipesim calibrate -o hw.toml          # ~2.5 min on 2 cores: 8 executor runs x 12 (2, 4 ranks), ping-pong, all_reduce
  pipesim simulate 1f1b -p 2 -m 8 --model mlp --hardware hw.toml
  pipesim calibrate -o hw.toml --quick         # smaller runs (seconds), noisier figures
  pipesim calibrate -o hw.toml --keep runs/    # keep the measured timelines (pipesim plot runs/*.json)
"""


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine (executor timelines, ping-pong) -> hardware TOML",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", required=True, metavar="FILE.toml", help="hardware file to write")
    p.add_argument("--quick", action="store_true", help="small models and few steps (for tests; noisier)")
    p.add_argument("--keep", metavar="DIR", help="keep the measured timelines and the plan in DIR")
    p.add_argument("--devices", type=int, default=4, help="ranks the hardware file offers (default 4)")
    p.set_defaults(func=interruptible(run))  # Ctrl-C/SIGTERM during a launch: every rank stopped, one line


def run(args: argparse.Namespace) -> int:
    from pipesim.calibration.calibrate import calibrate  # local import: the fit loads numpy, not at start-up

    out = check_file(args.output, "-o", "toml")
    check_folder(args.keep, "--keep")
    if args.devices < 2:
        raise PipesimError(f"--devices must be >= 2, got {args.devices}")
    cal, _ = calibrate(quick=args.quick, workdir=Path(args.keep) if args.keep else None, devices=args.devices)
    write_text(out, hardware_to_toml(cal.hardware))
    print(cal.summary())
    print(f"wrote {out}; use it with: pipesim simulate ... --hardware {out}, or check it: pipesim validate "
          f"--hardware {out}")
    return 0
