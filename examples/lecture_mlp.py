"""pipesim's own lecture MLP as a factory: `--model examples/lecture_mlp.py:make` is costed and trained
like `--model mlp --hidden 1024 --layers 8` (tests/test_user_model.py checks that the counted FLOPs agree)."""

from __future__ import annotations

import torch

from executor.models import MLPLayer

HIDDEN, LAYERS = 1024, 8


def make() -> dict:
    return {"layers": [MLPLayer(HIDDEN) for _ in range(LAYERS)], "example_input": torch.randn(1, HIDDEN)}
