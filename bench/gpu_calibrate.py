"""GPU calibration of pipesim's kernel model: GEMMs, HBM copies, launches and flash attention on one GPU.

Run by bench/gpu_calibrate.sh (which adds NCCL collectives with more than one GPU); about a minute
on an H100. Writes, under --out:

- measurements.csv: one row per timed kernel (pipesim/device/measured.py's format);
- profile.toml: the base family's table of pipesim/presets/gemm/devices.toml with the measured
  figures (matmul_efficiency = best GEMM / peak, memory_efficiency, kernel_overhead, flash
  efficiencies) replaced and their source set to this run;
- a printed comparison: the GEMM model with the measured profile against every GEMM it timed.

    python bench/gpu_calibrate.py --out gpu_calibration                  # CUDA device 0
    python bench/gpu_calibrate.py --out gpu_calibration --family H200
    python bench/gpu_calibrate.py --out /tmp/cal --cpu-fallback          # tiny grid on the CPU (tests)
    python bench/gpu_calibrate.py --out cal --collectives-json cal/collectives.json  # merge NCCL results

Timing: CUDA events around `--iters` back-to-back calls after `--warmup` calls, the median of
three such rounds; the CPU fallback uses perf_counter. Nothing here is fitted: each figure is
one measured maximum or median, by the definitions docs/gpu_model.md gives.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from pipesim.device import measured as rec
from pipesim.device.profile import device_profile
from pipesim.device.reference import Measured, compare
from pipesim.errors import PipesimError

GPU_GEMM_SIZES = (256, 1024, 4096, 8192)  # m, n, k each: 64 shapes per dtype
CPU_GEMM_SIZES = (32, 64)
GPU_FLASH = ((4, 2048, 32, 128), (1, 8192, 32, 128))  # (b, s, heads, head_dim)
CPU_FLASH = ((1, 64, 2, 16),)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
FAMILIES = {"A100": "A100", "H100": "H100", "H200": "H200", "B200": "B200"}  # name fragment -> family


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for measurements.csv and profile.toml")
    p.add_argument("--family", default=None, help="base profile (A100, H100, H200, B200; default: from the GPU name)")
    p.add_argument("--dtypes", default="bfloat16,float16", help="GEMM dtypes (default bfloat16,float16)")
    p.add_argument("--iters", type=int, default=10, help="timed calls per round (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    p.add_argument("--cpu-fallback", action="store_true", help="tiny grid on the CPU in float32 (tests the paths)")
    p.add_argument("--collectives-json", default=None, help="a `pipesim bench collectives --json` file to merge")
    return p


def timer(dev: torch.device, fn, iters: int, warmup: int) -> float:
    """Seconds per call: median of 3 rounds of `iters` back-to-back calls (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    rounds = []
    for _ in range(3):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(dev)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize(dev)
            rounds.append(start.elapsed_time(end) / 1e3 / iters)  # ms -> s
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            rounds.append((time.perf_counter() - t0) / iters)
    return statistics.median(rounds)


def measure_gemms(dev, dtypes, sizes, iters, warmup) -> list[rec.Record]:
    out = []
    for name in dtypes:
        dt = DTYPES[name]
        for m in sizes:
            for n in sizes:
                for k in sizes:
                    a, b = torch.randn(m, k, device=dev, dtype=dt), torch.randn(k, n, device=dev, dtype=dt)
                    seconds = timer(dev, partial(torch.matmul, a, b), iters, warmup)
                    out.append(rec.Record(rec.GEMM, name, (1, m, n, k), 0, seconds))
    return out


def measure_copy(dev, nbytes: int, iters: int, warmup: int) -> rec.Record:
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32, device=dev)
    y = torch.empty_like(x)
    moved = 2 * x.numel() * x.element_size()  # read + write
    seconds = timer(dev, partial(y.copy_, x), iters, warmup)
    return rec.Record(rec.COPY, str(x.dtype).removeprefix("torch."), (), moved, seconds)


def measure_launch(dev, iters: int, warmup: int) -> rec.Record:
    x = torch.zeros(1, device=dev)
    return rec.Record(rec.LAUNCH, "float32", (), 0, timer(dev, lambda: x.add_(1), max(iters, 100), warmup))


def _attention(q, k, v, causal: int):
    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))


def _attention_step(q, k, v, causal: int, grad) -> None:
    """Forward and backward: the backward's time is this minus the forward's."""
    torch.autograd.grad(_attention(q, k, v, causal), (q, k, v), grad)


def measure_flash(dev, dtype: str, shapes, iters: int, warmup: int) -> list[rec.Record]:
    out = []
    dt = DTYPES[dtype]
    for b, s, heads, head_dim in shapes:
        for causal in (0, 1):
            q, k, v = (torch.randn(b, heads, s, head_dim, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
            grad = torch.randn(b, heads, s, head_dim, device=dev, dtype=dt)
            fwd = timer(dev, partial(_attention, q, k, v, causal), iters, warmup)
            both = timer(dev, partial(_attention_step, q, k, v, causal, grad), iters, warmup)
            shape = (b, s, heads, head_dim, causal)
            out += [rec.Record(rec.FLASH_FWD, dtype, shape, 0, fwd),
                    rec.Record(rec.FLASH_BWD, dtype, shape, 0, max(both - fwd, 1e-9))]
    return out


def collective_records(path: Path) -> list[rec.Record]:
    """Records from `pipesim bench collectives --json` (executor/collectives_bench.py's report)."""
    report = json.loads(Path(path).read_text())
    n = int(report["world_size"])
    return [rec.Record(r["op"], "float32", (n,), int(r["bytes"]), float(r["time"]))
            for r in report.get("results", []) if r["op"] in rec.COLLECTIVES]


def family_of(name: str) -> str:
    for fragment, family in FAMILIES.items():
        if fragment in name:
            return family
    raise PipesimError(f"no device profile for {name!r}; pass --family (A100, H100, H200, B200)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cpu = args.cpu_fallback or not torch.cuda.is_available()
        dev = torch.device("cpu") if cpu else torch.device("cuda", 0)
        gpu_name = "cpu" if cpu else torch.cuda.get_device_name(dev)
        family = args.family or ("H100" if cpu else family_of(gpu_name))
        base = device_profile(family)
        dtypes = ["float32"] if cpu else [d for d in args.dtypes.split(",") if d]
        unknown = [d for d in dtypes if d not in DTYPES]
        if unknown:
            raise PipesimError(f"unknown dtype {', '.join(unknown)}; choose from {', '.join(DTYPES)}")
        records = [measure_launch(dev, args.iters, args.warmup),
                   measure_copy(dev, 1 << (20 if cpu else 30), args.iters, args.warmup)]
        records += measure_gemms(dev, dtypes, CPU_GEMM_SIZES if cpu else GPU_GEMM_SIZES, args.iters, args.warmup)
        records += measure_flash(dev, dtypes[0], CPU_FLASH if cpu else GPU_FLASH, args.iters, args.warmup)
        if args.collectives_json:
            records += collective_records(Path(args.collectives_json))
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        meta = {"device": gpu_name, "family": family, "torch": torch.__version__,
                "cuda": str(torch.version.cuda), "date": when, "fallback": "cpu" if cpu else "no"}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "measurements.csv").write_text(rec.write(meta, records))
        data = rec.Measurements(meta, tuple(records))
        dtype = "float32" if cpu else dtypes[0]
        figures = rec.summarise(data, base, dtype)
        measured = base.with_measured(f"measured by bench/gpu_calibrate.py on {gpu_name}, {when}", **figures)
        (out / "profile.toml").write_text(rec.profile_toml(family, measured))
        rows = [Measured(*r.shape, dtype=dtype, flops_per_s=r.flops / r.seconds) for r in data.of(rec.GEMM)
                if r.dtype == dtype and dtype in measured.flops]
        found = ", ".join(f"{k} {v:.4g}" for k, v in figures.items())
        print(f"{gpu_name}: {len(records)} kernels timed; measured {found}")
        if rows:
            print(f"GEMM model with the measured profile vs this run's {dtype} GEMMs: "
                  f"{compare(rows, measured).summary()}")
        for kind, fig in rec.collective_figures(data).items():
            print(f"{kind}: busbw {fig['busbw'] / 1e9:.1f} GB/s at the largest size, "
                  f"{fig['small_message_seconds'] * 1e6:.1f} us at the smallest ({fig['ranks']:.0f} ranks)")
        print(f"wrote {out / 'measurements.csv'} and {out / 'profile.toml'}")
    except PipesimError as exc:
        print(f"gpu_calibrate: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
