"""Time the kernels of pipesim's layer model on one CUDA GPU: alone, back to back, and as a real eager layer.

  python bench/gpu_layers.py OUT_DIR                  # on a GPU: every case of bench/gpu_layer_configs.py
  python bench/gpu_layers.py OUT_DIR --device cpu --tiny    # the same code paths on a CPU (the tests)

For each case (one tensor-parallel rank's layer of a published configuration) it writes OUT_DIR/layers.csv:
  alone      each GEMM, attention kernel and memory-bound kernel of pipesim.model.layer_kernels.layer_kernels timed by
             itself (a GEMM in the layout its role has in Megatron: forward X W^T, dgrad dY W, wgrad dY^T X; a
             memory-bound kernel as a copy of the same bytes);
  sequence   each phase's (F, I, W) kernels back to back, fused (Megatron's kernels) and unfused lists;
  eager      a GPT block written in plain torch (one kernel per op: pipesim's fused=False list), forward and
             forward + backward under autograd (backward = the difference);
and OUT_DIR/meta.json (device, torch, date) and, for KOR22's 22B block, OUT_DIR/<block>_trace.json (torch.profiler).
--blocks megatron,compiled adds the block in Megatron-LM's [s, b, h] layout, and that block under torch.compile (whose
fused kernels stand for Megatron's fused ones: the model's fused=True list).
bench/gpu_layers_compare.py puts the records beside pipesim's kernel model. Nothing here is fitted.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from gpu_layer_configs import CASES, TINY_CASES, LayerCase
from gpu_run import record_case, write_meta

from pipesim.calibration.gpu_measure import timer
from pipesim.model.kernel_types import FlashAttention, Gemm, Kernel

FIELDS = ("case", "mode", "phase", "kernel", "kind", "shape", "nbytes", "seconds")
DROPOUT = 0.1  # Megatron's attention and hidden dropout in the papers' runs
TRACED = "KOR22 22B"  # the case whose eager block is profiled (Korthikanti et al. Table 4's layer)


def _rand(dev: torch.device, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=dev, dtype=dtype)


def gemm_call(g: Gemm, dev: torch.device, dtype: torch.dtype):
    """A call computing `g` in the layout of its role (Megatron's F.linear and batched attention products)."""
    m, n, k, b = g.m, g.n, g.k, g.batch
    if b == 1:
        if g.name.endswith("wgrad"):  # dW = dY^T X: dY (tokens x out), X (tokens x in); same FLOPs as m x n x k
            return partial(torch.matmul, _rand(dev, dtype, k, n).t(), _rand(dev, dtype, k, m))
        if g.name.endswith("dgrad"):  # dX = dY W
            return partial(torch.matmul, _rand(dev, dtype, m, k), _rand(dev, dtype, k, n))
        return partial(F.linear, _rand(dev, dtype, m, k), _rand(dev, dtype, n, k))  # X W^T
    if g.name in ("Q K^T", "A V dA"):  # second operand transposed: Q K^T, dO V^T
        return partial(torch.bmm, _rand(dev, dtype, b, m, k), _rand(dev, dtype, b, n, k).transpose(1, 2))
    if g.name.endswith(("dV", "dK")):  # first operand transposed: A^T dO, dS^T Q
        return partial(torch.bmm, _rand(dev, dtype, b, k, m).transpose(1, 2), _rand(dev, dtype, b, k, n))
    return partial(torch.bmm, _rand(dev, dtype, b, m, k), _rand(dev, dtype, b, k, n))


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


def _sdpa_step(q, k, v, grad) -> None:
    torch.autograd.grad(_sdpa(q, k, v), (q, k, v), grad)


def flash_calls(a: FlashAttention, dev: torch.device, dtype: torch.dtype):
    """(forward, forward + backward) calls of torch's scaled_dot_product_attention, causal, on `a`'s shapes."""
    q = _rand(dev, dtype, a.batch, a.heads, a.seq, a.head_dim).requires_grad_()
    k = _rand(dev, dtype, a.batch, a.kv_heads, a.kv_seq, a.head_dim).requires_grad_()
    v = _rand(dev, dtype, a.batch, a.kv_heads, a.kv_seq, a.head_dim).requires_grad_()
    return partial(_sdpa, q, k, v), partial(_sdpa_step, q, k, v, torch.randn_like(q))


def copy_call(nbytes: int, dev: torch.device, dtype: torch.dtype):
    """A copy moving about `nbytes` (half read, half written): (call, bytes it moves)."""
    size = torch.empty((), dtype=dtype).element_size()
    n = max(1, nbytes // (2 * size))
    src = torch.empty(n, device=dev, dtype=dtype)
    return partial(torch.empty_like(src).copy_, src), 2 * n * size


def _shape(k: Kernel) -> str:
    if isinstance(k, Gemm):
        return f"{k.batch}x{k.m}x{k.n}x{k.k}"
    if isinstance(k, FlashAttention):
        return f"{k.batch}x{k.seq}x{k.heads}x{k.head_dim}x{k.kv_seq}x{k.kv_heads}"
    return ""


def kernel_calls(k: Kernel, dev: torch.device, dtype: torch.dtype) -> tuple[object, int]:
    """A call running kernel `k` once, and the bytes it moves (memory-bound only)."""
    if isinstance(k, Gemm):
        return gemm_call(k, dev, dtype), 0
    if isinstance(k, FlashAttention):
        fwd, both = flash_calls(k, dev, dtype)
        return (both if k.backward else fwd), 0
    return copy_call(k.nbytes, dev, dtype)


def _run_all(calls) -> None:
    for call in calls:
        call()


def time_case(case: LayerCase, dev: torch.device, dtype: torch.dtype, iters: int, warmup: int) -> list[dict]:
    """The alone and sequence records of one case (flash backward alone = forward + backward - forward)."""
    rows: list[dict] = []
    alone: dict[tuple[str, str], float] = {}
    for fused in (True, False):
        pk = case.kernels(fused)
        for phase in "FIW":
            calls = []
            for k in getattr(pk, phase):
                call, moved = kernel_calls(k, dev, dtype)
                calls.append(call)
                key = (k.name, _shape(k) or str(k.nbytes))
                if key not in alone:
                    alone[key] = timer(dev, call, iters, warmup)
                    if isinstance(k, FlashAttention) and k.backward:
                        fwd, _ = flash_calls(k, dev, dtype)
                        alone[key] = max(alone[key] - timer(dev, fwd, iters, warmup), 0.0)
                    rows.append(dict(case=case.label, mode="alone", phase=phase, kernel=k.name,
                                     kind=type(k).__name__, shape=_shape(k), nbytes=moved, seconds=alone[key]))
            if calls:
                mode = "sequence-fused" if fused else "sequence-unfused"
                rows.append(dict(case=case.label, mode=mode, phase=phase, kernel="", kind="", shape="", nbytes=0,
                                 seconds=timer(dev, partial(_run_all, calls), iters, warmup)))
            del calls
    return rows


class EagerGptBlock(torch.nn.Module):
    """One tensor-parallel rank's GPT block in plain torch, one kernel per op (pipesim's fused=False list):
    LayerNorm, QKV + bias, Q K^T, scale, causal mask, softmax, dropout, A V, projection + bias, dropout, residual,
    LayerNorm, FC1 + bias, GeLU, FC2 + bias, dropout, residual. Layout [b, s, h]."""

    def __init__(self, case: LayerCase, dev: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        m, t = case.model, case.opts.tp
        self.heads, self.head_dim = m.heads // t, m.hidden // m.heads
        h, f = m.hidden, m.ffn_size // t

        def p(*shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(_rand(dev, dtype, *shape) * 0.02)

        self.ln1_w, self.ln1_b, self.ln2_w, self.ln2_b = p(h), p(h), p(h), p(h)
        self.w_qkv, self.b_qkv = p(3 * h // t, h), p(3 * h // t)
        self.w_proj, self.b_proj = p(h, h // t), p(h)
        self.w_fc1, self.b_fc1 = p(f, h), p(f)
        self.w_fc2, self.b_fc2 = p(h, f), p(h)
        s = m.seq
        self.register_buffer("mask", torch.ones(s, s, device=dev, dtype=torch.bool).triu(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        y = F.layer_norm(x, (h,), self.ln1_w, self.ln1_b)
        qkv = F.linear(y, self.w_qkv) + self.b_qkv
        q, k, v = qkv.view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        probs = F.dropout(F.softmax(scores.masked_fill(self.mask, float("-inf")), -1), DROPOUT, True)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, s, self.heads * self.head_dim)
        x = x + F.dropout(F.linear(ctx, self.w_proj) + self.b_proj, DROPOUT, True)
        y = F.layer_norm(x, (h,), self.ln2_w, self.ln2_b)
        z = F.linear(F.gelu(F.linear(y, self.w_fc1) + self.b_fc1), self.w_fc2) + self.b_fc2
        return x + F.dropout(z, DROPOUT, True)


class MegatronGptBlock(EagerGptBlock):
    """The same block in Megatron-LM's layout ([s, b, h]) and ops: QKV split as views, Q K^T as one baddbmm with the
    1 / sqrt(head_dim) scale as its alpha, A V as one bmm, one contiguous copy of the context back to [s, b, h]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b, h = x.shape
        np_, hn = self.heads, self.head_dim
        y = F.layer_norm(x, (h,), self.ln1_w, self.ln1_b)
        mixed = (F.linear(y, self.w_qkv) + self.b_qkv).view(s, b, np_, 3 * hn)
        q, k, v = (t.reshape(s, b * np_, hn).transpose(0, 1) for t in torch.split(mixed, hn, dim=-1))
        scores = torch.baddbmm(torch.empty(b * np_, s, s, device=x.device, dtype=x.dtype), q, k.transpose(1, 2),
                               beta=0.0, alpha=1.0 / math.sqrt(hn))
        probs = F.dropout(F.softmax(scores.view(b, np_, s, s).masked_fill(self.mask, float("-inf")), -1),
                          DROPOUT, True)
        ctx = torch.bmm(probs.view(b * np_, s, s), v).view(b, np_, s, hn).permute(2, 0, 1, 3).contiguous()
        x = x + F.dropout(F.linear(ctx.view(s, b, np_ * hn), self.w_proj) + self.b_proj, DROPOUT, True)
        y = F.layer_norm(x, (h,), self.ln2_w, self.ln2_b)
        z = F.linear(F.gelu(F.linear(y, self.w_fc1) + self.b_fc1), self.w_fc2) + self.b_fc2
        return x + F.dropout(z, DROPOUT, True)


BLOCKS = ("eager", "megatron", "compiled")  # the [b, s, h] block; Megatron's layout; that one under torch.compile


def _block_step(block, x: torch.Tensor, grad: torch.Tensor) -> None:
    torch.autograd.grad(block(x), (x, *block.parameters()), grad)


def eager_block(case: LayerCase, dev: torch.device, dtype: torch.dtype, iters: int, warmup: int,
                trace: Path | None, kind: str = "eager") -> list[dict]:
    """A block's forward and backward seconds (`kind` of BLOCKS); with `trace`, a torch.profiler trace of two steps
    there."""
    m = case.model
    if kind == "eager":
        block = EagerGptBlock(case, dev, dtype)
        x = _rand(dev, dtype, case.b, m.seq, m.hidden).requires_grad_()
    else:
        block = MegatronGptBlock(case, dev, dtype)
        x = _rand(dev, dtype, m.seq, case.b, m.hidden).requires_grad_()
    if kind == "compiled":
        block = torch.compile(block)
    grad = torch.randn_like(x)
    fwd = timer(dev, partial(block, x), iters, warmup)
    both = timer(dev, partial(_block_step, block, x, grad), iters, warmup)
    if trace is not None:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if dev.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(2):
                _block_step(block, x, grad)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        prof.export_chrome_trace(str(trace))
    base = dict(case=case.label, mode=kind, kernel="", kind="", shape="", nbytes=0)
    return [dict(base, phase="F", seconds=fwd), dict(base, phase="B", seconds=max(both - fwd, 0.0))]


def _case_rows(rows: list[dict], *, case: LayerCase, kernels: bool, blocks: list[str], dev: torch.device,
               dtype: torch.dtype, iters: int, warmup: int, trace_dir: Path | None) -> None:
    """Append one case's records: its kernels (alone, in sequence) and its blocks; each block traced into
    `trace_dir`/<block>_trace.json when one is given."""
    if kernels:
        rows += time_case(case, dev, dtype, iters, warmup)
    for kind in blocks:
        path = trace_dir / f"{kind}_trace.json" if trace_dir is not None else None
        rows += eager_block(case, dev, dtype, iters, warmup, path, kind)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder for layers.csv, meta.json and eager_trace.json")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="the tiny cases (the tests)")
    ap.add_argument("--only", default="", help="only the cases whose label contains this")
    ap.add_argument("--blocks", default="eager", help=f"comma-separated blocks to run of {', '.join(BLOCKS)}")
    ap.add_argument("--no-kernels", action="store_true", help="the blocks only (no alone / sequence records)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_layers.py: no CUDA device visible (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    iters, warmup = (5, 2) if dev.type == "cuda" else (2, 1)  # 3 rounds of `iters` after `warmup`
    cases = [c for c in (TINY_CASES if args.tiny else CASES) if any(o in c.label for o in args.only.split(","))]
    blocks = [b for b in args.blocks.split(",") if b]
    if any(b not in BLOCKS for b in blocks):
        print(f"gpu_layers.py: --blocks {args.blocks!r}: choose from {', '.join(BLOCKS)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_meta(args.out, dev, dtype, iters)
    traced, t0 = False, time.perf_counter()
    with open(args.out / "layers.csv", "w", newline="") as fh:
        out = csv.DictWriter(fh, FIELDS)
        out.writeheader()
        for case in cases:
            trace = not traced and case.eager_layer and bool(blocks) and (args.tiny or TRACED in case.label)
            fill = partial(_case_rows, case=case, kernels=not args.no_kernels,
                           blocks=blocks if case.eager_layer else [], dev=dev, dtype=dtype, iters=iters,
                           warmup=warmup, trace_dir=args.out if trace else None)
            record_case("gpu_layers.py", case.label, fill, out, fh, dev, t0)
            traced = traced or trace
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
