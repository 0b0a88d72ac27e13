"""Sliding-window attention: layers whose queries see only the latest `size` keys, themselves included.

Mistral 7B v0.1 windows every layer (4,096 keys); GPT-OSS alternates a 128-key window with full attention,
starting windowed (transformers' GptOssConfig: layer l "sliding_attention" when (l + 1) % 2, else
"full_attention"). `full_every` says which layers keep full attention: layer l (0-based) when
(l + 1) % full_every == 0, Megatron-LM's --window-attn-skip-freq (its is_layer_window_attention: layer_number %
skip_freq != 0 is windowed, layer_number 1-based); 0: every layer windowed. A window at least as long as the
sequence is full attention.

A windowed layer's causal (query, key) pairs over s tokens, each query i seeing min(i + 1, w) keys:
    band_pairs(s, w) = w s - w (w - 1) / 2        (w < s)
what the model's FLOPs count (the full-square convention of pipesim.model.flops counts twice that, as it counts
s^2 for a causal layer's s^2 / 2). A flash kernel computes whole tiles of B x B (B = FLASH_QUERY_BLOCK): query
block i reaches from the key block of its first row's earliest key to its own diagonal block,
    band_tile_pairs(s, w) = sum over query blocks of (tiles reached) x B x (rows of the block)
which is the causal kernel's s^2 / 2 + s B / 2 (pipesim.device.kernels.causal_tile_factor) when w >= s, and
about (ceil((w - 1) / B) + 1) B s for a short window: GPT-OSS's 128 keys cost two tiles a row block, twice the
pairs it counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError


@dataclass(frozen=True)
class SlidingWindow:
    """Which layers attend over a window, and how many keys it holds."""

    size: int  # keys a windowed layer's query sees, itself included (Hugging Face's sliding_window)
    full_every: int = 0  # layer l keeps full attention when (l + 1) % full_every == 0; 0: every layer windowed

    def __post_init__(self) -> None:
        for name, low in (("size", 1), ("full_every", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise PipesimError(f"window {name} must be an integer of at least {low}, got {value!r}")
        if self.full_every == 1:
            raise PipesimError("window full_every 1 keeps every layer's full attention: give no window instead")

    def windowed(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) attends over the window (before the sequence is known)."""
        return not (self.full_every and (layer + 1) % self.full_every == 0)

    def windowed_layers(self, start: int, n: int) -> int:
        """How many of layers start .. start + n - 1 attend over the window."""
        return sum(self.windowed(layer) for layer in range(start, start + n))


__all__ = ["SlidingWindow"]
