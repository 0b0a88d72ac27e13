"""Qwen3-Next's and Qwen3.5's layers: Gated DeltaNet (linear attention) in place of self-attention on all but every
k-th layer, and the gated attention of the others.

Megatron-core builds them as a GPT model's "gated_delta_net" experimental attention variant
(megatron/core/ssm/gated_delta_net; Megatron-Bridge's Qwen3NextBridge at 067f987df: experimental_attention_variant
"gated_delta_net", linear_attention_freq from the file's full_attention_interval, attention_output_gate): layer l
attends with softmax attention when (l + 1) % full_every == 0 (megatron/training/training.py's pattern for an
integer linear_attention_freq), with its Gated DeltaNet mixer (pipesim.model.gdn_mixer) otherwise; every layer keeps
its MLP or experts. pipesim costs a linear-attention layer as its norm, the mixer and its residual add
(pipesim.model.mixer_layer) beside the block's MLP part (pipesim.model.layer_parts), counted per stage by kind
(pipesim.model.layer_kinds: LayerKind.mixer).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.model.gdn_mixer import GatedDeltaNet

GDN = "gdn"  # LayerOptions.mixer of a linear-attention layer
MIXERS = ("attention", GDN)  # LayerOptions.mixer: what a block attends with


@dataclass(frozen=True)
class LinearAttention:
    """A model's linear-attention layers: all but every `full_every`-th, each a Gated DeltaNet `mixer`."""

    mixer: GatedDeltaNet
    full_every: int = 4  # layer l attends fully when (l + 1) % full_every == 0 (Qwen3-Next's full_attention_interval)

    def __post_init__(self) -> None:
        if isinstance(self.mixer, dict):  # from to_dict / JSON
            object.__setattr__(self, "mixer", GatedDeltaNet(**self.mixer))
        if not isinstance(self.mixer, GatedDeltaNet):
            raise PipesimError(f"linear attention's mixer must be a GatedDeltaNet, got {type(self.mixer).__name__}")
        k = self.full_every
        if not isinstance(k, int) or isinstance(k, bool) or k < 2:
            raise PipesimError(f"linear attention's full_every must be an integer >= 2 (every k-th layer attends "
                               f"fully), got {k!r}")

    def is_linear(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) attends with the Gated DeltaNet mixer."""
        return (layer + 1) % self.full_every != 0


# what pipesim does not model beside linear attention (ModelConfig's fields)
NOT_WITH_LINEAR = (("mla", "latent attention"), ("mtp_layers", "multi-token prediction"),
                   ("window", "sliding-window attention"), ("nope_every", "NoPE layers"), ("biases", "biases"),
                   ("dropout", "dropout"), ("hybrid", "a hybrid (Mamba) pattern"), ("attention_sinks", "sinks"))


def check_linear_attention(linear: LinearAttention | None, *, kind: str, gate: bool, mla: bool,
                           fields: dict[str, object]) -> None:
    """One line unless `linear` (and the attention output `gate`) suit a model of `kind` whose fields (ModelConfig's,
    by name) hold none of NOT_WITH_LINEAR."""
    if gate and (kind != "gpt" or mla):
        raise PipesimError("an attention output gate (attention_gate) needs a transformer's standard attention")
    if linear is None:
        return
    if not isinstance(linear, LinearAttention):
        raise PipesimError(f"linear_attention must be a LinearAttention, got {type(linear).__name__}")
    if kind != "gpt":
        raise PipesimError("linear attention needs a transformer (--model gpt or --model-config)")
    for name, what in NOT_WITH_LINEAR:
        if fields[name]:
            raise PipesimError(f"linear attention (Gated DeltaNet) with {what} is not modelled")


def check_mixer(mixer: str) -> None:
    """One line unless `mixer` is a known LayerOptions.mixer."""
    if mixer not in MIXERS:
        raise PipesimError(f"unknown attention mixer {mixer!r}; choose {' or '.join(MIXERS)}")


__all__ = ["GDN", "MIXERS", "NOT_WITH_LINEAR", "LinearAttention", "check_linear_attention", "check_mixer"]
