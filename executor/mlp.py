"""The executor's MLPs: a dense layer's and each expert's, in the model's activation and with or without biases.

SwiGLU's gate and up matrices are one `fc1` of rows [gate; up], as Megatron-core's linear_fc1, so that a column-parallel
shard (executor.models.group_rows_by_rank) holds its columns of both; `activate` reads the halves off the local width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipesim.model.config import ModelConfig


def fc1_rows(activation: str, width: int) -> tuple[int, ...]:
    """Rows of the blocks of an MLP's first matrix for `width` hidden units: [gate; up] for SwiGLU, one otherwise."""
    return (width, width) if activation == "swiglu" else (width,)


def activate(y: torch.Tensor, activation: str) -> torch.Tensor:
    """The nonlinearity on fc1's output: GeLU, squared ReLU (Nemotron-4's), or SwiGLU's silu(gate) * up, whose gate
    and up are the two halves of the (local) width."""
    if activation == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    if activation == "relu2":
        return torch.square(F.relu(y))
    return F.gelu(y)


class Mlp(nn.Module):
    """fc1, the activation, fc2: `width` hidden units (an expert's, or the shared experts' together)."""

    def __init__(self, hidden: int, width: int, activation: str = ModelConfig.activation,
                 biases: bool = ModelConfig.biases) -> None:
        super().__init__()
        self.activation = activation
        self.fc1 = nn.Linear(hidden, sum(fc1_rows(activation, width)), bias=biases)
        self.fc2 = nn.Linear(width, hidden, bias=biases)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., h) -> (..., h)
        return self.fc2(activate(self.fc1(x), self.activation))


__all__ = ["Mlp", "activate", "fc1_rows"]
