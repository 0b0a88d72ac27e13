"""Time FP8 GEMMs beside BF16 ones, and the casts FP8 adds, on the layer shapes of bench/gpu_layer_configs.py.

  python bench/gpu_fp8.py OUT_DIR [--only LABELS] [--recipe delayed|tensorwise] [--budget SECONDS]
  python bench/gpu_fp8.py OUT_DIR --device cpu --tiny      # the same code paths on a CPU (the tests)

pipesim times an FP8 GEMM with the GEMM model at the family's FP8 peak and achievable fraction
(pipesim/presets/gemm/fp8.toml) and each cast as a memory-bound kernel of its bytes (pipesim.model.fp8_kernels).
This measures both on one GPU. For each case, the FP8 layer's kernels (its linears' forward, dgrad and wgrad GEMMs,
hybrid format: E4M3 activations and weights, E5M2 gradients) are timed:
  gemm    torch._scaled_mm on FP8 operands (per-tensor float32 scales, bf16 output), and torch.matmul on the same
          shape in bf16, one record each (dtype float8 / bfloat16);
  memory  each cast (x * scale -> FP8, with the transposed copy a TN-only GPU needs), amax (|x|.max()) and FP8
          transpose kernel of the model, as Transformer Engine's Float8Quantizer runs it when TE is installed (impl
          "te"), and as torch runs it eagerly and under torch.compile (impls "eager", "compiled").
Each by the clock (CUDA events, median of 3 rounds). Writes OUT_DIR/fp8.csv (FIELDS) and OUT_DIR/meta.json, the
format of the other recordings in tests/data. Nothing here is fitted. Without a CUDA device (and no --device cpu)
it says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from gpu_layer_configs import CASES, TINY_CASES, LayerCase
from gpu_run import record_case, write_meta

from pipesim.calibration.gpu_measure import timer
from pipesim.model.fp8 import Fp8Options
from pipesim.model.fp8_kernels import FP8, GATHERED, fp8_layer_kernels
from pipesim.model.kernel_types import Gemm, MemoryBound, PieceKernels

FIELDS = ("case", "phase", "kernel", "kind", "dtype", "impl", "m", "n", "k", "batch", "nbytes", "flops", "seconds")
E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"


@dataclass(frozen=True)
class GemmSpec:
    """One FP8 GEMM of a layer: C (m x n) = A (m x k) @ B (k x n), `batch` times, and its operands' formats."""

    phase: str
    name: str
    m: int
    n: int
    k: int
    batch: int
    a: str  # torch dtype name of A (hybrid: the gradient is E5M2)
    b: str


@dataclass(frozen=True)
class CastSpec:
    """One memory-bound FP8 kernel: a cast, an amax or a transpose of a rows x cols tensor, and the model's bytes."""

    phase: str
    name: str
    op: str  # "cast", "amax" or "transpose"
    rows: int
    cols: int
    transposed: bool  # a cast that also writes the transposed copy
    nbytes: int  # the model's bytes (pipesim.model.fp8_kernels)


def fp8_kernels(case: LayerCase, recipe: str, tn_only: bool) -> PieceKernels:
    """The case's fused layer kernels with its linears in FP8 (hybrid format, `recipe`)."""
    return fp8_layer_kernels(case.kernels(True), Fp8Options("hybrid", recipe), dtype_bytes=case.model.dtype_bytes,
                             tn_only=tn_only, tp=case.opts.tp, sp=case.opts.sp)


def gemm_specs(pk: PieceKernels) -> list[GemmSpec]:
    """The FP8 GEMMs of each phase with hybrid operands: forward E4M3 x E4M3, dgrad dY (E5M2) x W (E4M3), wgrad
    X^T (E4M3) x dY (E5M2)."""
    out = []
    for phase in "FIW":
        for g in pk.phase(phase):
            if isinstance(g, Gemm) and g.dtype == FP8:
                a, b = (E5M2, E4M3) if g.name.endswith(" dgrad") else (E4M3, E5M2) if g.name.endswith(" wgrad") \
                    else (E4M3, E4M3)
                out.append(GemmSpec(phase, g.name, g.m, g.n, g.k, g.batch, a, b))
    return out


def cast_specs(pk: PieceKernels, tn_only: bool, *, tp: int = 1, sp: bool = False) -> list[CastSpec]:
    """Each FP8 memory-bound kernel with the tensor it reads: an input's (tokens x inputs, from its forward GEMM; the
    rank's shard of the column-parallel linears' input under sequence parallelism, cast without its transpose), an
    output gradient's (tokens x outputs, from its dgrad GEMM), a gathered input's FP8 transpose (from its wgrad)."""
    shapes = {g.name: g for ph in "FIW" for g in pk.phase(ph) if isinstance(g, Gemm)}
    casts_later = {k.name.removesuffix(" cast") for k in pk.W if k.name.endswith(" cast")}
    out = []
    for phase in "FIW":
        for k in pk.phase(phase):
            if not isinstance(k, MemoryBound) or not k.name.endswith((" cast", " amax", " transpose")):
                continue
            what, op = k.name.rsplit(" ", 1)
            if op == "transpose":  # "<linear> input transpose": the wgrad's X^T (m = inputs, k = tokens)
                g = shapes[what.removesuffix(" input") + " wgrad"]
                out.append(CastSpec(phase, k.name, op, g.batch * g.k, g.m, False, k.nbytes))
            elif what.endswith(" input (column-wise)"):  # a kept bf16 input cast again for its wgrad: one copy
                g = shapes[what.removesuffix(" input (column-wise)")]
                out.append(CastSpec(phase, k.name, op, g.batch * g.m, g.k, False, k.nbytes))
            elif what.endswith(" output gradient"):
                g = shapes[what.removesuffix(" output gradient") + " dgrad"]
                out.append(CastSpec(phase, k.name, op, g.batch * g.m, g.k, tn_only, k.nbytes))
            else:
                name = what.removesuffix(" input")
                g, shard = shapes[name], sp and tp > 1 and name in GATHERED
                kept = f"{name} input (column-wise)" in casts_later  # its wgrad casts the kept input instead
                out.append(CastSpec(phase, k.name, op, g.batch * g.m // (tp if shard else 1), g.k,
                                    tn_only and not shard and not kept, k.nbytes))
    return out


def _scaled_mm_fn(spec: GemmSpec, dev: torch.device):
    """A call of torch._scaled_mm on FP8 operands of the spec's shape (B column-major, as cuBLASLt's TN wants)."""
    a = torch.randn(spec.batch, spec.m, spec.k, device=dev).to(getattr(torch, spec.a))
    bt = torch.randn(spec.batch, spec.n, spec.k, device=dev).to(getattr(torch, spec.b))
    one = torch.ones((), device=dev, dtype=torch.float32)

    def run():
        for i in range(spec.batch):
            torch._scaled_mm(a[i], bt[i].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return run


def _bf16_fn(spec: GemmSpec, dev: torch.device, dtype: torch.dtype):
    a = torch.randn(spec.batch, spec.m, spec.k, device=dev, dtype=dtype)
    b = torch.randn(spec.batch, spec.k, spec.n, device=dev, dtype=dtype)
    return partial(torch.bmm, a, b)


def _cast_op(x: torch.Tensor, scale: torch.Tensor, transposed: bool):
    y = (x * scale).to(torch.float8_e4m3fn)
    return (y, y.t().contiguous()) if transposed else y


def _amax_op(x: torch.Tensor):
    return x.abs().amax()


def _transpose_op(x8: torch.Tensor):
    return x8.view(torch.uint8).t().contiguous()


def memory_fn(spec: CastSpec, impl: str, dev: torch.device, dtype: torch.dtype):
    """A call running the spec's kernel as `impl` ("eager", "compiled" or "te")."""
    x = torch.randn(spec.rows, spec.cols, device=dev, dtype=dtype)
    if spec.op == "transpose":
        return partial(_transpose_op, x.to(torch.float8_e4m3fn))
    if impl == "te":
        import transformer_engine.pytorch as te  # local import: optional, only on a GPU that has it
        from transformer_engine.pytorch.tensor.float8_tensor import Float8Quantizer  # local import: as above
        q = Float8Quantizer(torch.ones(1, device=dev), torch.zeros(1, device=dev), te.constants.TE_DType[
            torch.float8_e4m3fn], rowwise=True, columnwise=spec.transposed)
        return partial(q, x) if spec.op == "cast" else partial(_amax_op, x)
    fn = _amax_op if spec.op == "amax" else partial(_cast_op, scale=torch.ones((), device=dev),
                                                    transposed=spec.transposed)
    return partial(torch.compile(fn) if impl == "compiled" else fn, x)


def case_rows(rows: list[dict], *, case: LayerCase, dev: torch.device, recipe: str, tn_only: bool, iters: int,
              warmup: int, impls: tuple[str, ...]) -> None:
    """Append one record per FP8 GEMM (FP8 and BF16) and per FP8 memory-bound kernel and impl of the case."""
    pk = fp8_kernels(case, recipe, tn_only)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    for g in gemm_specs(pk):
        flops = 2 * g.batch * g.m * g.n * g.k
        base = dict(case=case.label, phase=g.phase, kernel=g.name, kind="gemm", m=g.m, n=g.n, k=g.k, batch=g.batch,
                    flops=flops)
        rows.append({**base, "dtype": "float8", "impl": "scaled_mm", "nbytes": g.batch * (g.m * g.k + g.k * g.n + 2 *
                     g.m * g.n), "seconds": timer(dev, _scaled_mm_fn(g, dev), iters, warmup)})
        rows.append({**base, "dtype": "bfloat16", "impl": "matmul", "nbytes": 2 * g.batch * (g.m * g.k + g.k * g.n +
                     g.m * g.n), "seconds": timer(dev, _bf16_fn(g, dev, dtype), iters, warmup)})
    for c in cast_specs(pk, tn_only, tp=case.opts.tp, sp=case.opts.sp):
        for impl in impls:
            rows.append(dict(case=case.label, phase=c.phase, kernel=c.name, kind="memory", dtype="float8", impl=impl,
                             m=c.rows, n=c.cols, k=0, batch=1, nbytes=c.nbytes, flops=0,
                             seconds=timer(dev, memory_fn(c, impl, dev, dtype), iters, warmup)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder for fp8.csv and meta.json")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="the tiny cases (the tests)")
    ap.add_argument("--only", default="", help="only the cases whose label contains one of these (comma-separated)")
    ap.add_argument("--recipe", default="delayed", choices=("delayed", "tensorwise"),
                    help="the per-tensor recipe whose casts are timed (tensorwise adds the amax kernels)")
    ap.add_argument("--budget", type=float, default=0.0, help="start no new case after this many seconds (0: none)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_fp8.py: no CUDA device visible (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    tn_only = dev.type != "cuda" or torch.cuda.get_device_capability(dev) < (10, 0)  # TE: TN-only FP8 below sm_100
    impls = ["eager", "compiled"] if dev.type == "cuda" else ["eager"]
    try:
        import transformer_engine.pytorch  # noqa: F401  # local import: optional, measured when present
        impls.insert(0, "te")
    except ImportError:
        pass
    iters, warmup = (20, 5) if dev.type == "cuda" else (1, 0)
    pool = TINY_CASES if args.tiny else CASES
    cases = list(dict.fromkeys(c for o in args.only.split(",") for c in pool if o in c.label))  # --only's order
    args.out.mkdir(parents=True, exist_ok=True)
    write_meta(args.out, dev, torch.bfloat16, iters)
    t0 = time.perf_counter()
    with open(args.out / "fp8.csv", "w", newline="") as fh:
        out = csv.DictWriter(fh, FIELDS)
        out.writeheader()
        for case in cases:
            if args.budget and time.perf_counter() - t0 > args.budget:
                print(f"{case.label}: skipped (budget of {args.budget:.0f} s spent)", flush=True)
                continue
            record_case("gpu_fp8.py", case.label, partial(case_rows, case=case, dev=dev, recipe=args.recipe,
                                                          tn_only=tn_only, iters=iters, warmup=warmup,
                                                          impls=tuple(impls)), out, fh, dev, t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
