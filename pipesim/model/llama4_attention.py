"""Llama 4's attention: NoPE layers, a weightless L2 QK-norm, and chunked attention no longer than its chunk.

NoPE layers (`ModelConfig.nope_every` N): layer l (0-based) takes no rotary embedding when (l + 1) % N == 0, the
others rotate queries and keys as usual. Llama 4 sets N = 4 (transformers' Llama4TextConfig: no_rope_layers built
from no_rope_layer_interval 4, a 0 where (l + 1) % 4 == 0); Megatron-core's --no-rope-freq 4 is the same pattern
(core_v0.15.3 transformer_config.py: [0] * (N - 1) + [1] repeated, 1 = no RoPE; attention.py drops
rotary_pos_emb there). A NoPE layer runs no RoPE kernel, forward or backward; nothing else in it changes.

The L2 QK-norm (`ModelConfig.qk_l2_norm`): every query and key head divided by its root mean square over head_dim,
with no weight (transformers' Llama4TextL2Norm; Megatron-core's --qk-l2-norm, torch_norm.L2Norm under jit_fuser: one
fused kernel each way, a weightless RMSNorm's bytes). Megatron-core's layer spec (gpt_layer_specs.py: L2Norm as
q_layernorm and k_layernorm) puts it on every layer, which pipesim builds and costs; transformers and NeMo's own Llama 4
spec (NeMo's nemo/collections/llm/gpt/model/llama4_utils.py get_llama4_layer_spec: "if config.qk_l2_norm and not
is_nope_layer") leave it off the NoPE layers, so for their runs pipesim counts two small kernels each way (and their
saved inputs) more per NoPE layer. It has no parameter.

Chunked attention (`ModelConfig.attention_chunk`): Llama 4's RoPE layers attend within chunks of 8,192 tokens
(transformers' layer_types "chunked_attention"), a query seeing only the keys of its own chunk. Over a sequence no
longer than the chunk that is causal attention, exactly. Megatron-core (core_v0.15.3) has no chunked attention; NeMo's
Llama4SelfAttention cuts every layer's queries, keys and values into chunks past it (NoPE layers too), and NVIDIA's
Llama 4 pretraining recipes run 8,192 tokens. A longer sequence is refused: its block-diagonal mask's costs are not
modelled.
"""

from __future__ import annotations

from pipesim.errors import PipesimError


def is_nope_layer(nope_every: int, layer: int) -> bool:
    """Whether layer `layer` (0-based) takes no rotary embedding under a NoPE period `nope_every` (0: none)."""
    return bool(nope_every) and (layer + 1) % nope_every == 0


def nope_layers(nope_every: int, start: int, n: int) -> int:
    """How many of layers start .. start + n - 1 take no rotary embedding."""
    return sum(is_nope_layer(nope_every, layer) for layer in range(start, start + n))


def nope_period(nope: list[bool]) -> int | None:
    """The NoPE period whose layers are exactly `nope`'s True ones (0: none), or None when no period N >= 2 gives
    them (a pattern pipesim cannot say)."""
    first = next((layer for layer, off in enumerate(nope) if off), None)
    every = 0 if first is None else first + 1
    if every == 1 or any(is_nope_layer(every, layer) != off for layer, off in enumerate(nope)):
        return None
    return every


def check_llama4_attention(model) -> None:  # a ModelConfig, whose __post_init__ calls this (it imports this module)
    """Types and combinations of the three fields: a transformer with rotary positions and standard attention,
    no sliding window beside NoPE layers (pipesim costs one kind of layer apart from the rest), a chunk at least
    as long as the sequence."""
    every = model.nope_every
    if not isinstance(every, int) or isinstance(every, bool) or every < 0:
        raise PipesimError(f"nope_every must be a non-negative integer, got {every!r}")
    if model.nope_every == 1:
        raise PipesimError("nope_every 1 leaves every layer without positions: a NoPE period is at least 2 (for "
                           "no positions at all, learned or none, --position-embedding-type learned_absolute)")
    if not isinstance(model.qk_l2_norm, bool):
        raise PipesimError(f"qk_l2_norm must be true or false, got {model.qk_l2_norm!r}")
    chunk = model.attention_chunk
    if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
        raise PipesimError(f"attention_chunk must be a positive integer or null, got {chunk!r}")
    on = [name for name, here in (("NoPE layers (nope_every)", model.nope_every), ("the L2 QK-norm (qk_l2_norm)",
                                  model.qk_l2_norm), ("chunked attention (attention_chunk)", chunk is not None))
          if here]
    if not on:
        return
    if model.kind != "gpt" or model.mla is not None:
        raise PipesimError(f"{on[0]} needs a transformer with standard attention (--model gpt, no latent attention)")
    if model.nope_every and model.positions != "rope":
        raise PipesimError("NoPE layers (nope_every) need rotary positions on the others (--positions rope)")
    if model.qk_l2_norm and model.qk_norm:
        raise PipesimError("qk_l2_norm and qk_norm together: Megatron-core builds the L2 norm in place of the "
                           "layer norm (--qk-l2-norm wins over --qk-layernorm); give one")
    if model.nope_every and model.window is not None:
        raise PipesimError("NoPE layers beside a sliding window are not modelled (no published model has both)")
    if chunk is not None and model.seq > chunk:
        raise PipesimError(f"chunked attention over --seq {model.seq}, longer than its chunk of {chunk} tokens, is "
                           f"not modelled (Megatron-core has none): give --seq {chunk} or less")


__all__ = ["check_llama4_attention", "is_nope_layer", "nope_layers", "nope_period"]
