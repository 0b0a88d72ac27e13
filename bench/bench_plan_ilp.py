"""The planner's added time for searching its finalists (`pipesim plan --ilp S`), as a ratio to the plan without.

For each model: `plan()` on one worker without and with `ilp_seconds` (zb-auto / zb-2p on the best
`finalists` layouts, their orders searched by the heuristic and the Zero Bubble paper's ILP), the wall
seconds of each, their ratio, what the finalists' search tried, and both winners. Wall seconds depend on
the machine; say which when quoting them.

    python bench/bench_plan_ilp.py [--seconds 2] [--finalists 3]
"""

from __future__ import annotations

import argparse
import time

from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig
from pipesim.plan.search import plan
from pipesim.plan.space import PlanRequest

CASES = {  # name -> (model, hardware, GPUs, largest tp)
    "gpt-6.7b-a100x8-tp1": (ModelConfig(kind="gpt", hidden=4096, layers=32, heads=32, seq=1024, vocab=32000,
                                        batch=64, dtype="bfloat16"), "dgx-a100", 8, 1),
    "gpt-6.7b-a100x8-tp2": (ModelConfig(kind="gpt", hidden=4096, layers=32, heads=32, seq=1024, vocab=32000,
                                        batch=64, dtype="bfloat16"), "dgx-a100", 8, 2),
    "gpt-1.3b-h100x8": (ModelConfig(kind="gpt", hidden=2048, layers=24, heads=16, seq=2048, vocab=32000, batch=32,
                                    dtype="bfloat16"), "dgx-h100", 8, None),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--finalists", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| case | plan (s) | with --ilp (s) | ratio | finalists tried / simulated / improved / added | winner | "
          "winner with --ilp |")
    print("|---|---|---|---|---|---|---|")
    for name, (model, hw_name, gpus, max_tp) in CASES.items():
        req = PlanRequest(model, load_hardware(hw_name), gpus, max_tp=max_tp)
        plain, with_ilp = [], []
        for _ in range(args.repeat):  # interleaved, best of each: the first plan of a process pays its imports
            t0 = time.perf_counter()
            base = plan(req, progress=False, workers=1)
            t1 = time.perf_counter()
            searched = plan(req, progress=False, workers=1, ilp_seconds=args.seconds, finalists=args.finalists)
            t2 = time.perf_counter()
            plain.append(t1 - t0)
            with_ilp.append(t2 - t1)
        a, b = min(plain), min(with_ilp)
        c = searched.counts
        print(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.2f} | "
              f"{c['finalists_tried']} / {c['finalists_simulated']} / {c['finalists_improved']} / "
              f"{c['finalists_added']} | {base.best.candidate.label()} {base.best.step_time * 1e3:.1f} ms | "
              f"{searched.best.candidate.label()} {searched.best.step_time * 1e3:.1f} ms |", flush=True)


if __name__ == "__main__":
    main()
