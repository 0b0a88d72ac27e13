"""A model whose layers have different widths: every boundary between stages has its own shape.

`pipesim run 1f1b --nproc 2 --model examples/widths.py:make` infers each boundary's shape from the
example input; the default loss (mean squared error to a target shaped like the output) applies.
"""

from __future__ import annotations

import torch
from torch import nn

WIDTHS = (16, 48, 8, 32, 24, 64, 12, 40, 20)  # input width, then each layer's output width


def layer(a: int, b: int) -> nn.Module:
    return nn.Sequential(nn.Linear(a, b), nn.Tanh())


def make() -> dict:
    return {"layers": [layer(a, b) for a, b in zip(WIDTHS, WIDTHS[1:])], "example_input": torch.randn(2, WIDTHS[0])}
