"""zb-h2 against the searched zb-2p on the Zero Bubble paper's 12 settings, costed by pipesim on dgx-a100
(`--nodes` p / 8: one to four nodes, as the paper's 8 to 32 A100s).

The paper's GPT models (its Table 3: layers, heads, hidden, sequence 1024, microbatch size, p, m; the first
and last stage one layer fewer, as the paper splits them; GPT-2's vocabulary, 50257) on pipesim's A100
preset, one stage per rank, no tensor or data parallelism. For each: the simulated makespan of zb-h2 (the
handcrafted order) and of zb-2p (searched for these costs under 2x 1F1B's activation memory), and
`makespan_lower_bound` (no order of these costs ends sooner), so the table says how much any search could
still win. `--vocab N` changes the vocabulary (pipesim's default GPT vocabulary is 1024); `--split even` puts the middle
stages' layer count on every stage.

    python bench/zb_paper_settings.py [--vocab 50257] [--models 1.5B,6.2B] [--split paper|even]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import schedules
from pipesim.cost.zb_auto_costs import makespan_lower_bound
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.sim_setup import SimSetup

# model -> (layers, heads, hidden, p, microbatch size, m's): the paper's Table 3
MODELS = {"1.5B": (22, 24, 2304, 8, 6, (24, 32, 64)), "6.2B": (30, 32, 4096, 8, 3, (24, 32, 64)),
          "14.6B": (46, 40, 5120, 16, 1, (48, 64, 128)), "28.3B": (62, 48, 6144, 32, 1, (96, 128, 256))}


def paper_split(layers: int, p: int) -> tuple[int, ...]:
    """The paper's cut: the first and the last stage one layer fewer than the others."""
    mid = (layers + 2) // p
    return (mid - 1,) + (mid,) * (p - 2) + (mid - 1,)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--split", choices=("paper", "even"), default="paper",
                    help="layers per stage: the paper's (end stages one fewer) or pipesim's even split of "
                         "p x the middle stages' layers")
    args = ap.parse_args()
    base = load_hardware("dgx-a100")
    print("| model | p | m | zb-h2 (ms) | zb-2p (ms) | lower bound (ms) | zb-h2 over bound | zb-2p over bound | "
          "zb-2p search (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        layers, heads, hidden, p, mbs, ms = MODELS[name]
        hw = base.with_nodes(max(1, p // 8))  # the paper's 8 to 32 A100s: 1 to 4 nodes on InfiniBand
        for m in ms:
            model = ModelConfig(kind="gpt", hidden=hidden, heads=heads, seq=1024, vocab=args.vocab, layers=layers,
                                batch=m * mbs, dtype="bfloat16")
            if args.split == "even":  # as many layers on every stage as the paper's middle ones
                model = replace(model, layers=paper_split(layers, p)[1] * p)
            split = paper_split(layers, p) if args.split == "paper" else None
            setup = SimSetup(hardware=hw, model=model, layer_split=split, check_memory=False)
            h2 = setup.run(schedules.build("zb-h2", p, m)).makespan
            registry = schedules.build("zb-2p", p, m)
            costs = setup.costs(registry)
            t0 = time.perf_counter()
            tuned = setup.tuned(registry, costs)
            search = time.perf_counter() - t0
            two = setup.simulate(tuned, costs).makespan
            par = ParallelDims(pp=p)
            comm = [hw.p2p_time(par.rank(pp=s), par.rank(pp=s + 1), costs.table.stages[s].boundary_bytes)
                    for s in range(p - 1)]
            bound = makespan_lower_bound(costs.table, p, m, comm)
            print(f"| {name} | {p} | {m} | {h2 * 1e3:.1f} | {two * 1e3:.1f} | {bound * 1e3:.1f} | "
                  f"{h2 / bound - 1:.2%} | {two / bound - 1:.2%} | {search:.1f} |", flush=True)


if __name__ == "__main__":
    main()
