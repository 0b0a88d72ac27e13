"""Time every memory-bound kernel of pipesim's fused layer model on one CUDA GPU: as torch runs it, and fused.

  python bench/gpu_memory_kernels.py OUT_DIR [--only LABELS] [--budget SECONDS]
  python bench/gpu_memory_kernels.py OUT_DIR --device cpu --tiny      # the same code paths on a CPU (the tests)

The model charges each memory-bound kernel (pipesim.model.layer_kernels.layer_kernels, fused=True) its bytes at one
rate, memory_bound_efficiency x HBM. This measures the rate of each kind. For each case of bench/gpu_layer_configs.py
and each such kernel, the op as Megatron-LM writes it, on the kernel's tensors ([s, b, h] layout), in two forms:
  eager     torch's own kernels, one per op (for softmax, torch's softmax alone: Megatron never runs the unfused
            scale-mask chain);
  compiled  the same function under torch.compile (Triton kernels, one per fusion): it stands for Megatron's fused
            kernels (scale-mask-softmax, bias-GeLU, bias-dropout-add, fused LayerNorm).
A backward kernel is timed as (forward + autograd backward) - forward, twice: by the clock (CUDA events over calls
back to back: `seconds`, which a small op's host overhead can set) and as the GPU's time in kernels (torch.profiler:
`gpu_seconds`, 0 on a CPU). Writes OUT_DIR/memory_kernels.csv (case, phase, kernel, family, impl, elements,
nbytes = the model's bytes, seconds, gpu_seconds) and OUT_DIR/meta.json; a HBM copy of
1 GiB is the reference rate (family "copy"). Nothing here is fitted: docs/gpu_model.md reads the ratios.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from gpu_layer_configs import CASES, TINY_CASES, LayerCase, timed_as_backward
from gpu_run import record_case, write_meta

from pipesim.calibration.gpu_measure import timer
from pipesim.model.kernel_types import MemoryBound

FIELDS = ("case", "phase", "kernel", "family", "impl", "elements", "nbytes", "seconds", "gpu_seconds")
DROPOUT = 0.1  # Megatron's attention and hidden dropout in the papers' runs


def _bias_add(x, bias):
    return x + bias


def _layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def _rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w)


def _softmax(x, mask, compiled: bool):
    if not compiled:  # torch's softmax kernel alone (Megatron's fallback chain is never what runs at scale)
        return F.softmax(x, -1)
    return F.softmax((x * (1.0 / math.sqrt(128))).masked_fill(mask, float("-inf")), -1)  # any scale: same bytes


def _dropout(x):
    return F.dropout(x, DROPOUT, True)


def _bias_dropout_add(x, bias, residual):
    return residual + F.dropout(x + bias, DROPOUT, True)


def _bias_gelu(y, bias):
    return F.gelu(y + bias, approximate="tanh")


def _swiglu(gate, up):
    return F.silu(gate) * up


def _rope(q, k, cos, sin):
    def rot(x):
        x1, x2 = x.chunk(2, -1)
        return torch.cat((-x2, x1), -1)

    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def _add(a, b):
    return a + b


def _bias_grad(g):
    return g.sum(0)


@dataclass(frozen=True)
class Family:
    """An op of Megatron's layer and the tensors it runs on: its family name, the torch function, the inputs'
    shapes and which of them take a gradient."""

    name: str
    fn: Callable
    shapes: tuple[tuple[int, ...], ...]  # the inputs' shapes; a 1-d shape of the last dim is a parameter
    grad: tuple[bool, ...]  # which inputs take a gradient in the backward
    bool_mask: bool = False  # the last input is a boolean causal mask


def family_of(k: MemoryBound, case: LayerCase) -> Family:
    """The op a kernel of the model stands for, on the kernel's tensors (`KeyError` for one it does not know)."""
    m, o, b = case.model, case.opts, case.b
    s, t = o.local_seq(m), o.tp
    h, f, np_, hd = m.hidden, m.ffn_size // t, m.heads // t, m.head_dim
    tokens = s * b
    hidden_rows = o.seq_sharded(tokens)  # the residual stream's rows on this rank (sp: 1 / t of them)
    name = k.name.removesuffix(" backward")
    if name == "QKV bias add":
        return Family("bias add", _bias_add, ((tokens, 3 * h // t), (3 * h // t,)), (True, True))
    if name.endswith("LayerNorm"):
        return Family("LayerNorm", _layer_norm, ((hidden_rows, h), (h,), (h,)), (True, True, True))
    if name.endswith("RMSNorm"):
        return Family("RMSNorm", _rms_norm, ((hidden_rows, h), (h,)), (True, True))
    if name == "softmax":
        return Family("softmax", _softmax, ((b, np_, s, m.seq), (s, m.seq)), (True, False), bool_mask=True)
    if name == "softmax dropout":
        return Family("dropout", _dropout, ((b, np_, s, m.seq),), (True,))
    if name.endswith("bias-dropout-add"):
        return Family("bias-dropout-add", _bias_dropout_add, ((hidden_rows, h), (h,), (hidden_rows, h)),
                      (True, True, True))
    if name.endswith("dropout"):  # "attention dropout backward": the hidden dropout's gradient
        return Family("dropout", _dropout, ((hidden_rows, h),), (True,))
    if name.endswith(("residual gradient sum", "residual add")):
        return Family("add", _add, ((hidden_rows, h), (hidden_rows, h)), (True, True))
    if name == "GeLU":
        return Family("bias-GeLU", _bias_gelu, ((tokens, f), (f,)), (True, True))
    if name == "SwiGLU":
        return Family("SwiGLU", _swiglu, ((tokens, f), (tokens, f)), (True, True))
    if name.startswith("RoPE"):
        kvp = max(1, m.num_kv_heads // t)
        return Family("RoPE", _rope, ((s, b, np_, hd), (s, b, kvp, hd), (s, 1, 1, hd), (s, 1, 1, hd)),
                      (True, True, False, False))
    if name.endswith("bias gradient"):
        width = {"QKV": 3 * h // t, "projection": h, "FC1": f, "FC2": h}[name.removesuffix(" bias gradient")]
        rows = hidden_rows if name.startswith(("projection", "FC2")) else tokens
        return Family("bias gradient", _bias_grad, ((rows, width),), (False,))
    raise KeyError(k.name)


def _inputs(fam: Family, dev: torch.device, dtype: torch.dtype, backward: bool) -> list[torch.Tensor]:
    out = []
    for i, (shape, g) in enumerate(zip(fam.shapes, fam.grad, strict=True)):
        if fam.bool_mask and i == len(fam.shapes) - 1:
            s, sk = shape
            out.append(torch.ones(s, sk, device=dev, dtype=torch.bool).triu(1))
            continue
        x = torch.randn(*shape, device=dev, dtype=dtype)
        out.append(x.requires_grad_() if backward and g else x)
    return out


def _fn(fam: Family, compiled: bool) -> Callable:
    fn = partial(fam.fn, compiled=compiled) if fam.fn is _softmax else fam.fn
    return torch.compile(fn, dynamic=False) if compiled else fn


def _step(fn: Callable, inputs: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.grad(outs, [x for x in inputs if x.requires_grad], grads)


def gpu_kernel_seconds(dev: torch.device, fn: Callable, iters: int) -> float:
    """Seconds per call that the GPU spends in kernels (torch.profiler's device events, summed): what the call costs
    with the host's launch overhead hidden, as it is inside a layer's stream of kernels. On a CPU: 0."""
    if dev.type != "cuda":
        return 0.0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize(dev)
    on_device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.time_range.elapsed_us() for e in on_device) * 1e-6 / iters


def _both(dev: torch.device, fn: Callable, iters: int, warmup: int) -> tuple[float, float]:
    wall = timer(dev, fn, iters, warmup)
    try:
        return wall, gpu_kernel_seconds(dev, fn, iters)
    except Exception as exc:  # noqa: BLE001 (a profiler that fails must not lose the clock's record)
        print(f"gpu_memory_kernels.py: torch.profiler: {type(exc).__name__}: {exc}", file=sys.stderr)
        return wall, 0.0


def time_family(fam: Family, compiled: bool, backward: bool, dev: torch.device, dtype: torch.dtype,
                iters: int, warmup: int) -> tuple[float, float]:
    """(seconds, kernel seconds) of the op's forward, or of its backward ((forward + backward) - forward), eager or
    compiled."""
    fn = _fn(fam, compiled)
    with torch.no_grad():
        fwd = _both(dev, partial(fn, *_inputs(fam, dev, dtype, False)), iters, warmup)
    if not backward:
        return fwd
    inputs = _inputs(fam, dev, dtype, True)
    out = fn(*inputs)
    grads = [torch.randn_like(o) for o in (out if isinstance(out, tuple) else (out,))]
    del out
    both = _both(dev, partial(_step, fn, inputs, grads), iters, warmup)
    return max(both[0] - fwd[0], 0.0), max(both[1] - fwd[1], 0.0)


def copy_seconds(dev: torch.device, dtype: torch.dtype, nbytes: int, iters: int, warmup: int) -> tuple[float, float]:
    n = nbytes // (2 * torch.empty((), dtype=dtype).element_size())
    src = torch.empty(n, device=dev, dtype=dtype)
    return _both(dev, partial(torch.empty_like(src).copy_, src), iters, warmup)


def case_rows(rows: list[dict], *, case: LayerCase, dev: torch.device, dtype: torch.dtype, iters: int, warmup: int,
              impls: tuple[str, ...]) -> None:
    """Append one record per (memory-bound kernel, impl) of the case's fused F, I and W lists; each (op, shape,
    phase) is timed once and shared by the kernels that run it (the attention and MLP LayerNorms, say)."""
    done: dict[tuple, tuple[float, float]] = {}
    pk = case.kernels(True)
    for phase in "FIW":
        for k in getattr(pk, phase):
            if not isinstance(k, MemoryBound):
                continue
            fam = family_of(k, case)
            backward = timed_as_backward(k.name, fam.name)
            for impl in impls:
                key = (fam.name, fam.shapes, backward, impl)
                if key not in done:
                    done[key] = time_family(fam, impl == "compiled", backward, dev, dtype, iters, warmup)
                rows.append(dict(case=case.label, phase=phase, kernel=k.name, family=fam.name, impl=impl,
                                 elements=math.prod(fam.shapes[0]), nbytes=k.nbytes, seconds=done[key][0],
                                 gpu_seconds=done[key][1]))


def liger_rows(dev: torch.device, iters: int, warmup: int, tiny: bool) -> list[dict]:
    """torch's LayerNorm forward in fp32 on Liger-Kernel's benchmark shapes (4096 rows, N = 4096, 8192, 16384), the
    shapes of the A100 figure in pipesim/presets/gemm/devices.toml: the bridge from this GPU's rates to the A100's.
    Bytes: x read and y written, 2 M N 4."""
    rows = []
    m, widths = (64, (64,)) if tiny else (4096, (4096, 8192, 16384))
    for n in widths:
        fam = Family("LayerNorm", _layer_norm, ((m, n), (n,), (n,)), (False, False, False))
        wall, gpu = time_family(fam, False, False, dev, torch.float32, iters, warmup)
        rows.append(dict(case=f"Liger LayerNorm fp32 {m}x{n}", phase="F", kernel="LayerNorm", family="LayerNorm",
                         impl="eager", elements=m * n, nbytes=2 * m * n * 4, seconds=wall, gpu_seconds=gpu))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder for memory_kernels.csv and meta.json")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="the tiny cases (the tests)")
    ap.add_argument("--only", default="", help="only the cases whose label contains one of these (comma-separated)")
    ap.add_argument("--impls", default="eager,compiled", help="eager, compiled or both")
    ap.add_argument("--budget", type=float, default=0.0, help="start no new case after this many seconds (0: none)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_memory_kernels.py: no CUDA device visible (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    impls = tuple(i for i in args.impls.split(",") if i)
    if not impls or any(i not in ("eager", "compiled") for i in impls):
        print(f"gpu_memory_kernels.py: --impls {args.impls!r}: choose from eager, compiled", file=sys.stderr)
        return 2
    torch._dynamo.config.recompile_limit = 1 << 12  # one graph per (op, shape, grad mode): never fall back to eager
    torch._dynamo.config.accumulated_recompile_limit = 1 << 14
    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    iters, warmup = (10, 3) if dev.type == "cuda" else (2, 1)
    pool = TINY_CASES if args.tiny else CASES
    cases = list(dict.fromkeys(c for o in args.only.split(",") for c in pool if o in c.label))  # --only's order
    args.out.mkdir(parents=True, exist_ok=True)
    write_meta(args.out, dev, dtype, iters)
    t0 = time.perf_counter()
    with open(args.out / "memory_kernels.csv", "w", newline="") as fh:
        out = csv.DictWriter(fh, FIELDS)
        out.writeheader()
        nbytes = 1 << 30 if dev.type == "cuda" else 1 << 20
        wall, gpu = copy_seconds(dev, dtype, nbytes, iters, warmup)
        out.writerow(dict(case="", phase="", kernel="copy", family="copy", impl="eager", elements=0, nbytes=nbytes,
                          seconds=wall, gpu_seconds=gpu))
        out.writerows(liger_rows(dev, iters, warmup, args.tiny))
        for case in cases:
            if args.budget and time.perf_counter() - t0 > args.budget:
                print(f"{case.label}: skipped (budget of {args.budget:.0f} s spent)", flush=True)
                continue
            record_case("gpu_memory_kernels.py", case.label, partial(case_rows, case=case, dev=dev, dtype=dtype,
                                                                     iters=iters, warmup=warmup, impls=impls),
                        out, fh, dev, t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
