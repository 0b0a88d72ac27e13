"""A small convolutional net for `pipesim run/simulate --model examples/conv_net.py:make` (docs/your_model.md).

Eight 3x3 convolution layers on 8x8 images (no batch norm: its statistics would depend on the
microbatch), then a head (average pool, linear classifier) trained with cross-entropy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipesim.cost.user_model_costs import ModelParts

CHANNELS = (3, 8, 8, 16, 16, 16, 8, 8, 8)  # input channels, then each layer's output channels
CLASSES = 10


class ConvLayer(nn.Module):
    """3x3 convolution (same padding) + ReLU."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, cin, 8, 8) -> (b, cout, 8, 8)
        return F.relu(self.conv(x))


class Classifier(nn.Module):
    """Global average pool and a linear layer to the classes."""

    def __init__(self, cin: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, cin, h, w) -> (b, classes)
        return self.fc(x.mean(dim=(2, 3)))


def cross_entropy(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, target)


def make() -> ModelParts:
    layers = [ConvLayer(a, b) for a, b in zip(CHANNELS, CHANNELS[1:])]
    return ModelParts(layers=layers, head=Classifier(CHANNELS[-1], CLASSES),
                      example_input=torch.randn(4, 3, 8, 8), loss=cross_entropy,
                      example_target=torch.full((4,), CLASSES - 1))
