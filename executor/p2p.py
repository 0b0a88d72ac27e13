"""Point-to-point transfers between pipeline stages: plain isend/irecv into preallocated buffers.

Shapes are known from the model, so there is no metadata handshake. Ops are posted one at a time in
program order (deterministic; `batch_isend_irecv` can hang on gloo). On gloo a tag names the
direction, the producing stage and the microbatch, so a transfer can only match its own RECV.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from pipesim.ir import Schedule


class P2P:
    """Receive buffers for this rank's stages, reused every step, and tagged isend/irecv."""

    def __init__(self, schedule: Schedule, rank: int, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device, *, use_tags: bool) -> None:
        m, last = schedule.num_microbatches, schedule.num_stages - 1
        self.m = m
        self.use_tags = use_tags
        self.act: dict[int, list[torch.Tensor]] = {}  # stage -> per-microbatch input buffers
        self.grad: dict[int, list[torch.Tensor]] = {}  # stage -> per-microbatch output-grad buffers
        for s in schedule.stages_of(rank):
            if s > 0 and schedule.rank_of(s - 1) != rank:
                self.act[s] = [torch.empty(shape, dtype=dtype, device=device) for _ in range(m)]
            if s < last and schedule.rank_of(s + 1) != rank:
                self.grad[s] = [torch.empty(shape, dtype=dtype, device=device) for _ in range(m)]

    def tag(self, backward: bool, producer: int, mb: int) -> int:
        """Unique per (direction, producing stage, microbatch) within a step."""
        return ((producer * 2 + int(backward)) * self.m + mb) if self.use_tags else 0

    def send(self, tensor: torch.Tensor, dst: int, tag: int):
        return dist.isend(tensor, dst, tag=tag)

    def recv(self, buf: torch.Tensor, src: int, tag: int):
        return dist.irecv(buf, src, tag=tag)
