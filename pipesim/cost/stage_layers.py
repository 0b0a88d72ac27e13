"""Which of a stage's layers are of which kind: with experts (MoeConfig's placement), windowed (ModelConfig.window's).
Stages in model order: stage s holds the `split[s]` layers after the earlier stages'. The cost model costs each kind
of layer once and counts it (pipesim.cost.stage_work, kernel_costs)."""

from __future__ import annotations

from pipesim.model.config import ModelConfig
from pipesim.model.param_counts import is_moe_layer


def windowed_per_stage(model: ModelConfig, split: list[int]) -> list[tuple[int, int]]:
    """Per stage (in model order): how many of its dense layers and of its MoE layers attend over the model's
    sliding window (ModelConfig.windowed_layers); (0, 0) everywhere without one."""
    out = []
    start = 0
    for n in split:
        layers = [layer for layer in range(start, start + n) if model.windowed_layers(layer, 1)]
        moe = sum(is_moe_layer(model, layer) for layer in layers)
        out.append((len(layers) - moe, moe))
        start += n
    return out


def moe_layers_per_stage(model: ModelConfig, split: list[int]) -> list[int]:
    """How many of each stage's layers have experts (stages in model order: stage s holds the layers after the
    earlier stages')."""
    if model.moe is None:
        return [0] * len(split)
    starts = [sum(split[:s]) for s in range(len(split))]
    return [model.moe.moe_layers(start, n) for start, n in zip(starts, split, strict=True)]


__all__ = ["moe_layers_per_stage", "windowed_per_stage"]
