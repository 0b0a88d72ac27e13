"""Measurement runs under torchrun: the executor's own per-action timelines, a P2P ping-pong, all_reduce.

Calibration and validation measure in the conditions of a real run, so this worker drives the
executor's `Runtime` (the code `pipesim run` uses) for a whole plan of configurations inside one
process group: one torchrun start (seconds of imports and rendezvous) serves many runs.

  python -m torch.distributed.run --standalone --nproc-per-node 2 -m pipesim.calibration.runs PLAN.json OUTDIR

PLAN.json: {"runs": [{"id", "schedule", "microbatches", "virtual", "model": {...}, "steps", "warmup"}],
"comm": bool, "cycles": K}. The runs are made K times over, passing through the whole list (odd
passes in reverse order), so each is sampled at K moments of the launch rather than in one block
(a shared VM's speed drifts).
Rank 0 writes OUTDIR/<id>.json for the first cycle and OUTDIR/<id>.cycle<k>.json for the others
(measured Timelines whose meta holds step_times and the speed probe timed just before and after
the run) and, with "comm", OUTDIR/comm.json (ping-pong seconds per size, all_reduce busbw, all_to_all seconds, copy
bandwidth).

The speed probe is a fixed single-threaded workload (the lecture MLP's layers at 8 rows, forward
and backward) that rank 0 times while the other ranks wait. It is a witness, not a correction: its
spread over a campaign shows how much the machine's own speed moved (on a shared VM, by tens of
percent within minutes). Rescaling runs by it was tried and made repeats agree less, because a
probe of a few tens of milliseconds catches one moment of a speed that changes within a second.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from executor.run_config import RunConfig
from pipesim.model.config import ModelConfig

# torch and the executor are imported inside the functions that run in the worker: `launch` imports
# this module for `timeline_name`, and `pipesim validate --reuse` must start without torch.

PINGPONG_SIZES = (4, 1024, 65536, 1 << 20, 8 << 20)  # bytes
ALLREDUCE_SIZES = (1 << 20, 16 << 20)  # bytes
ALLTOALL_SIZES = (128 << 10, 1 << 20)  # bytes: a small MoE layer's token exchange (docs/moe.md) and a larger one


def speed_probe(iters: int = 8) -> float:
    """Median seconds of one forward + backward of 4 Linear(1024, 1024) + ReLU layers on 8 rows, one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        weights = [torch.randn(1024, 1024, generator=gen).div_(32).requires_grad_() for _ in range(4)]
        x = torch.randn(8, 1024, generator=gen)
        times = []
        for it in range(iters + 2):  # two untimed
            t0 = time.perf_counter()
            y = x
            for w in weights:
                y = torch.relu(y @ w)
            y.sum().backward()
            if it >= 2:
                times.append(time.perf_counter() - t0)
            for w in weights:
                w.grad = None
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


def _probe_on_rank0() -> float:
    """The speed probe on rank 0 while the other ranks wait in a barrier (0.0 on the others)."""
    import torch.distributed as dist

    dist.barrier()
    seconds = speed_probe() if dist.get_rank() == 0 else 0.0
    dist.barrier()
    return seconds


def timeline_name(run_id: str, cycle: int) -> str:
    """File name of one cycle's timeline of a run."""
    return f"{run_id}.json" if cycle == 0 else f"{run_id}.cycle{cycle}.json"


def _run_one(spec: dict, world: int, out: Path | None, cycle: int = 0) -> None:
    import torch
    import torch.distributed as dist

    from executor import timing
    from executor.mesh import build_mesh_for
    from executor.runtime import Runtime

    cfg = RunConfig(names=(spec["schedule"],), microbatches=spec["microbatches"], virtual=spec.get("virtual"),
                    model=ModelConfig(**spec["model"]), steps=spec["steps"], warmup=spec["warmup"],
                    backend="gloo", quiet=True)  # the runtime records every action's start and end
    sched = cfg.check(world)[0]
    mesh = build_mesh_for(cfg.job_for(world).dims)
    rt = Runtime(cfg, sched, mesh, torch.device("cpu"))
    before = _probe_on_rank0()
    log = rt.train(None)
    after = _probe_on_rank0()
    timing.resolve(log, rt.program, rt.transfers.peer_of, rt.transfers.transfer_bytes)
    logs = timing.gather(log)
    if mesh.rank == 0 and out is not None:
        times = timing.step_times(logs)
        meta = {"id": spec["id"], "schedule": sched.name, "p": world, "m": sched.num_microbatches,
                "v": sched.model_stages // world, "model": spec["model"], "steps": spec["steps"],
                "warmup": spec["warmup"], "step_times": times, "world_size": world,
                "probe": (before + after) / 2, "probe_before": before, "probe_after": after, "cycle": cycle}
        timing.to_timeline(logs, sched.name, meta).write(out / timeline_name(spec["id"], cycle))
    dist.barrier()


def _pingpong(nbytes: int, iters: int) -> float:
    """Seconds of one one-way message of `nbytes` between ranks 0 and 1: median round trip / 2."""
    import torch
    import torch.distributed as dist

    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
    rank = dist.get_rank()
    dist.barrier()
    trips = []
    for it in range(iters + 2):  # two untimed round trips
        start = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        if it >= 2:
            trips.append(time.perf_counter() - start)
    return statistics.median(trips) / 2


def memory_bandwidth(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Bytes/s of a single-threaded tensor copy (read + write), best of `repeats`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(nbytes // 4)
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return 2 * nbytes / best


def _comm(out: Path) -> None:
    import torch
    import torch.distributed as dist

    from executor.collectives_bench import measure

    pp = {n: _pingpong(n, 20 if n < (1 << 20) else 5) for n in PINGPONG_SIZES}
    ar = [measure("all_reduce", n, 5, 1, torch.device("cpu")) for n in ALLREDUCE_SIZES]
    a2a = [measure("all_to_all", n, 20, 5, torch.device("cpu")) for n in ALLTOALL_SIZES]
    if dist.get_rank() == 0:
        data = {"pingpong": [[n, t] for n, t in pp.items()], "memory_bandwidth": memory_bandwidth(),
                "all_reduce": [{"bytes": r.bytes, "time": r.time, "busbw": r.busbw} for r in ar],
                "all_to_all": [{"bytes": r.bytes, "time": r.time, "busbw": r.busbw} for r in a2a],
                "world_size": dist.get_world_size()}
        (out / "comm.json").write_text(json.dumps(data, indent=1))


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    plan = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(plan.get("timeout", 120))))
    try:
        world = dist.get_world_size()
        if plan.get("comm") and world >= 2:
            _comm(out)
        if plan["runs"]:  # an untimed run first: the first one after start-up is slower (allocator, caches)
            _run_one({**plan["runs"][0], "steps": 2}, world, None)
        for cycle in range(int(plan.get("cycles", 1))):
            # odd passes go backwards: over the cycles every run sits, on average, mid-pass, so a
            # drift of the launch (the machine's, the processes' own) cannot favour early runs
            for spec in plan["runs"] if cycle % 2 == 0 else plan["runs"][::-1]:
                _run_one(spec, world, out, cycle)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
