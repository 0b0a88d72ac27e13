"""Megatron-core's hybrid models (Nemotron-H, Nemotron 3): one layer per symbol of a pattern, Mamba-2 mixers among
attention, MLP and mixture-of-experts layers.

Megatron-core builds a layer per character of `hybrid_layer_pattern` (megatron/core/models/hybrid, the symbols of
megatron/core/ssm/mamba_hybrid_layer_allocation.py; Hugging Face's nemotron_h `hybrid_override_pattern`): `M` a
Mamba-2 layer (its norm fused into in_proj, the mixer, a residual add), `*` self-attention alone, `-` an MLP alone,
`E` a mixture of experts alone. pipesim costs each as the part of a transformer block it is
(pipesim.model.layer_parts) or as the Mamba mixer (pipesim.model.mamba_mixer), counted per stage by kind
(pipesim.model.layer_kinds).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.model.mamba_mixer import MambaMixer
from pipesim.model.moe import MoeConfig

SYMBOL_PARTS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "mlp"}  # a symbol's LayerOptions.part
MOE = "E"  # the experts' symbol


@dataclass(frozen=True)
class HybridLayers:
    """A hybrid model's layers: `pattern`, one symbol per layer in model order, and its Mamba mixers' sizes."""

    pattern: str  # Megatron-core's hybrid_layer_pattern (M, *, -, E); no pipeline delimiters
    mamba: MambaMixer

    def __post_init__(self) -> None:
        if isinstance(self.mamba, dict):  # from to_dict / JSON
            object.__setattr__(self, "mamba", MambaMixer(**self.mamba))
        if not isinstance(self.mamba, MambaMixer):
            raise PipesimError(f"hybrid mamba must be a MambaMixer, got {type(self.mamba).__name__}")
        if not isinstance(self.pattern, str) or not self.pattern:
            raise PipesimError(f"hybrid pattern must be a non-empty string of {', '.join(SYMBOL_PARTS)}, "
                               f"got {self.pattern!r}")
        if "|" in self.pattern:
            raise PipesimError(f"hybrid pattern {self.pattern!r}: '|' (Megatron-core's pipeline stage boundaries) is "
                               "not read; give the stages' layers with --layer-split")
        unknown = sorted(set(self.pattern) - set(SYMBOL_PARTS))
        if unknown:
            raise PipesimError(f"hybrid pattern symbol {unknown[0]!r} is not modelled; pipesim reads M (Mamba), * "
                               "(attention), - (MLP) and E (mixture of experts)")

    def part(self, layer: int) -> str:
        """The LayerOptions.part of layer `layer` (0-based)."""
        return SYMBOL_PARTS[self.pattern[layer]]

    def is_moe(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) is a mixture of experts."""
        return self.pattern[layer] == MOE

    def moe_layers(self) -> tuple[int, ...]:
        """The E layers (0-based): MoeConfig.placement of the model's experts."""
        return tuple(layer for layer, symbol in enumerate(self.pattern) if symbol == MOE)

    def count(self, symbol: str) -> int:
        """How many layers of `symbol`."""
        return self.pattern.count(symbol)


# what Megatron-core's hybrid models are built without (HybridModelProvider's defaults: add_bias_linear False, no
# dropout, untied embeddings allowed) or what pipesim models for transformers only
NOT_WITH_HYBRID = (("mla", "latent attention"), ("mtp_layers", "multi-token prediction"),
                   ("window", "sliding-window attention"), ("nope_every", "NoPE layers"), ("post_norms", "post-norms"),
                   ("biases", "biases"), ("qkv_bias", "QKV biases"), ("dropout", "dropout"),
                   ("attention_sinks", "attention sinks"), ("embedding_scale", "a scaled embedding"))


def check_hybrid(hybrid: HybridLayers | None, *, kind: str, layers: int, moe: MoeConfig | None,
                 fields: dict[str, object]) -> None:
    """One line unless `hybrid` describes a model of `kind`, `layers` and experts `moe` whose fields (ModelConfig's,
    by name) hold none of NOT_WITH_HYBRID: a transformer whose layers the pattern lists one by one, its E layers the
    experts' placement."""
    if hybrid is None:
        return
    if not isinstance(hybrid, HybridLayers):
        raise PipesimError(f"hybrid must be a HybridLayers, got {type(hybrid).__name__}")
    if kind != "gpt":
        raise PipesimError("a hybrid pattern needs a transformer (--model gpt or --model-config)")
    if len(hybrid.pattern) != layers:
        raise PipesimError(f"hybrid pattern {hybrid.pattern!r} has {len(hybrid.pattern)} layers, the model {layers}")
    for name, what in NOT_WITH_HYBRID:
        if fields[name]:
            raise PipesimError(f"a hybrid (Mamba) model with {what} is not modelled")
    experts = hybrid.moe_layers()
    if (moe is None) != (not experts):
        raise PipesimError(f"hybrid pattern {hybrid.pattern!r}: " + ("E layers need the experts (moe)" if experts
                           else "experts (moe) need E layers in the pattern"))
    if moe is not None and moe.placement != experts:
        raise PipesimError(f"moe placement {moe.placement} is not the hybrid pattern's E layers {experts}")


__all__ = ["MOE", "NOT_WITH_HYBRID", "SYMBOL_PARTS", "HybridLayers", "check_hybrid"]
