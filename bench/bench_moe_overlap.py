"""DualPipeV on the MoE model with expert parallelism: its overlapped F&B measured against the same order run without
overlap, and the simulator's prediction of that ratio beside it.

With overlap (the default) each OVERLAP_F_B pair issues its forward chunk's first all-to-all asynchronously and
runs the paired backward before waiting for it (executor.runtime); `--no-a2a-overlap` runs the pair's halves back
to back, the same order and the same exchanges. Both run in one torchrun launch, alternating (overlap, plain,
overlap, plain, ...), so load from other processes hits both alike; each run's `step_time` is its median step
after warm-up, and the ratio reported is the median of the rounds' plain / overlap (paired).

The prediction: `pipesim simulate`'s setup for the same model, layout and hardware profile, once for DualPipeV as
registered and once for the same programs with no overlapped pair (each pair's halves timed one after the other).

    .venv/bin/python bench/bench_moe_overlap.py                    # 2 ranks: dp 2, ep 2, pp 1, on local-cpu
    .venv/bin/python bench/bench_moe_overlap.py --nproc 4 --rounds 2 --json out/moe_overlap.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import schedules
from pipesim.cli import build_parser
from pipesim.commands.setup_args import setup_from_args

ROOT = Path(__file__).resolve().parent.parent


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks: dp 2 x ep 2 and pp = nproc / 2 (default 2)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--ffn", type=int, default=256, help="width of one expert")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=6, help="steps per run, warm-up included (default 6)")
    p.add_argument("--rounds", type=int, default=3, help="overlap/plain pairs of runs (default 3)")
    p.add_argument("--hardware", default="local-cpu", help="the profile the prediction uses (default local-cpu)")
    p.add_argument("--json", metavar="FILE", help="write the step times and both ratios to FILE")
    return p


def model_flags(a: argparse.Namespace) -> list[str]:
    return ["--model", "moe", "--hidden", str(a.hidden), "--heads", str(a.heads), "--seq", str(a.seq),
            "--vocab", "256", "--layers", str(a.layers), "--batch", str(a.batch), "--num-experts", str(a.experts),
            "--moe-router-topk", str(a.topk), "--moe-ffn-hidden-size", str(a.ffn)]


def measure(a: argparse.Namespace, folder: Path) -> tuple[list[float], list[float]]:
    """Step times (seconds) of the overlapped and the plain runs, round by round, from one launch."""
    run = ["dualpipev", "--dp", "2", "--ep", "2", "--microbatches", str(a.microbatches), *model_flags(a),
           "--steps", str(a.steps), "--warmup", "2", "--quiet"]
    argv = [sys.executable, "-m", "pipesim", "run", "--nproc", str(a.nproc)]
    for r in range(a.rounds):
        if r:
            argv.append("--then")
        argv += [*run, "--json", str(folder / f"overlap{r}.json"), "--then", *run, "--no-a2a-overlap",
                 "--json", str(folder / f"plain{r}.json")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run(argv, cwd=ROOT, env=env, check=True)
    read = [json.loads((folder / f"{kind}{r}.json").read_text())["step_time"]
            for r in range(a.rounds) for kind in ("overlap", "plain")]
    return read[0::2], read[1::2]


def predict(a: argparse.Namespace) -> tuple[float, float]:
    """The simulator's step (seconds) for DualPipeV as registered and with its pairs run one half after the other."""
    pp = a.nproc // 2
    args = build_parser().parse_args(["simulate", "dualpipev", "-p", str(pp), "-m", str(a.microbatches),
                                      *model_flags(a), "--dp", "2", "--ep", "2", "--hardware", a.hardware])
    setup = setup_from_args(args)
    sched = schedules.build("dualpipev", pp, a.microbatches)
    overlapped, _ = setup.evaluate(sched)
    plain, _ = setup.evaluate(replace(sched, overlaps=frozenset()))
    return overlapped.to_dict()["makespan"], plain.to_dict()["makespan"]


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.nproc % 2 or a.nproc < 2:
        raise SystemExit("bench_moe_overlap: --nproc must be even (dp 2 x pp)")
    with tempfile.TemporaryDirectory(prefix="bench-moe-") as tmp:
        overlap, plain = measure(a, Path(tmp))
    ratios = [p / o for o, p in zip(overlap, plain, strict=True)]
    sim_overlap, sim_plain = predict(a)
    print(f"DualPipeV, --model moe (hidden {a.hidden}, {a.experts} experts, top-{a.topk}), dp 2 x ep 2, "
          f"pp {a.nproc // 2}, {a.microbatches} microbatches, {a.nproc} gloo ranks")
    print(f"measured step, overlap:    {', '.join(f'{t * 1e3:.1f}' for t in overlap)} ms "
          f"(median {statistics.median(overlap) * 1e3:.1f})")
    print(f"measured step, no overlap: {', '.join(f'{t * 1e3:.1f}' for t in plain)} ms "
          f"(median {statistics.median(plain) * 1e3:.1f})")
    print(f"measured ratio no-overlap / overlap: {statistics.median(ratios):.3f} "
          f"(rounds: {', '.join(f'{r:.3f}' for r in ratios)})")
    print(f"predicted on {a.hardware}: {sim_plain * 1e3:.2f} / {sim_overlap * 1e3:.2f} ms = "
          f"{sim_plain / sim_overlap:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "overlap_step_times": overlap, "plain_step_times": plain, "measured_ratio": statistics.median(ratios),
            "predicted_overlap": sim_overlap, "predicted_plain": sim_plain,
            "predicted_ratio": sim_plain / sim_overlap}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
