"""`pipesim calibrate`: measure this machine inside real 2-rank runs and write a hardware TOML file."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from executor.supervisor import interruptible
from pipesim.calibration.gpu import assemble, measurements_path
from pipesim.commands.common import (
    add_model_args,
    add_structure_group,
    given_model_flags,
    model_config,
    user_model_config,
)
from pipesim.cost.user_model_costs import is_factory_spec
from pipesim.device import gpu_measurements as measured
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import hardware_to_toml, load_hardware
from pipesim.outputs import check_file, check_folder, write_text
from pipesim.trace_import import import_traces

EXAMPLES = """examples:
  pipesim calibrate -o hw.toml          # ~2.5 min on 2 cores: 8 executor runs x 12 (2, 4 ranks), ping-pong, all_reduce
  pipesim simulate 1f1b -p 2 -m 8 --model mlp --hardware hw.toml
  pipesim calibrate -o hw.toml --quick         # smaller runs (seconds), noisier figures
  pipesim calibrate -o hw.toml --quick --rescale local-cpu   # ~10 s: local-cpu's model at this machine's speed
  pipesim calibrate -o hw.toml --keep runs/    # keep the measured timelines (pipesim plot runs/*.json)
  pipesim calibrate -o hw.toml --from-trace traces/ --model my_model.py:make --batch 64   # a real run's traces
  pipesim calibrate -o h100.toml --gpu         # CUDA: GEMMs, HBM, launches, flash attention, NCCL (2-4 min)
  pipesim calibrate -o h100.toml --from-measurements h100.measurements.csv   # the same file from a recorded run
"""


DEVICES = 4  # --devices' default: ranks a CPU calibration's hardware file offers


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine (executor timelines, ping-pong) -> hardware TOML",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", required=True, metavar="FILE.toml", help="hardware file to write")
    p.add_argument("--quick", action="store_true", help="small models and few steps (for tests; noisier)")
    p.add_argument("--keep", metavar="DIR", help="keep the measured timelines and the plan in DIR")
    p.add_argument("--devices", type=int, default=None,
                   help=f"ranks the CPU hardware file offers (default {DEVICES}; not with --gpu)")
    p.add_argument("--rescale", metavar="PRESET|FILE", default=None,
                   help="with --quick: keep this CPU hardware file's model and fit one speed factor to three short "
                        "runs on this machine (~10 s; the precision it reaches is printed and kept in the file)")
    t = p.add_argument_group("from profiler traces (no executor runs; docs/your_model.md)")
    t.add_argument("--from-trace", nargs="+", metavar="TRACE", default=None,
                   help="fit to a real run's PyTorch profiler traces (one per rank, or a folder; as `pipesim "
                        "import-trace`) instead; needs --model: the run's model (mlp|gpt with its sizes, or "
                        "MODULE:FACTORY) and --batch, its global batch")
    t.add_argument("--schedule", metavar="NAME", default=None, help="the traced run's schedule (default: inferred)")
    t.add_argument("--hardware", metavar="PRESET|FILE", default=None,
                   help="where the link bandwidth comes from, which one-size messages cannot tell (default local-cpu); "
                        "with --gpu: the preset the measured figures go into (default: the family's)")
    g = p.add_argument_group("a CUDA GPU: kernels and NCCL -> a preset-format hardware file (docs/calibration.md)")
    g.add_argument("--gpu", action="store_true",
                   help="measure GPU 0 (GEMMs over shapes and dtypes, an HBM copy, kernel launches, flash attention) "
                        "and, with more than one GPU, NCCL collectives; keeps FILE.measurements.csv beside -o")
    g.add_argument("--from-measurements", metavar="FILE.csv", default=None,
                   help="build the hardware file from a recorded --gpu measurements file instead (no GPU needed)")
    g.add_argument("--family", default=None,
                   help="device profile the figures replace (A100, A100-PCIe, H100, H200, B200, B300; default: "
                        "the GPU's)")
    add_model_args(p, default=None)
    add_structure_group(p)  # a traced run's transformer: --model-config, its structure flags (pipesim run's)
    p.set_defaults(func=interruptible(run))  # Ctrl-C/SIGTERM during a launch: every rank stopped, one line


def run(args: argparse.Namespace) -> int:
    if args.gpu or args.from_measurements:
        return gpu(args)
    if args.family:
        raise PipesimError("--family names the GPU's device profile: give it with --gpu or --from-measurements")
    if args.from_trace:
        return from_trace(args)
    if args.model or args.model_config or args.schedule:
        raise PipesimError("--model, --model-config and --schedule describe a traced run: give them with --from-trace")
    mode = "--quick --rescale" if args.rescale else "the executor runs"
    unused = [(flag, "sizes a traced run's model (--from-trace)") for flag in _model_flags(args)]
    unused += [("--hardware", "names the base file of --from-trace or --gpu")] if args.hardware else []
    unused += [("--devices", "sets the ranks of a measured file; a rescaled one keeps its base's")] \
        if args.rescale and args.devices is not None else []
    if unused:
        flag, what = unused[0]
        raise PipesimError(f"{flag} {what}: it does nothing with {mode}")
    if args.rescale:
        return rescale(args)
    from pipesim.calibration.calibrate import calibrate  # local import: the fit loads numpy, not at start-up

    out = check_file(args.output, "-o", "toml")
    check_folder(args.keep, "--keep")
    devices = _devices(args)
    if devices < 2:
        raise PipesimError(f"--devices must be >= 2, got {devices}")
    cal, _ = calibrate(quick=args.quick, workdir=Path(args.keep) if args.keep else None, devices=devices)
    write_text(out, hardware_to_toml(cal.hardware))
    print(cal.summary())
    print(f"wrote {out}; use it with: pipesim simulate ... --hardware {out}, or check it: pipesim validate "
          f"--hardware {out}")
    return 0


def rescale(args: argparse.Namespace) -> int:
    """--quick --rescale FILE: FILE's model at this machine's speed (pipesim.calibration.rescale)."""
    from pipesim.calibration.launcher import measure_rounds  # local import: the launcher, at use only
    from pipesim.calibration.rescale import rescale as fit_rescale
    from pipesim.calibration.rescale import rescale_plan

    if not args.quick:
        raise PipesimError("--rescale is the quick calibration: give it with --quick")
    out = check_file(args.output, "-o", "toml")
    check_folder(args.keep, "--keep")
    base = load_hardware(args.rescale)
    if base.host is None:
        raise PipesimError(f"--rescale {args.rescale}: not a CPU hardware file (it has no [host] profile)")
    plan = rescale_plan()
    with tempfile.TemporaryDirectory(prefix="pipesim-rescale-") as tmp:
        timelines, _ = measure_rounds(plan, Path(args.keep) if args.keep else Path(tmp), 1, cycles=2)
    fit = fit_rescale(base, timelines, plan)
    write_text(out, hardware_to_toml(fit.hardware))
    print(fit.summary())
    print(f"wrote {out}; use it with: pipesim simulate ... --hardware {out}")
    return 0


def from_trace(args: argparse.Namespace) -> int:
    """Fit to imported profiler traces of a run of the given model; write the hardware file."""
    from pipesim.calibration.from_trace import calibrate_from_timelines  # local import: numpy, at use only

    out = check_file(args.output, "-o", "toml")
    if not args.model and not args.model_config:
        raise PipesimError("--from-trace needs --model: the traced run's model (mlp or gpt with its sizes, or "
                           "MODULE:FACTORY; or --model-config) and its --batch")
    for flag, given, what in (("--quick", args.quick, "shortens the executor runs"),
                              ("--keep", args.keep is not None, "keeps the executor runs' timelines"),
                              ("--rescale", args.rescale is not None, "rescales a CPU hardware file (with --quick)")):
        if given:
            raise PipesimError(f"{flag} {what}: it does nothing with --from-trace, which measures nothing")
    timeline = import_traces(args.from_trace, schedule=args.schedule)
    model = user = None
    if args.model and is_factory_spec(args.model):
        from executor.user_model import count_user_model  # local import: torch only with --model MODULE:FACTORY

        cfg = user_model_config(args)
        user = count_user_model(args.model, batch=cfg.batch, microbatches=timeline.meta["m"], seed=cfg.seed)
    else:
        model = model_config(args)
    cal = calibrate_from_timelines([timeline], model=model, user_model=user,
                                   base=load_hardware(args.hardware or "local-cpu"),
                                   devices=_devices(args))
    write_text(out, hardware_to_toml(cal.hardware))
    print(cal.summary())
    given = f"--model {args.model}" if args.model else f"--model-config {args.model_config}"
    print(f"wrote {out}; use it with: pipesim simulate {timeline.schedule} -p {timeline.meta['p']} -m "
          f"{timeline.meta['m']} {given} ... --hardware {out}")
    return 0


def gpu(args: argparse.Namespace) -> int:
    """Measure a CUDA GPU (or read a recorded measurement) and write a preset-format hardware file."""
    out = check_file(args.output, "-o", "toml")
    if out is None:
        raise PipesimError("-o names the hardware file to write (FILE.toml), not stdout")
    if args.gpu and args.from_measurements:
        raise PipesimError("--gpu measures, --from-measurements reads a recorded run: give one of them")
    mode = "--gpu" if args.gpu else "--from-measurements"
    if args.from_trace or args.model or args.model_config or args.schedule:
        raise PipesimError(f"--from-trace, --model, --model-config and --schedule calibrate from a traced run, not "
                           f"with {mode}")
    unused = [(flag, what) for flag, given, what in (
        ("--devices", args.devices is not None, "sets the ranks of a CPU calibration's file"),
        ("--keep", args.keep is not None, "keeps a CPU calibration's timelines"),
        ("--rescale", args.rescale is not None, "rescales a CPU hardware file (with --quick)"),
        ("--quick", args.quick and args.from_measurements is not None, "shortens --gpu's measurement"),
    ) if given] + [(flag, "sizes a traced run's model (--from-trace)") for flag in _model_flags(args)]
    if unused:
        flag, what = unused[0]
        raise PipesimError(f"{flag} {what}: it does nothing with {mode}")
    base = load_hardware(args.hardware) if args.hardware else None
    if args.from_measurements:
        data = measured.read(Path(args.from_measurements))
    else:
        from pipesim.calibration import gpu_measure  # local import: torch, only to measure

        data = gpu_measure.measure(gpu_measure.QUICK_GRID if args.quick else gpu_measure.GPU_GRID)
        kept = measurements_path(out)  # beside -o, whose folder check_file checked
        write_text(kept, measured.write(data.meta, list(data.records)))
        print(f"kept the measurements in {kept}")
    cal = assemble(data, family=args.family, base=base)
    write_text(out, hardware_to_toml(cal.hardware))
    print(cal.summary())
    print(f"wrote {out}; use it with: pipesim simulate ... --hardware {out}")
    return 0


def _devices(args: argparse.Namespace) -> int:
    """--devices, or its default."""
    return DEVICES if args.devices is None else args.devices


def _model_flags(args: argparse.Namespace) -> list[str]:
    """The traced run's model sizes given (--hidden, --batch, the experts'; not --seed, which sizes nothing)."""
    return [flag for flag, _ in given_model_flags(args)]
