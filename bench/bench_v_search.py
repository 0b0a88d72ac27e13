"""zb-v searched (pipesim/cost/v_search.py): the V order the ILP finds under a per-rank activation limit, against
the handcrafted V orders (zb-v, v-half, v-min), on abstract costs and on a model's simulated costs.

Part 1, abstract per-chunk seconds (unit activation per chunk, limits in chunk stashes per rank): for each
(p, m, costs, limit), the makespan of each handcrafted order that fits, the search's warm start, its answer,
its bound and gap, whether proven, and the solve's wall seconds. Part 2, a GPT costed on dgx-h100 (the limit
zb-v's own peak, or a multiple of 1F1B's activations: p microbatches of a rank's two chunks): the simulated
step and peak activations of zb-v's handcrafted order and of the searched one (SimSetup with --ilp and
--memory-limit), so the simulator times what the search returned. Wall seconds depend on the machine; say
which when quoting them.

    python bench/bench_v_search.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import time

from pipesim.cost.v_search import search_v
from pipesim.cost.zb_auto_costs import MemoryLimit
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.schedule import v_placement
from pipesim.model.config import ModelConfig
from pipesim.sim.sim_setup import SimSetup
from schedules.placed_graph import fits, placed_measure
from schedules.v_memory import v_half, v_min
from schedules.zb_inputs import AutoCosts
from schedules.zero_bubble_v import zb_v

ABSTRACT = [  # (p, m, F, I, W per chunk, hop, limit in chunk stashes per rank)
    (2, 3, 1.0, 1.0, 1.0, 0.0, 4.0), (2, 3, 1.0, 1.5, 0.7, 0.1, 4.0), (2, 3, 1.0, 1.5, 0.7, 0.1, 3.0),
    (3, 4, 1.0, 1.5, 0.7, 0.1, 6.0), (3, 4, 1.0, 1.5, 0.7, 0.1, 4.0), (4, 8, 1.0, 1.0, 1.0, 0.0, 8.0),
    (4, 8, 1.0, 1.5, 0.7, 0.1, 8.0), (4, 8, 1.0, 1.5, 0.7, 0.1, 6.0), (4, 8, 1.0, 1.5, 0.7, 0.1, 4.0),
]
MODEL = ModelConfig(kind="gpt", hidden=2048, layers=24, heads=16, seq=2048, vocab=32000, batch=32, dtype="bfloat16")


def costs_of(p: int, f: float, i: float, w: float, hop: float, limit: float) -> AutoCosts:
    s = 2 * p
    comm = tuple(0.0 if b == p - 1 else hop for b in range(s - 1))
    return AutoCosts((f,) * s, (i,) * s, (w,) * s, comm, (1.0,) * s, (limit,) * p)


def abstract(seconds: float) -> None:
    print("| p | m | F, I, W, hop | limit | zb-v | v-half | v-min | warm start | searched | bound | gap | proven | "
          "solve (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p, m, f, i, w, hop, limit in ABSTRACT:
        costs, placement = costs_of(p, f, i, w, hop, limit), v_placement(p)
        hand = []
        for build in (zb_v, v_half, v_min):
            programs = build(p, m).programs
            hand.append(f"{placed_measure(placement, programs, costs):g}" if fits(placement, programs, costs) else "-")
        found = search_v("zb-v", costs, p, m, time_limit=seconds)
        ilp = found.ilp
        print(f"| {p} | {m} | {f:g}, {i:g}, {w:g}, {hop:g} | {limit:g} | {' | '.join(hand)} | "
              f"{found.schedule.meta['warm_start']} {found.heuristic:g} | {found.value:g} | {found.bound:g} | "
              f"{found.gap:.1%} | {'yes' if ilp and ilp.optimal else 'no'} | {ilp.seconds if ilp else 0:.2f} |",
              flush=True)


def model(seconds: float) -> None:
    hw = load_hardware("dgx-h100")
    print("| p | m | limit | zb-v step (ms) | zb-v peak activations (GiB) | searched step (ms) | "
          "searched peak activations (GiB) | search wall (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for p, m, limit in ((2, 4, None), (4, 8, None), (4, 8, "0.75x"), (4, 8, "0.5x")):
        sched = zb_v(p, m)
        plain, plain_mem = SimSetup(hw, MODEL).evaluate(sched)
        mem = None if limit is None else MemoryLimit(multiple=float(limit[:-1]))
        t0 = time.perf_counter()
        searched, searched_mem = SimSetup(hw, MODEL, ilp_time_limit=seconds, memory_limit=mem).evaluate(sched)
        wall = time.perf_counter() - t0
        peak = [max(b.activations for b in m) / 2**30 for m in (plain_mem, searched_mem)]
        print(f"| {p} | {m} | {limit or 'zb-v own'} | {plain.makespan * 1e3:.2f} | {peak[0]:.2f} | "
              f"{searched.makespan * 1e3:.2f} | {peak[1]:.2f} | {wall:.1f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    abstract(args.seconds)
    print()
    model(args.seconds)


if __name__ == "__main__":
    main()
