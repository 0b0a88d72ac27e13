"""Data parallelism: average gradients over a torch.distributed group after the backward pass.

Small tensors waste a collective's fixed latency, so with `bucket_bytes` gradients are packed in
parameter order into flat buckets (one all_reduce each), the way DDP's buckets do; without it, one
all_reduce per parameter. The order is the parameter order on every rank, so ranks always match.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from pipesim.errors import PipesimError

__all__ = ["allreduce_gradients", "plan_buckets"]


def plan_buckets(grads: list[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Indices of `grads` per bucket: consecutive, one dtype and device each, at most `bucket_bytes`.

    A gradient larger than `bucket_bytes` gets a bucket of its own.
    """
    if bucket_bytes < 1:
        raise PipesimError(f"bucket size must be at least 1 byte, got {bucket_bytes}")
    buckets: list[list[int]] = []
    filled = 0  # bytes in the open bucket
    for i, g in enumerate(grads):
        size = g.numel() * g.element_size()  # bytes
        open_bucket = buckets[-1] if buckets else None
        fits = (open_bucket is not None and filled + size <= bucket_bytes
                and grads[open_bucket[0]].dtype == g.dtype and grads[open_bucket[0]].device == g.device)
        if fits:
            open_bucket.append(i)
            filled += size
        else:
            buckets.append([i])
            filled = size
    return buckets


def allreduce_gradients(params: Iterable[torch.nn.Parameter], group=None, bucket_bytes: int | None = None) -> int:
    """Replace every `.grad` by its mean over `group`; returns the number of all_reduce calls issued.

    Parameters without a gradient are skipped (the same ones must lack it on every rank).
    """
    grads = [p.grad for p in params if p.grad is not None]
    n = dist.get_world_size(group)
    if bucket_bytes is None:
        for g in grads:
            buf = g if g.is_contiguous() else g.contiguous()
            dist.all_reduce(buf, group=group)
            buf.div_(n)
            if buf is not g:
                g.copy_(buf)
        return len(grads)
    buckets = plan_buckets(grads, bucket_bytes)
    for bucket in buckets:
        members = [grads[i] for i in bucket]
        flat = torch.cat([g.reshape(-1) for g in members])  # a fresh contiguous buffer
        dist.all_reduce(flat, group=group)
        flat.div_(n)
        offset = 0
        for g in members:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    return len(buckets)
