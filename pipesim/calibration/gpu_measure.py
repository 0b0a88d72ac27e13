"""Time what the kernel model needs on one CUDA GPU (GEMMs, a copy, memory-bound kernels, launches, flash attention)
and NCCL.

Loaded only by `pipesim calibrate --gpu` (it imports torch). Each kernel is timed with CUDA events
around `iters` back-to-back calls after `warmup` calls, the median of three such rounds (perf_counter
on the CPU, which only the tests use: the same code paths on a tiny grid). With more than one GPU the
collectives run under torchrun (executor/collectives_bench.py, as `pipesim bench collectives`). The
records go to pipesim.calibration.gpu, which turns them into a hardware file; nothing is fitted here.
"""

from __future__ import annotations

import datetime
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from executor.collectives_config import CollectivesConfig
from executor.launch import rank_environment
from executor.supervisor import run_reported
from pipesim.calibration.gpu import collective_records
from pipesim.device import gpu_measurements as rec
from pipesim.errors import PipesimError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
FP8 = rec.FP8_GEMM  # torch._scaled_mm on E4M3 operands, per-tensor float32 scales, bf16 output (FP8 tensor cores)
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


@dataclass(frozen=True)
class Grid:
    """What one calibration times: GEMM sizes (m, n, k each over `gemm_sizes`), flash shapes, the copy."""

    gemm_sizes: tuple[int, ...]
    dtypes: tuple[str, ...]  # GEMM dtypes; flash attention runs in the first
    flash: tuple[tuple[int, int, int, int], ...]  # (batch, seq, heads, head_dim), causal and not
    copy_bytes: int  # bytes of the copied buffer (moved: twice that, read + write)
    iters: int  # timed calls per round
    warmup: int  # untimed calls first
    collective_sizes: tuple[int, ...] = (8 << 10, 1 << 20, 64 << 20, 256 << 20)  # bytes, NCCL (> 1 GPU)
    # memory-bound kernels: attention scores (batch x heads, s, s) for softmax and dropout; (tokens, width) rows for
    # layer norm and GeLU (a 22B layer at b 4, tp 8: 32 x 2048 x 2048 scores, 8192 x 6144 rows)
    scores: tuple[int, int] = (32, 2048)
    rows: tuple[int, int] = (8192, 6144)
    # seconds of the largest GEMM back to back: its rate once the clock has settled under the board's power limit
    sustain_seconds: float = 20.0


GPU_GRID = Grid((256, 1024, 4096, 8192), ("bfloat16", "float16", FP8), ((4, 2048, 32, 128), (1, 8192, 32, 128)),
                1 << 30, 10, 3)  # 128 16-bit GEMMs, about a minute on an H100; 64 FP8 ones more on an FP8 GPU
# (those not yet timed on one)
QUICK_GRID = Grid((1024, 8192), ("bfloat16", FP8), ((4, 2048, 32, 128),), 1 << 30, 5, 2, (8 << 10, 64 << 20),
                  sustain_seconds=5.0)
CPU_GRID = Grid((32, 64), ("float32", FP8), ((1, 64, 2, 16),), 1 << 20, 2, 1, scores=(2, 64),
                rows=(64, 32), sustain_seconds=0.05)  # the tests: these paths on a CPU (torch runs _scaled_mm there)


def one_round(dev: torch.device, fn, iters: int) -> float:
    """Seconds per call of `iters` back-to-back calls (CUDA events on a GPU, perf_counter on a CPU)."""
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(dev)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize(dev)
        return start.elapsed_time(end) / 1e3 / iters  # ms -> s
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def timer(dev: torch.device, fn, iters: int, warmup: int) -> float:
    """Seconds per call: median of 3 rounds of `iters` back-to-back calls (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    return statistics.median(one_round(dev, fn, iters) for _ in range(3))


def has_fp8(dev: torch.device) -> bool:
    """Whether `dev` runs torch._scaled_mm: FP8 tensor cores (compute capability 8.9 on), or a CPU (torch's own)."""
    return dev.type != "cuda" or torch.cuda.get_device_capability(dev) >= (8, 9)


def gemm_call(dev: torch.device, name: str, m: int, n: int, k: int):
    """A callable running one (m x k) @ (k x n) GEMM of dtype `name` on random operands: torch.matmul, or for FP8
    torch._scaled_mm on E4M3 operands (the second column-major, as cuBLASLt's FP8 GEMM takes it) with float32
    per-tensor scales and a bf16 output, what Transformer Engine and torchao run."""
    if name != FP8:
        a = torch.randn(m, k, device=dev, dtype=DTYPES[name])
        b = torch.randn(k, n, device=dev, dtype=DTYPES[name])
        return partial(torch.matmul, a, b)
    a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=dev)
    return partial(torch._scaled_mm, a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def measure_sustained(dev: torch.device, grid: Grid, name: str | None = None) -> rec.Record:
    """The grid's largest square GEMM (dtype `name`, default the first) back to back for `sustain_seconds`; the
    median seconds per call of the rounds in the last quarter, when the clock has settled under the power limit (the
    grid's GEMMs, like MAMF's figure, time bursts of a few dozen calls)."""
    name, n = name or grid.dtypes[0], max(grid.gemm_sizes)
    fn = gemm_call(dev, name, n, n, n)
    rounds: list[tuple[float, float]] = []  # (seconds since the start at the round's end, seconds per call)
    t0 = time.perf_counter()
    while not rounds or rounds[-1][0] < grid.sustain_seconds:
        per_call = one_round(dev, fn, grid.iters)
        rounds.append((time.perf_counter() - t0, per_call))
    last = [s for t, s in rounds if t >= 0.75 * rounds[-1][0]]
    return rec.Record(rec.GEMM_SUSTAINED, name, (1, n, n, n), 0, statistics.median(last))


def runnable_dtypes(dev: torch.device, grid: Grid) -> tuple[str, ...]:
    """The grid's dtypes `dev` runs: FP8 only where it has FP8 tensor cores (an A100 times the rest)."""
    return tuple(d for d in grid.dtypes if d != FP8 or has_fp8(dev))


def measure_gemms(dev: torch.device, grid: Grid) -> list[rec.Record]:
    out = []
    for name in runnable_dtypes(dev, grid):
        for m in grid.gemm_sizes:
            for n in grid.gemm_sizes:
                for k in grid.gemm_sizes:
                    seconds = timer(dev, gemm_call(dev, name, m, n, k), grid.iters, grid.warmup)
                    out.append(rec.Record(rec.GEMM, name, (1, m, n, k), 0, seconds))
    return out


def measure_copy(dev: torch.device, grid: Grid) -> rec.Record:
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    x = torch.empty(grid.copy_bytes // torch.empty((), dtype=dtype).element_size(), dtype=dtype, device=dev)
    y = torch.empty_like(x)
    moved = 2 * x.numel() * x.element_size()  # read + write
    seconds = timer(dev, partial(y.copy_, x), grid.iters, grid.warmup)
    return rec.Record(rec.COPY, str(dtype).removeprefix("torch."), (), moved, seconds)


def measure_memory_bound(dev: torch.device, grid: Grid) -> list[rec.Record]:
    """torch's softmax and dropout over attention scores, layer norm and GeLU over rows, in the first GEMM dtype
    (float32 on a CPU); bytes as pipesim.model.layer_kernels counts them (dropout's mask: 1 byte per element)."""
    dtype = DTYPES[grid.dtypes[0]] if dev.type == "cuda" else torch.float32
    name = str(dtype).removeprefix("torch.")
    heads, s = grid.scores
    tokens, width = grid.rows
    scores = torch.randn(heads, s, s, device=dev, dtype=dtype)
    rows = torch.randn(tokens, width, device=dev, dtype=dtype)
    d, n_scores, n_rows = scores.element_size(), scores.numel(), rows.numel()
    cases = (("softmax", partial(F.softmax, scores, -1), 2 * n_scores * d),
             ("dropout", partial(F.dropout, scores, 0.1, True), 2 * n_scores * d + n_scores),
             ("layer_norm", partial(F.layer_norm, rows, (width,)), 2 * n_rows * d),
             ("gelu", partial(F.gelu, rows), 2 * n_rows * d))
    return [rec.Record(kind, name, (), moved, timer(dev, fn, grid.iters, grid.warmup)) for kind, fn, moved in cases]


def measure_launches(dev: torch.device, grid: Grid) -> list[rec.Record]:
    """Three timings of a one-element add: the per-kernel overhead (its median is kept)."""
    x = torch.zeros(1, device=dev)
    return [rec.Record(rec.LAUNCH, "float32", (), 0, timer(dev, partial(x.add_, 1), max(grid.iters, 100),
                                                           grid.warmup)) for _ in range(3)]


def _attention(q, k, v, causal: int):
    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))


def _attention_step(q, k, v, causal: int, grad) -> None:
    """Forward and backward: the backward's time is this minus the forward's."""
    torch.autograd.grad(_attention(q, k, v, causal), (q, k, v), grad)


def measure_flash(dev: torch.device, grid: Grid) -> list[rec.Record]:
    out = []
    dtype = grid.dtypes[0]
    for b, s, heads, head_dim in grid.flash:
        for causal in (0, 1):
            q, k, v = (torch.randn(b, heads, s, head_dim, device=dev, dtype=DTYPES[dtype], requires_grad=True)
                       for _ in range(3))
            grad = torch.randn(b, heads, s, head_dim, device=dev, dtype=DTYPES[dtype])
            fwd = timer(dev, partial(_attention, q, k, v, causal), grid.iters, grid.warmup)
            both = timer(dev, partial(_attention_step, q, k, v, causal, grad), grid.iters, grid.warmup)
            shape = (b, s, heads, head_dim, causal)
            out += [rec.Record(rec.FLASH_FWD, dtype, shape, 0, fwd),
                    rec.Record(rec.FLASH_BWD, dtype, shape, 0, max(both - fwd, 1e-9))]
    return out


def measure_collectives(nproc: int, grid: Grid) -> list[rec.Record]:
    """NCCL all_reduce, all_gather, reduce_scatter, send_recv over `nproc` GPUs, under torchrun."""
    with tempfile.TemporaryDirectory(prefix="pipesim-gpu-calibrate-") as tmp:
        report = Path(tmp) / "collectives.json"
        cfg = CollectivesConfig(sizes=grid.collective_sizes, ops=COLLECTIVE_OPS, iters=20, warmup=2, backend="nccl",
                                json=str(report)).check()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "executor.collectives_bench", "--config", cfg.to_json()]
        code = run_reported(cmd, rank_environment(), prefix="pipesim-gpu-collectives-")
        if code:
            raise PipesimError(f"the NCCL collectives over {nproc} GPUs failed (exit {code}); the line above says "
                               "why")
        return collective_records(report)


def measure(grid: Grid, device: str = "cuda", *, collectives: bool = True) -> rec.Measurements:
    """Every record of `grid` on `device` ("cuda": GPU 0, NCCL over all GPUs when more than one; "cpu": tests)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise PipesimError("--gpu needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False); "
                           "without one, build the file from a recorded run: --from-measurements FILE")
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device(device)
    unknown = [d for d in grid.dtypes if d not in DTYPES and d != FP8]
    if unknown:
        raise PipesimError(f"unknown dtype {', '.join(unknown)}; choose from {', '.join((*DTYPES, FP8))}")
    gpus = torch.cuda.device_count() if dev.type == "cuda" else 0
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    meta = {"device": name, "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "gpus": str(gpus)}
    if dev.type == "cuda":
        meta["memory"] = str(torch.cuda.get_device_properties(dev).total_memory)  # bytes
    records = [*measure_launches(dev, grid), measure_copy(dev, grid), *measure_memory_bound(dev, grid),
               *measure_gemms(dev, grid), measure_sustained(dev, grid), *measure_flash(dev, grid)]
    if FP8 in runnable_dtypes(dev, grid) and grid.dtypes[0] != FP8:  # its own clock under the limit (gpu_model.md)
        records.append(measure_sustained(dev, grid, FP8))
    if collectives and gpus > 1:
        torch.cuda.empty_cache()  # the grid's cached blocks on GPU 0, before NCCL's ranks allocate there
        records += measure_collectives(gpus, grid)
    return rec.Measurements(meta, tuple(records))


__all__ = ["CPU_GRID", "FP8", "GPU_GRID", "Grid", "QUICK_GRID", "runnable_dtypes", "gemm_call", "has_fp8", "measure",
           "measure_collectives", "measure_memory_bound", "measure_sustained", "one_round", "timer"]
