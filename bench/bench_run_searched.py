"""zb-auto's searched order against its unit-cost order and zb-h2, measured by `pipesim run` on this CPU box.

One torchrun chain per repeat (`pipesim run zb-h2 ... --then zb-auto ... --then --from-csv unit.csv`, the
registry's unit-cost zb-auto order as torch CSV; the three rotated from repeat to repeat) in one process
group; prints each order's median measured step time over the repeats, its ratio to zb-h2's, and what
the simulator predicts for it on the order's hardware (local-cpu). The box is shared and has 2 cores for
4 ranks: read ratios, not seconds, and repeat.

    python bench/bench_run_searched.py [--repeats 3] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import schedules
from executor.run_config import RunConfig
from pipesim.commands.run_orders import order_hardware
from pipesim.ir import torch_csv
from pipesim.model.config import ModelConfig
from pipesim.sim.sim_setup import SimSetup

MODEL = ModelConfig(kind="gpt", hidden=128, layers=8, heads=4, seq=64, vocab=4096, batch=32)
FLAGS = ["--model", "gpt", "--hidden", "128", "--layers", "8", "--heads", "4", "--seq", "64", "--vocab", "4096",
         "--batch", "32", "-m", "8", "--backend", "gloo", "--quiet"]
P = 4


def simulated() -> dict[str, float]:
    """Seconds per step the simulator predicts for the three orders (makespan, local-cpu)."""
    cfg = RunConfig(names=("zb-auto",), microbatches=8, model=MODEL, backend="gloo")
    setup = SimSetup(order_hardware(cfg, None, P), MODEL, job=cfg.job_for(P), check_memory=False)
    unit = schedules.build("zb-auto", P, 8)
    costs = setup.costs(unit)
    return {"zb-h2": setup.simulate(schedules.build("zb-h2", P, 8), costs).makespan,
            "zb-auto (searched)": setup.simulate(setup.tuned(unit, costs), costs).makespan,
            "zb-auto (unit-cost order)": setup.simulate(unit, costs).makespan}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    labels = ("zb-h2", "zb-auto (searched)", "zb-auto (unit-cost order)")
    times: dict[str, list[float]] = {k: [] for k in labels}
    with tempfile.TemporaryDirectory() as tmp:
        unit_csv = Path(tmp) / "unit.csv"
        unit_csv.write_text(torch_csv.dumps(schedules.build("zb-auto", P, 8)))
        runs_of = {"zb-h2": ["zb-h2"], "zb-auto (searched)": ["zb-auto"],
                   "zb-auto (unit-cost order)": ["--from-csv", str(unit_csv)]}
        for i in range(args.repeats):
            order = labels[i % 3:] + labels[:i % 3]  # rotated: no order always runs first in the process group
            cmd = [sys.executable, "-m", "pipesim", "run"]
            outs = []
            for n, label in enumerate(order):
                outs.append(Path(tmp) / f"r{i}-{n}.json")
                cmd += [*(["--then"] if n else []), *runs_of[label], *(["--nproc", str(P)] if not n else []),
                        *FLAGS, "--steps", str(args.steps), "--json", str(outs[-1])]
            subprocess.run(cmd, check=True, env=env, cwd=root)
            for label, path in zip(order, outs):
                data = json.loads(path.read_text())
                times[label].append(data.get("runs", [data])[0]["step_time"])
    sim = simulated()
    base = statistics.median(times["zb-h2"])
    print("| order | measured step (s, median) | vs zb-h2 | simulated (s) | simulated vs zb-h2 |")
    print("|---|---|---|---|---|")
    for label in labels:
        t = statistics.median(times[label])
        print(f"| {label} | {t:.3f} | {t / base:.3f} | {sim[label]:.3f} | {sim[label] / sim['zb-h2']:.3f} |")


if __name__ == "__main__":
    main()
