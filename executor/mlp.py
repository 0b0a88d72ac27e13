"""The executor's MLPs: a dense layer's and each expert's, in the model's activation and with or without biases.

A gated MLP's (SwiGLU's, GeGLU's) gate and up matrices are one `fc1` of rows [gate; up], as Megatron-core's linear_fc1,
so that a column-parallel shard (executor.models.group_rows_by_rank) holds its columns of both; `activate` reads the
halves off the local width. GeGLU is Gemma's gelu_tanh(gate) x up (transformers' Gemma3MLP, hidden_activation
"gelu_pytorch_tanh").
An expert's gate may be shaped (`Gate`, from MoeConfig's glu_clamp, glu_alpha and glu_offset): GPT-OSS's
clamp(gate, max=L) x sigmoid(1.702 clamp(gate, max=L)) x (clamp(up, -L, L) + 1) (transformers v4.55.0 GptOssExperts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipesim.model.config import GATED, ModelConfig
from pipesim.model.moe import MoeConfig


@dataclass(frozen=True)
class Gate:
    """A gated activation's shape: both halves clamped at `clamp` (the gate above only), the gate's sigmoid gain
    `alpha`, `offset` added to the up half; the defaults are SwiGLU's silu(gate) x up."""

    clamp: float | None = None
    alpha: float = 1.0
    offset: float = 0.0

    @classmethod
    def of(cls, moe: MoeConfig) -> Gate:
        """The routed experts' gate (MoeConfig.glu_clamp, glu_alpha, glu_offset)."""
        return cls(moe.glu_clamp, moe.glu_alpha, moe.glu_offset)


SWIGLU = Gate()


def fc1_rows(activation: str, width: int) -> tuple[int, ...]:
    """Rows of the blocks of an MLP's first matrix for `width` hidden units: [gate; up] for a gated MLP (SwiGLU,
    GeGLU), one otherwise."""
    return (width, width) if activation in GATED else (width,)


def activate(y: torch.Tensor, activation: str, gate: Gate = SWIGLU) -> torch.Tensor:
    """The nonlinearity on fc1's output: GeLU, squared ReLU (Nemotron-4's), GeGLU's gelu_tanh(gate) * up (Gemma's),
    or SwiGLU's silu(gate) * up, whose gate and up are the two halves of the (local) width, shaped by `gate` (clamp,
    sigmoid gain, offset on the up half)."""
    if activation == "geglu":
        g, up = y.chunk(2, dim=-1)
        return F.gelu(g, approximate="tanh") * up
    if activation == "swiglu":
        g, up = y.chunk(2, dim=-1)
        if gate == SWIGLU:
            return F.silu(g) * up
        if gate.clamp is not None:
            g, up = g.clamp(max=gate.clamp), up.clamp(-gate.clamp, gate.clamp)
        glu = F.silu(g) if gate.alpha == 1.0 else g * torch.sigmoid(gate.alpha * g)
        return glu * (up + gate.offset if gate.offset else up)
    if activation == "relu2":
        return torch.square(F.relu(y))
    return F.gelu(y)


class Mlp(nn.Module):
    """fc1, the activation, fc2: `width` hidden units (an expert's, or the shared experts' together)."""

    def __init__(self, hidden: int, width: int, activation: str = ModelConfig.activation,
                 biases: bool = ModelConfig.biases, gate: Gate = SWIGLU) -> None:
        super().__init__()
        self.activation, self.gate = activation, gate
        self.fc1 = nn.Linear(hidden, sum(fc1_rows(activation, width)), bias=biases)
        self.fc2 = nn.Linear(width, hidden, bias=biases)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., h) -> (..., h)
        return self.fc2(activate(self.fc1(x), self.activation, self.gate))


__all__ = ["SWIGLU", "Gate", "Mlp", "activate", "fc1_rows"]
