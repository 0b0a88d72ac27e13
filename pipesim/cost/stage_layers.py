"""Which of a stage's layers are of which kind: with experts (MoeConfig's placement), and the model's variant layers:
those attending over its sliding window (ModelConfig.window's: GPT-OSS) or those without rotary embedding
(ModelConfig.nope_every: Llama 4's NoPE layers); a model has at most one variant (pipesim.model.llama4_attention).
Stages in model order: stage s holds the `split[s]` layers after the earlier stages'. The cost model costs each kind
of layer once and counts it (pipesim.cost.stage_work, kernel_costs)."""

from __future__ import annotations

from dataclasses import replace

from pipesim.model.config import ModelConfig
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import is_moe_layer


def is_variant_layer(model: ModelConfig, layer: int) -> bool:
    """Whether layer `layer` (0-based) is one of the model's variant layers: windowed, or without RoPE."""
    return bool(model.windowed_layers(layer, 1) or model.nope_layers(layer, 1))


def variant_options(model: ModelConfig, opts: LayerOptions) -> LayerOptions:
    """A variant layer's options: the model's window on a windowed layer, no RoPE on a NoPE layer."""
    return replace(opts, nope=True) if model.nope_every else replace(opts, window=model.window_size)


def variant_per_stage(model: ModelConfig, split: list[int]) -> list[tuple[int, int]]:
    """Per stage (in model order): how many of its dense layers and of its MoE layers are the model's variant
    layers (`is_variant_layer`); (0, 0) everywhere without any."""
    out = []
    start = 0
    for n in split:
        layers = [layer for layer in range(start, start + n) if is_variant_layer(model, layer)]
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


__all__ = ["is_variant_layer", "moe_layers_per_stage", "variant_options", "variant_per_stage"]
