"""Gloo's late RECV: how long an irecv lasts when its message was posted while the receiver computed.

The simulator charges such a RECV one fitted figure (`late_recv_delay`, the mean over the fit runs),
and on this 2-core VM that figure is heavy-tailed (median ~0.3 ms, mean ~1 ms in the executor's
runs; interleaved-1f1b's late RECVs average 40 % more than the fit runs'). This script isolates
the pattern in one torchrun job of 2 ranks (gloo, one thread each): rank 0 posts an isend, then
does `sender` for `--sender-ms`; rank 1 computes for `--receiver-ms`, then posts the irecv and
waits (a late RECV) and times it. Sender cases, alternated iteration by iteration so drifting load
hits all alike:

- `waits`: the sender blocks in a recv of its own (the receiver answers after its RECV);
- `small-ops`: the sender computes the executor's own op size (8 x 1024 @ 1024 x 1024 matmuls);
- `big-ops`: the sender computes one large matmul at a time (~10x fewer, longer ops);
- `sleeps`: the sender sleeps (its process holds no core).

Reported per case: median, mean, share above 1 ms, and the mean's ratio to `waits` (same job).

    .venv/bin/python bench/bench_late_recv.py                 # 60 iterations per case, ~30 s
    .venv/bin/python bench/bench_late_recv.py --iters 200 --json out/late_recv.json
    pipesim bench late-recv -- --sender-ms 8
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

CASES = ("waits", "small-ops", "big-ops", "sleeps")


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="pipesim bench late-recv", description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=60, help="late RECVs timed per case (default 60)")
    p.add_argument("--sender-ms", type=float, default=6.0, help="ms the sender works after its isend (default 6)")
    p.add_argument("--receiver-ms", type=float, default=2.0, help="ms the receiver computes before its irecv (2)")
    p.add_argument("--bytes", type=int, default=32768, help="message size (default 32768: the MLP's activation)")
    p.add_argument("--json", metavar="FILE", help="write the result as JSON")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    msg, answer = torch.zeros(args.bytes // 4), torch.zeros(1)
    w, small, big = torch.randn(1024, 1024), torch.randn(8, 1024), torch.randn(96, 1024)

    def compute(seconds: float, x) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            x @ w

    times: dict[str, list[float]] = {c: [] for c in CASES}
    for it in range(args.iters + 2):  # two untimed rounds
        for k, case in enumerate(CASES):
            tag = (it * len(CASES) + k) * 2
            dist.barrier()
            if rank == 0:
                work = dist.isend(msg, 1, tag=tag)
                if case == "waits":
                    dist.irecv(answer, 1, tag=tag + 1).wait()
                elif case == "sleeps":
                    time.sleep(args.sender_ms / 1e3)
                else:
                    compute(args.sender_ms / 1e3, small if case == "small-ops" else big)
                work.wait()
            else:
                compute(args.receiver_ms / 1e3, small)
                start = time.perf_counter()
                dist.irecv(msg, 0, tag=tag).wait()
                if it >= 2:
                    times[case].append(time.perf_counter() - start)  # seconds
                if case == "waits":
                    dist.isend(answer, 0, tag=tag + 1).wait()
    if rank == 1:
        Path(args.out).write_text(json.dumps(times))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    if args.iters < 1 or args.sender_ms <= 0 or args.receiver_ms <= 0 or args.bytes < 4:
        print("bench_late_recv: --iters, --sender-ms, --receiver-ms and --bytes (>= 4) must be positive",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "late.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
               "--worker", "--out", str(out), "--iters", str(args.iters), "--sender-ms", str(args.sender_ms),
               "--receiver-ms", str(args.receiver_ms), "--bytes", str(args.bytes)]
        code = run_reported(cmd, rank_environment({**os.environ, "OMP_NUM_THREADS": "1"}), prefix="pipesim-bench-",
                            stdout_to_log=True, timeout=600)
        if code:  # the line saying why (a failing rank, or a signal) is printed already
            return code
        times = json.loads(out.read_text())
    base = statistics.fmean(times["waits"])
    result = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "config": {
        k: v for k, v in vars(args).items() if k not in ("worker", "out", "json")}, "cases": {}}
    print(f"late RECV of {args.bytes} bytes, receiver computed {args.receiver_ms:g} ms, sender then works "
          f"{args.sender_ms:g} ms ({args.iters} per case, gloo, 2 ranks, {os.cpu_count()} cpus)")
    for case in CASES:
        v = times[case]
        entry = {"median": statistics.median(v), "mean": statistics.fmean(v),
                 "share_over_1ms": sum(t > 1e-3 for t in v) / len(v), "mean_vs_waits": statistics.fmean(v) / base}
        result["cases"][case] = {**entry, "seconds": v}
        print(f"  sender {case:9s}: median {entry['median'] * 1e3:5.2f} ms  mean {entry['mean'] * 1e3:5.2f} ms  "
              f">1 ms {entry['share_over_1ms']:4.0%}  mean / waits' {entry['mean_vs_waits']:5.2f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
