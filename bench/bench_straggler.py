"""A slow rank's cost, predicted against measured: `pipesim run --slow RANK=FACTOR` on this CPU machine.

For each schedule (default 1f1b, interleaved-1f1b, zb-h1; 2 ranks, the lecture MLP), one torchrun job runs
the step unperturbed and then with `--slow RANK=FACTOR` (the rank's compute stretched by sleeping the
extra time), alternating `--rounds` times so that drifting load hits both alike; the measured loss
is the median over the (plain, slow) pairs, run back to back, of slow step / plain step, minus 1.
Two predictions of that loss:

- model: `pipesim simulate` of the schedule on `--hardware` (default local-cpu; `make demo`'s
  out/local-cpu.toml is this machine's), unperturbed and with `--slow`;
- replay: the plain run's own trace replayed through the simulator (`pipesim whatif`), unperturbed and
  with `--slow`: the measured durations, the slow rank's stretched.

Printed per schedule: measured, model and replay loss, and each prediction's ratio to the measured one.

    .venv/bin/python bench/bench_straggler.py                       # ~1 min on 2 cores
    .venv/bin/python bench/bench_straggler.py --factor 2 --json out/straggler.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import schedules
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig
from pipesim.sim import replay
from pipesim.sim.perturb import Perturbation
from pipesim.sim.sim_setup import SimSetup
from pipesim.timeline import Timeline

MODEL = ["--model", "mlp", "--hidden", "1024", "--layers", "8", "--batch", "64"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schedules", default="1f1b,interleaved-1f1b,zb-h1")
    p.add_argument("--microbatches", "-m", type=int, default=8)
    p.add_argument("--rank", type=int, default=1, help="the slow rank (default 1)")
    p.add_argument("--factor", type=float, default=1.5, help="its compute stretched by this (default 1.5)")
    p.add_argument("--steps", type=int, default=6, help="steps per run, 2 of them warm-up (default 6)")
    p.add_argument("--rounds", type=int, default=2, help="plain/slow pairs per schedule (default 2)")
    p.add_argument("--hardware", default="local-cpu",
                   help="what the model prediction runs on; a comma list gives one column each (default local-cpu)")
    p.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    return p


def _chain(names: list[str], args: argparse.Namespace, tmp: Path) -> list[str]:
    """One `pipesim run` with every (schedule, round, plain|slow) after `--then`."""
    argv: list[str] = []
    for name in names:
        for rnd in range(args.rounds):
            for slow in (False, True):
                tag = f"{name}-{rnd}-{'slow' if slow else 'plain'}"
                # both traced: recording costs time on 2 cores, and the plain and slow runs must pay it alike
                one = [name, "-m", str(args.microbatches), *MODEL, "--steps", str(args.steps), "--warmup", "2",
                       "--quiet", "--json", str(tmp / f"{tag}.json"), "--trace", str(tmp / f"{tag}.trace.json")]
                if slow:
                    one += ["--slow", f"{args.rank}={args.factor:g}"]
                argv += (["--then"] if argv else []) + one
    return [sys.executable, "-m", "pipesim", "run", "--nproc", "2", *argv]


def _step(path: Path) -> float:
    return float(json.loads(path.read_text())["step_time"])


def _model_loss(name: str, args: argparse.Namespace, hardware: str) -> float:
    setup = SimSetup(load_hardware(hardware), ModelConfig(kind="mlp", hidden=1024, layers=8, batch=64),
                     check_memory=False)
    sched = schedules.build(name, 2, args.microbatches)
    base = setup.run(sched).step_time
    slow = replace(setup, perturb=Perturbation(slow=((args.rank, args.factor),))).run(sched)
    return slow.step_time / base - 1


def _replay_loss(trace: Path, args: argparse.Namespace) -> float:
    rec = replay.record(Timeline.read(trace))
    base = replay.run(rec).makespan
    return replay.run(rec, Perturbation(slow=((args.rank, args.factor),))).makespan / base - 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    names = [n for n in args.schedules.split(",") if n]
    hardware = [h for h in args.hardware.split(",") if h]
    with tempfile.TemporaryDirectory(prefix="pipesim-straggler-") as d:
        tmp = Path(d)
        subprocess.run(_chain(names, args, tmp), check=True)
        rows = []
        for name in names:
            plain = [_step(tmp / f"{name}-{r}-plain.json") for r in range(args.rounds)]
            slow = [_step(tmp / f"{name}-{r}-slow.json") for r in range(args.rounds)]
            measured = statistics.median(b / a for a, b in zip(plain, slow, strict=True)) - 1  # adjacent pairs
            replayed = statistics.median(_replay_loss(tmp / f"{name}-{r}-plain.trace.json", args)
                                         for r in range(args.rounds))
            models = {hw: _model_loss(name, args, hw) for hw in hardware}
            rows.append({"schedule": name, "plain_step": statistics.median(plain), "slow_step": statistics.median(slow),
                         "plain_steps": plain, "slow_steps": slow, "measured_loss": measured,
                         "replay_loss": replayed, "replay_ratio": replayed / measured,
                         "model_loss": models, "model_ratio": {hw: x / measured for hw, x in models.items()}})
    print(f"slow rank {args.rank} x{args.factor:g}, 2 ranks, m {args.microbatches}, lecture MLP, {args.rounds} "
          f"plain/slow pairs; loss = median pair's slow step / plain step - 1; ratio = predicted loss / measured loss")
    cols = "".join(f" {'model ' + str(n + 1):>9} {'ratio':>6}" for n in range(len(hardware)))
    print(f"{'schedule':<18} {'plain ms':>9} {'slow ms':>9} {'measured':>9} {'replay':>9} {'ratio':>6}{cols}")
    for r in rows:
        models = "".join(f" {r['model_loss'][hw]:+9.1%} {r['model_ratio'][hw]:6.2f}" for hw in hardware)
        print(f"{r['schedule']:<18} {r['plain_step'] * 1e3:9.2f} {r['slow_step'] * 1e3:9.2f} "
              f"{r['measured_loss']:+9.1%} {r['replay_loss']:+9.1%} {r['replay_ratio']:6.2f}{models}")
    for n, hw in enumerate(hardware, start=1):
        print(f"model {n}: pipesim simulate on {hw}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
