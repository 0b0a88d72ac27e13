"""Megatron-style tensor parallelism: column- and row-sharded linear layers over a torch.distributed group.

A column layer splits the output features, a row layer the input features, so an MLP block
(column, GELU, row) needs one all_reduce forward and one backward. With sequence parallelism the
activations outside the block stay sharded on their token dim: the all_reduce becomes an all_gather
before the column layer and a reduce_scatter after the row layer (same bytes, sharded memory).

Glossary: "tp" is the size of `group`; the sharded dim `sp_dim` is the sequence (dim 1 of a transformer's
(b, s, h) activations, as Megatron splits its [s, b, h] ones on s) or the rows of an MLP's (b, h) (dim 0).
"""

from __future__ import annotations

from time import perf_counter_ns

import torch
import torch.distributed as dist
from torch import nn

from pipesim.errors import PipesimError

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "copy_to_tp_region",
    "reduce_from_tp_region",
    "gather_from_sp_region",
    "reduce_scatter_to_sp_region",
]

# torch 2.13 renamed the flat collectives (*_single); older releases only have the *_tensor names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _size(group) -> int:
    return dist.get_world_size(group)


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    out = x.contiguous().clone()  # never reduce in place into a tensor autograd may still hold
    dist.all_reduce(out, group=group)
    return out


def _along(collective, x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """`collective` (a dim-0 one) applied along `dim`: that dim moved first and back (a copy when dim > 0)."""
    if dim == 0:
        return collective(x, group)
    return collective(x.movedim(dim, 0), group).movedim(0, dim).contiguous()


def _all_gather_dim0(x: torch.Tensor, group) -> torch.Tensor:
    """Concatenate every rank's shard along dim 0 (rank order)."""
    n = _size(group)
    x = x.contiguous()
    out = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    _all_gather_flat(out, x, group=group)
    return out


def _reduce_scatter_dim0(x: torch.Tensor, group, native: bool | None = None) -> torch.Tensor:
    """Sum over ranks, then keep this rank's 1/n slice of dim 0.

    gloo (torch 2.13) has a native reduce_scatter, but it measured 1.5-3x slower than gloo's
    all_reduce of the same buffer (docs/collectives.md), so on gloo: all_reduce, then slice.
    Other backends (NCCL) use the native ring reduce_scatter, half the bytes of an all_reduce.
    `native` forces one path (tests compare both on gloo).
    """
    n = _size(group)
    if x.shape[0] % n:
        raise PipesimError(f"dim 0 of size {x.shape[0]} does not split over {n} tensor-parallel ranks")
    if native is None:
        native = dist.get_backend(group) != "gloo"
    if not native:
        per = x.shape[0] // n
        return _all_reduce(x, group).narrow(0, dist.get_rank(group) * per, per).clone()
    x = x.contiguous()
    out = torch.empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    _reduce_scatter_flat(out, x, group=group)
    return out


class _CopyToTP(torch.autograd.Function):
    """Identity forward, all_reduce backward: a replicated input feeding sharded weights."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """all_reduce forward, identity backward: partial sums of a row layer become the full output."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromSP(torch.autograd.Function):
    """all_gather on `dim` forward, reduce_scatter backward (sequence-parallel entry of a block)."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _along(_all_gather_dim0, x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _along(_reduce_scatter_dim0, grad, ctx.group, ctx.dim), None, None


class _ReduceScatterToSP(torch.autograd.Function):
    """reduce_scatter on `dim` forward, all_gather backward (sequence-parallel exit of a block)."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _along(_reduce_scatter_dim0, x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _along(_all_gather_dim0, grad, ctx.group, ctx.dim), None, None


def copy_to_tp_region(x: torch.Tensor, group=None) -> torch.Tensor:
    return _CopyToTP.apply(x, group)


def reduce_from_tp_region(x: torch.Tensor, group=None) -> torch.Tensor:
    return _ReduceFromTP.apply(x, group)


def gather_from_sp_region(x: torch.Tensor, group=None, dim: int = 0) -> torch.Tensor:
    return _GatherFromSP.apply(x, group, dim)


def reduce_scatter_to_sp_region(x: torch.Tensor, group=None, dim: int = 0) -> torch.Tensor:
    return _ReduceScatterToSP.apply(x, group, dim)


def _shard_bounds(total: int, group, what: str) -> tuple[int, int]:
    """[start, end) of this rank's equal share of `total` features."""
    n, rank = _size(group), dist.get_rank(group)
    if total % n:
        raise PipesimError(f"{what} {total} is not divisible by tensor-parallel size {n}")
    per = total // n
    return rank * per, (rank + 1) * per


class ColumnParallelLinear(nn.Module):
    """y[..., out/tp] = x W_rows^T + b_rows: this rank's rows of `full`'s weight (output sharded on the last dim).

    Input replicated (or, with sequence_parallel, sharded on `sp_dim` and all-gathered here).
    """

    def __init__(self, full: nn.Linear, group=None, *, sequence_parallel: bool = False, sp_dim: int = 0) -> None:
        super().__init__()
        start, end = _shard_bounds(full.out_features, group, "out_features")
        self.group = group
        self.sequence_parallel, self.sp_dim = sequence_parallel, sp_dim
        self.in_features, self.out_features = full.in_features, end - start  # local sizes
        self.weight = nn.Parameter(full.weight.detach()[start:end].clone())  # (out/tp, in)
        self.bias = nn.Parameter(full.bias.detach()[start:end].clone()) if full.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            x = gather_from_sp_region(x, self.group, self.sp_dim)  # s/tp tokens -> s
        else:
            x = copy_to_tp_region(x, self.group)
        return nn.functional.linear(x, self.weight, self.bias)  # (..., out/tp)


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x[..., in/tp] W_cols^T, then + b once (the bias is replicated, added after the sum).

    Output replicated (or, with sequence_parallel, reduce-scattered to a shard of `sp_dim`).
    """

    def __init__(self, full: nn.Linear, group=None, *, sequence_parallel: bool = False, sp_dim: int = 0) -> None:
        super().__init__()
        start, end = _shard_bounds(full.in_features, group, "in_features")
        self.group = group
        self.sequence_parallel, self.sp_dim = sequence_parallel, sp_dim
        self.in_features, self.out_features = end - start, full.out_features  # local sizes
        self.weight = nn.Parameter(full.weight.detach()[:, start:end].clone())  # (out, in/tp)
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = nn.functional.linear(x, self.weight)  # (..., out), a partial sum
        if self.sequence_parallel:
            y = reduce_scatter_to_sp_region(partial, self.group, self.sp_dim)  # s tokens -> s/tp
            if self.bias is not None:
                # each rank sees only its tokens, so the replicated bias's grad is summed over the group
                y = y + copy_to_tp_region(self.bias, self.group)
            return y
        y = reduce_from_tp_region(partial, self.group)
        return y + self.bias if self.bias is not None else y


# -- observation (added by H3b for `pipesim run --trace`): time each TP collective, outermost call only --------
_observer = None  # callable(kind, t0_ns, t1_ns, nbytes), or None: no timing at all (one None check per call)
_observing = False  # inside an observed collective (gloo's reduce_scatter calls all_reduce): record once


def set_collective_observer(observer) -> None:
    """Call `observer(kind, t0_ns, t1_ns, nbytes)` after each TP collective (None: stop); nbytes = full buffer."""
    global _observer
    _observer = observer


def _observed(kind: str, collective):
    def timed(x: torch.Tensor, group, *args, **kwargs) -> torch.Tensor:
        global _observing
        if _observer is None or _observing:
            return collective(x, group, *args, **kwargs)
        _observing = True
        try:
            if x.is_cuda:  # NCCL is asynchronous: time the transfer, not its launch
                torch.cuda.synchronize(x.device)
            t0 = perf_counter_ns()
            out = collective(x, group, *args, **kwargs)
            if x.is_cuda:
                torch.cuda.synchronize(x.device)
            t1 = perf_counter_ns()
        finally:
            _observing = False
        _observer(kind, t0, t1, max(x.numel(), out.numel()) * x.element_size())
        return out

    return timed


_all_reduce = _observed("all_reduce", _all_reduce)
_all_gather_dim0 = _observed("all_gather", _all_gather_dim0)
_reduce_scatter_dim0 = _observed("reduce_scatter", _reduce_scatter_dim0)
