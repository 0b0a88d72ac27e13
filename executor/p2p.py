"""Point-to-point transfers between pipeline stages: plain isend/irecv into preallocated buffers.

Shapes are known from the model, so there is no metadata handshake. Ops are posted one at a time in
program order (deterministic; `batch_isend_irecv` can hang on gloo). On gloo a tag names the
direction, the producing stage and the microbatch, so a transfer can only match its own RECV.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from pipesim.ir.schedule import Schedule


class P2P:
    """Receive buffers for this rank's stages, reused every step, and tagged isend/irecv."""

    def __init__(self, schedule: Schedule, rank: int, boundaries: list[tuple[tuple[int, ...], torch.dtype]],
                 device: torch.device, *, use_tags: bool) -> None:
        """`boundaries[s]`: shape and dtype of the activation stage s sends to s + 1 (and of its gradient)."""
        m = schedule.num_microbatches
        self.m = m
        self.use_tags = use_tags
        self.act: dict[int, list[torch.Tensor]] = {}  # stage -> per-microbatch input buffers
        self.grad: dict[int, list[torch.Tensor]] = {}  # stage -> per-microbatch output-grad buffers
        for s in schedule.stages_of(rank):
            if not schedule.chain_first(s) and schedule.rank_of(s - 1) != rank:
                shape, dtype = boundaries[s - 1]
                self.act[s] = [torch.empty(shape, dtype=dtype, device=device) for _ in range(m)]
            if not schedule.chain_last(s) and schedule.rank_of(s + 1) != rank:
                shape, dtype = boundaries[s]
                self.grad[s] = [torch.empty(shape, dtype=dtype, device=device) for _ in range(m)]

    def tag(self, backward: bool, producer: int, mb: int) -> int:
        """Unique per (direction, producing stage, microbatch) within a step."""
        return ((producer * 2 + int(backward)) * self.m + mb) if self.use_tags else 0

    def send(self, tensor: torch.Tensor, dst: int, tag: int):
        return dist.isend(tensor, dst, tag=tag)

    def recv(self, buf: torch.Tensor, src: int, tag: int):
        return dist.irecv(buf, src, tag=tag)
