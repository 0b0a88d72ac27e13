"""Step time: pipesim's executor against torch.distributed.pipelining (ScheduleGPipe, Schedule1F1B).

Both run inside the same torchrun processes, alternating single steps (torch, pipesim, torch, ...),
so load from other processes on the machine hits both alike. Same model (the lecture's
MLP: `layers` x (Linear(h, h) + GELU) from one seed, so both hold identical weights), same data
(executor.models.synthetic_batch's recipe), world size, batch, microbatches, MSE loss and SGD step,
one thread per rank, gloo. A step is timed from the first rank's start to the last rank's end
(batch creation excluded, optimizer step included); reported: each side's median after warm-up, and the
median of the per-step ratios pipesim/torch (paired, so the most robust to load).

    .venv/bin/python bench/bench_executor.py                        # hidden 1024, 8 layers, batch 64, m 8, 2 ranks
    .venv/bin/python bench/bench_executor.py --steps 40 --json out/bench_executor.json
    pipesim bench executor -- --schedules gpipe --hidden 512

The first-step losses of both sides are printed: equal losses show both trained the same network.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from executor.launch import rank_environment
from executor.supervisor import run_reported
from pipesim.cli import OneLineParser
from pipesim.model.config import ModelConfig, split_layers

LABELS = {"gpipe": "GPipe", "1f1b": "1F1B"}


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="pipesim bench executor", description=__doc__.splitlines()[0])
    p.add_argument("--schedules", default="gpipe,1f1b", help="gpipe and/or 1f1b (default both)")
    p.add_argument("--nproc", type=int, default=2, help="pipeline ranks = stages (default 2)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=20, help="steps per side, warm-up included (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write both sides' step times (seconds) to FILE")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # set by the driver under torchrun
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p


# -- the worker: both sides in the same processes ------------------------------------------------------

def _spans(local: list[tuple[int, int]], world: int) -> list[float]:
    """Seconds per step, first rank's start to last rank's end (perf_counter_ns is CLOCK_MONOTONIC,
    comparable across processes on one machine)."""
    import torch.distributed as dist

    gathered: list = [None] * world
    dist.all_gather_object(gathered, local)
    return [(max(g[i][1] for g in gathered) - min(g[i][0] for g in gathered)) / 1e9 for i in range(len(local))]


def _torch_side(args: argparse.Namespace, name: str, rank: int, world: int):
    """A PipelineStage over this rank's slice of the MLP under the torch schedule; returns step(i) -> (t0, t1)."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from executor.models import piece_seed  # local import: torch, kept out of the launcher's start-up

    split = split_layers(args.layers, world)
    lo = sum(split[:rank])
    full = []
    for index in range(args.layers):  # the same draws as executor.models.build_piece: each layer its own seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(piece_seed(args.seed, index))
            full.append(nn.Linear(args.hidden, args.hidden))
    layers: list[nn.Module] = []
    for fc in full[lo:lo + split[rank]]:
        layers += [fc, nn.GELU()]
    module = nn.Sequential(*layers)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    sched = cls(stage, args.microbatches, loss_fn=lambda out, y: F.mse_loss(out, y))
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    losses_seen: list[float] = []

    def step(i: int) -> tuple[int, int]:
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + i + 1)  # executor's synthetic_batch
        x = torch.randn(args.batch, args.hidden, generator=gen)
        y = torch.randn(args.batch, args.hidden, generator=gen)
        losses: list = []
        start = time.perf_counter_ns()
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end = time.perf_counter_ns()
        if losses:
            losses_seen.append(float(torch.stack(losses).detach().mean()))
        return start, end

    return step, losses_seen


def _pipesim_side(args: argparse.Namespace, name: str, world: int):
    """The pipesim executor's Runtime for the same run; None when the executor is not importable."""
    try:
        from executor.mesh import build_mesh_for
        from executor.run_config import RunConfig
        from executor.runtime import Runtime
    except ImportError as exc:
        print(f"bench_executor: pipesim executor unavailable ({exc})", file=sys.stderr)
        return None
    import torch

    model = ModelConfig(kind="mlp", hidden=args.hidden, layers=args.layers, batch=args.batch, seed=args.seed)
    cfg = RunConfig(names=(name,), stages=world, microbatches=args.microbatches, model=model, steps=1, warmup=0,
                    optimizer="sgd", lr=0.01, backend="gloo", quiet=True)  # one step per train() call
    sched = cfg.check(world)[0]
    return Runtime(cfg, sched, build_mesh_for(cfg.job_for(world).dims), torch.device("cpu"))


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    report = {}
    for name in args.schedules.split(","):
        torch_step, torch_losses = _torch_side(args, name, rank, world)
        rt = _pipesim_side(args, name, world)
        t_spans: list = []
        p_spans: list = []
        for i in range(args.steps):  # alternate single steps so drifting load hits both sides alike
            dist.barrier()
            t_spans.append(torch_step(i))
            dist.barrier()
            if rt is not None:
                rt.train()  # one step (cfg.steps = 1)
                p_spans.append(rt.log.steps[-1])
        entry: dict = {}
        for side, spans in (("torch", t_spans), ("pipesim", p_spans)):
            if spans:
                times = _spans(spans, world)
                entry[side] = {"step_time": statistics.median(times[args.warmup:]), "step_times": times}
        if p_spans:
            pairs = zip(entry["pipesim"]["step_times"][args.warmup:], entry["torch"]["step_times"][args.warmup:])
            entry["paired_ratio"] = statistics.median(p / t for p, t in pairs)  # median of per-step ratios
        first: list = [None] * world
        dist.all_gather_object(first, (torch_losses[:1], rt.log.losses[:1] if rt is not None else []))
        entry["first_loss"] = {"torch": first[-1][0][0], "pipesim": (first[-1][1] or [None])[0]}
        report[name] = entry
    if rank == 0:
        Path(args.out).write_text(json.dumps(report))
    dist.destroy_process_group()


# -- the driver -----------------------------------------------------------------------------------------

def _launch(args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           __file__, "--worker", "--out", str(out), "--schedules", args.schedules, "--hidden", str(args.hidden),
           "--layers", str(args.layers), "--batch", str(args.batch), "--microbatches", str(args.microbatches),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed)]
    # both peers run in the same job, under the environment `pipesim run` gives its ranks
    code = run_reported(cmd, rank_environment({**os.environ, "OMP_NUM_THREADS": "1"}), prefix="pipesim-bench-",
                        stdout_to_log=True)
    if code:  # the line saying why (a failing rank, or a signal) is printed already
        raise SystemExit(code)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    names = [n for n in args.schedules.split(",") if n]
    if not names or any(n not in LABELS for n in names) or args.steps <= args.warmup:
        print("bench_executor: --schedules takes gpipe and/or 1f1b; --steps must exceed --warmup", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        report = _launch(args, Path(tmp) / "bench.json")
    result = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "load_avg_before": load_before,
              "backend": "gloo", "config": {k: v for k, v in vars(args).items() if k not in ("worker", "out")},
              "runs": report, "ratio": {}}
    for n in names:
        r = report[n]
        tt = r["torch"]["step_time"]
        line = f"torch {LABELS[n]}: {tt:.4f} s"
        if "pipesim" in r:
            ot = r["pipesim"]["step_time"]
            result["ratio"][n] = ot / tt
            line += (f", pipesim {n}: {ot:.4f} s, ratio pipesim/torch = {ot / tt:.3f}"
                     f" (median of per-step ratios {r['paired_ratio']:.3f})")
        else:
            line += ", pipesim: not run (executor unavailable)"
        fl = r["first_loss"]
        line += f"  (first-step loss torch {fl['torch']:.6f}"
        line += f", pipesim {fl['pipesim']:.6f})" if fl["pipesim"] is not None else ")"
        print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
