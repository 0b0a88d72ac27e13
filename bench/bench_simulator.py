"""Simulator speed: pipesim's discrete-event simulation vs torch.distributed.pipelining's unit-time dry run.

Both simulate the same lowered program (1F1B at every size, plus interleaved 1F1B p=32, m=256, v=2;
pipesim's, converted to torch `_Action`s): pipesim with
real durations and every P2P transfer holding its links, torch with every action one time unit
(`schedules._simulate_comms_compute`). Reports simulated actions per second and the ratio.

    .venv/bin/python bench/bench_simulator.py              # sizes up to p=64, m=1024
    .venv/bin/python bench/bench_simulator.py --quick      # small sizes only
    .venv/bin/python bench/bench_simulator.py --only 64x1024,32x256v2   # the two reference cases

Timings are CPU-time minima over repeats because the machine may be shared; compare the ratio.
The last two sizes show how each grows with longer programs.

torch's dry run pops from the front of Python lists and rescans every rank each time step, so it
grows faster than linearly; it is skipped at sizes where the previous size took over --torch-budget
seconds (the estimate for the skipped size is printed instead).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import schedules
from pipesim.cost.table import CostTable
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.lowering import add_p2p
from pipesim.sim.simulator import simulate

SIZES = [(4, 32), (8, 64), (16, 128), (32, 256), (64, 512), (64, 1024), (8, 4096), (64, 2048)]
INTERLEAVED = [(32, 256, 2)]  # (p, m, v) of interleaved 1F1B, run after the 1F1B sizes


def hardware_for(ranks: int):
    """DGX H100 nodes (8 GPUs, NVSwitch inside, InfiniBand between), as many as the ranks need."""
    base = load_hardware("dgx-h100" if ranks <= 8 else "4x-dgx-h100")
    nodes = max(1, -(-ranks // base.devices_per_node))
    return dataclasses.replace(base, name=f"{nodes}x-dgx-h100", num_nodes=nodes) if nodes > base.num_nodes else base


def best_of(fn, repeats: int):
    """Smallest CPU time of `repeats` calls (the machine is shared; CPU time and the minimum are the least noisy)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def time_pipesim(lowered, repeats: int) -> tuple[float, int, float]:
    """(seconds, actions, makespan) of simulate() on the lowered program, links modeled, result included."""
    p = lowered.num_ranks
    # a GPT-ish stage: 1 ms F, 2 ms B, 16 MiB per message, 64 MiB stashed per microbatch
    table = CostTable.uniform(lowered.num_stages, 1e-3, 1e-3, 1e-3, boundary_bytes=16 << 20, activation_bytes=64 << 20)
    hw = hardware_for(p)
    seconds, result = best_of(lambda: simulate(lowered, table, hw, comm=True), repeats)
    return seconds, result.num_actions(), result.makespan


def time_torch(lowered, repeats: int) -> tuple[float, int]:
    """(seconds, actions) of torch's dry run on the same lowered program."""
    from torch.distributed.pipelining.schedules import _Action, _simulate_comms_compute

    def run():
        order = {r: [_Action.from_str(str(a)) for a in prog] for r, prog in enumerate(lowered.programs)}
        t0 = time.process_time()
        _simulate_comms_compute(order, lowered.rank_of, lowered.num_stages)
        return time.process_time() - t0  # the conversion above is not torch's cost

    seconds = min(run() for _ in range(repeats))
    return seconds, lowered.num_actions()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the three smallest sizes")
    parser.add_argument("--max-actions", type=int, default=2_000_000, help="skip sizes with more actions")
    parser.add_argument("--repeats", type=int, default=3, help="best of N runs per size (default 3)")
    parser.add_argument("--only", default="", help="comma-separated cases such as 64x1024,32x256v2 (default: all)")
    parser.add_argument("--torch-budget", type=float, default=30.0, help="skip torch once a size took longer (s)")
    args = parser.parse_args()
    cases = [("1f1b", p, m, 1) for p, m in (SIZES[:3] if args.quick else SIZES)]
    cases += [] if args.quick else [("interleaved-1f1b", p, m, v) for p, m, v in INTERLEAVED]
    if args.only:
        wanted = set(args.only.split(","))
        cases = [c for c in cases if f"{c[1]}x{c[2]}" + (f"v{c[3]}" if c[3] > 1 else "") in wanted]
    print("1F1B (v = 1) and interleaved 1F1B (v = 2), both simulators fed the same lowered program "
          "(compute + SEND/RECV actions); best of "
          f"{args.repeats}; CPU seconds of this process")
    print(f"{'p':>3} {'m':>5} {'v':>2} {'actions':>8} | {'pipesim s':>9} {'actions/s':>10} | {'torch s':>9} "
          f"{'actions/s':>10} | {'pipesim faster by':>17} | {'lowering s':>10}")
    last_torch = 0.0
    for name, p, m, v in cases:
        if 2 * p * m * v * 3 > args.max_actions:
            continue
        sched = schedules.build(name, p, m, v) if v > 1 else schedules.build(name, p, m)
        lower_s, lowered = best_of(lambda s=sched: add_p2p(s), 1)
        ps, n, _ = time_pipesim(lowered, args.repeats)
        line = f"{p:>3} {m:>5} {v:>2} {n:>8} | {ps:>9.3f} {n / ps:>10.0f} | "
        if args.only or last_torch <= args.torch_budget:
            ts, tn = time_torch(lowered, args.repeats if last_torch < 5 else 1)
            assert tn == n, (tn, n)
            last_torch = ts
            line += f"{ts:>9.3f} {n / ts:>10.0f} | {ts / ps:>16.2f}x"
        else:
            line += f"{'skipped':>9} {'':>10} | {'':>17}"
        print(line + f" | {lower_s:>10.3f}", flush=True)
    print("pipesim: real durations, every transfer holds its links (DGX H100 nodes, NVSwitch + InfiniBand), "
          "memory and critical path recorded; torch: one time unit per action, no links.")
    print("lowering s: pipesim.ir.lowering.add_p2p (compute-only -> with SEND/RECV), paid once by `pipesim simulate`.")


if __name__ == "__main__":
    main()
