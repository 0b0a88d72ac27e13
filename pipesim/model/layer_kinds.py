"""Which of a model's layers are of which kind, and a stage's layers counted by kind.

A layer's costs depend on the model's shapes and on its kind: whether its MLP is the model's mixture of experts
(MoeConfig's placement) and whether it is one of the model's variant layers, attending over the sliding window
(ModelConfig.window: GPT-OSS, Gemma 3) or without rotary embedding (ModelConfig.nope_every: Llama 4's NoPE layers); a
model has at most one variant (pipesim.model.llama4_attention). Every per-stage cost (kernel seconds, FLOPs, stash,
parameters, tensors, FP8 copies) costs each kind once under `kind_options` and multiplies by its count, so that a
new kind of layer is a field here and a branch in the per-layer functions, not an edit of every stage-level sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.layer_parts import BLOCK
from pipesim.model.linear_attention import GDN
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import is_moe_layer


@dataclass(frozen=True, order=True)
class LayerKind:
    """What a layer's costs depend on beyond the model's shapes (ordered: dense before MoE, plain before variant)."""

    moe: bool = False  # its MLP is the model's mixture of experts
    variant: bool = False  # one of the model's variant layers: windowed or NoPE (`is_variant_layer`)
    part: str = BLOCK  # a transformer block, or a hybrid model's layer: its symbol's part (pipesim.model.hybrid)
    mixer: str = "attention"  # what it attends with: softmax attention, or Gated DeltaNet (linear_attention)


DENSE = LayerKind()
MOE = LayerKind(moe=True)


def is_variant_layer(model: ModelConfig, layer: int) -> bool:
    """Whether layer `layer` (0-based) is one of the model's variant layers: windowed, or without RoPE."""
    return bool(model.windowed_layers(layer, 1) or model.nope_layers(layer, 1))


def layer_kind(model: ModelConfig, layer: int) -> LayerKind:
    """The kind of layer `layer` (0-based) of `model`: a hybrid model's its pattern symbol's."""
    if model.hybrid is not None and layer < model.layers:
        return LayerKind(moe=model.hybrid.is_moe(layer), part=model.hybrid.part(layer))
    linear = model.linear_attention is not None and layer < model.layers and model.linear_attention.is_linear(layer)
    return LayerKind(moe=is_moe_layer(model, layer), variant=is_variant_layer(model, layer),
                     mixer=GDN if linear else "attention")


def variant_options(model: ModelConfig, opts: LayerOptions) -> LayerOptions:
    """A variant layer's options: the model's window on a windowed layer, no RoPE on a NoPE layer."""
    return replace(opts, nope=True) if model.nope_every else replace(opts, window=model.window_size)


def kind_options(model: ModelConfig, opts: LayerOptions, kind: LayerKind) -> LayerOptions:
    """The options a layer of `kind` is costed under: the job's, a variant layer's own where it is one, a hybrid
    model's layer as its part."""
    opts = variant_options(model, opts) if kind.variant else opts
    opts = opts if kind.mixer == "attention" else replace(opts, mixer=kind.mixer)
    return opts if kind.part == BLOCK else replace(opts, part=kind.part)


@dataclass(frozen=True)
class StageLayers:
    """A stage's (or chunk's) layers counted by kind: (kind, count) pairs in LayerKind order, every count positive."""

    counts: tuple[tuple[LayerKind, int], ...] = ()

    def __post_init__(self) -> None:
        merged: dict[LayerKind, int] = {}
        for kind, count in self.counts:
            if not isinstance(kind, LayerKind) or not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise PipesimError(f"a stage's layers are (LayerKind, count >= 0) pairs, got ({kind!r}, {count!r})")
            merged[kind] = merged.get(kind, 0) + count
        object.__setattr__(self, "counts", tuple(sorted((k, n) for k, n in merged.items() if n)))

    @classmethod
    def of(cls, model: ModelConfig, start: int, n: int) -> StageLayers:
        """Layers start .. start + n - 1 of `model` (a stage's, in model order) by kind."""
        return cls.at(model, range(start, start + n))

    @classmethod
    def at(cls, model: ModelConfig, layers: Iterable[int]) -> StageLayers:
        """The given layer indices of `model` by kind."""
        counts: dict[LayerKind, int] = {}
        for layer in layers:
            kind = layer_kind(model, layer)
            counts[kind] = counts.get(kind, 0) + 1
        return cls(tuple(counts.items()))

    @classmethod
    def uniform(cls, layers: int, moe_layers: int = 0) -> StageLayers:
        """`layers` plain layers, `moe_layers` of them with experts (a model without variant layers)."""
        if moe_layers > layers:
            raise PipesimError(f"{moe_layers} MoE layers among {layers} layers")
        return cls(((DENSE, layers - moe_layers), (MOE, moe_layers)))

    def __iter__(self) -> Iterator[tuple[LayerKind, int]]:
        return iter(self.counts)

    @property
    def layers(self) -> int:
        """How many layers in all."""
        return sum(n for _, n in self.counts)

    @property
    def moe_layers(self) -> int:
        """How many of them have experts."""
        return sum(n for kind, n in self.counts if kind.moe)

    @property
    def attention_layers(self) -> int:
        """How many of them attend with softmax attention: blocks and attention parts, not Gated DeltaNet or Mamba
        layers or MLP parts."""
        return sum(n for kind, n in self.counts if kind.part in (BLOCK, "attention") and kind.mixer == "attention")

    @property
    def variant_layers(self) -> int:
        """How many of them are the model's variant layers."""
        return sum(n for kind, n in self.counts if kind.variant)

    def plus(self, other: StageLayers) -> StageLayers:
        """These layers and `other`'s together."""
        return StageLayers(self.counts + other.counts)

    def minus(self, other: StageLayers) -> StageLayers:
        """These layers less `other`'s (a subset of them: the bf16 layers of --first-last-layers-bf16)."""
        left = dict(self.counts)
        for kind, n in other.counts:
            if left.get(kind, 0) < n:
                raise PipesimError(f"{n} layers of kind {kind} are not among this stage's {self.counts}")
            left[kind] -= n
        return StageLayers(tuple(left.items()))


def stage_layers(model: ModelConfig, split: Iterable[int]) -> list[StageLayers]:
    """Each stage's layers by kind, stages in model order: stage s holds the `split[s]` layers after the earlier
    stages'."""
    out = []
    start = 0
    for n in split:
        out.append(StageLayers.of(model, start, n))
        start += n
    return out


__all__ = ["DENSE", "MOE", "LayerKind", "StageLayers", "is_variant_layer", "kind_options", "layer_kind",
           "stage_layers", "variant_options"]
