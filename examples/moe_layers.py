"""Your own layers with mixture-of-experts MLPs, trained with expert parallelism.

The interface: a layer holds an `executor.experts.MoeMLP` (a learned top-k router, experts named by their global
index, an optional shared expert). Under `pipesim run --ep N` each rank keeps its ep coordinate's E / N experts
and exchanges token rows with all-to-alls; the experts' gradients are averaged over their expert-data-parallel
replicas. A layer that also has a `steps(x)` generator, `yield from`-ing the MoeMLP's `steps` (as below), lets an
overlapped pair (DualPipeV) run the other chunk while its first all-to-all is in flight; without it the layer's
exchanges are waited for at once.

    pipesim run dualpipev --nproc 2 --dp 2 --ep 2 --microbatches 2 --batch 8 --model examples/moe_layers.py:make
"""

from __future__ import annotations

import torch
from torch import nn

from executor.experts import MoeMLP
from pipesim.model.moe import MoeConfig

HIDDEN, SEQ = 16, 8


class MoeLayer(nn.Module):
    """x + MoE(LayerNorm(x)) on (batch, seq, hidden)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.moe = MoeMLP(HIDDEN, MoeConfig(experts=4, top_k=2, expert_ffn=32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.moe(self.norm(x))

    def steps(self, x: torch.Tensor):
        return x + (yield from self.moe.steps(self.norm(x)))


def make() -> dict:
    return {"layers": [MoeLayer() for _ in range(4)], "example_input": torch.randn(2, SEQ, HIDDEN)}
