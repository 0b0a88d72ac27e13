"""A linear-attention layer's attention half (Qwen3-Next, Qwen3.5): its pre-norm, the Gated DeltaNet mixer
(pipesim.model.gdn_mixer) and the residual add, beside the block's MLP part.

Megatron-core's GPT layer with the "gated_delta_net" variant runs input norm -> GatedDeltaNet -> residual add, then
the layer's MLP or experts as any block (megatron/core/ssm/gated_delta_net). pipesim costs the norm and the add as the
attention sublayer's (a norm F 2nd, B 3nd; an add F 3nd, B 3nd on the rank's residual stream, split over tp under
sp); such a model has no biases and no dropout (pipesim.model.config refuses them with linear attention). Under full
recomputation the layer's forward is re-run first in I (the MLP part's by pipesim.model.layer_kernels).
"""

from __future__ import annotations

from pipesim.model.config import ModelConfig
from pipesim.model.gdn_mixer import GatedDeltaNet, gdn_kernels, gdn_saved
from pipesim.model.kernel_types import MemoryBound, PieceKernels
from pipesim.model.options import LayerOptions
from pipesim.model.tensor_types import SavedTensor


def _mixer(model: ModelConfig) -> GatedDeltaNet:
    linear = model.linear_attention
    assert linear is not None  # LayerOptions.check refuses mixer "gdn" without one
    return linear.mixer


def gdn_part_kernels(model: ModelConfig, b: int, opts: LayerOptions) -> PieceKernels:
    """The attention half of one linear-attention layer on one rank: the pre-norm, the mixer's kernels, the residual
    add; full recomputation's re-run of them first in I."""
    d = model.dtype_bytes
    tokens = b * opts.local_seq(model)
    hidden = opts.seq_sharded(tokens * model.hidden)  # residual-stream elements on this rank
    mixer = gdn_kernels(_mixer(model), model.hidden, tokens, opts.tp, sp=opts.sp, dtype_bytes=d, batch=b)
    norm = f"GDN {'RMSNorm' if model.norm == 'rmsnorm' else 'LayerNorm'}"
    f = [MemoryBound(norm, 2 * hidden * d), *mixer.F, MemoryBound("GDN residual add", 3 * hidden * d)]
    i = [MemoryBound("GDN residual add backward", 3 * hidden * d), *mixer.I,
         MemoryBound(f"{norm} backward", 3 * hidden * d)]
    if opts.recompute == "full":
        i = [*f, *i]
    return PieceKernels(tuple(f), tuple(i), mixer.W)


def gdn_part_saved(model: ModelConfig, b: int, opts: LayerOptions) -> list[SavedTensor]:
    """What the attention half of a linear-attention layer keeps (not under full recomputation, where the layer keeps
    its input alone): the pre-norm's input and the mixer's tensors."""
    d = model.dtype_bytes
    tokens = b * opts.local_seq(model)
    residual = opts.seq_sharded(d * tokens * model.hidden)
    return [SavedTensor("GDN norm input", residual, block="GDN"),
            *gdn_saved(_mixer(model), model.hidden, tokens, opts.tp, sp=opts.sp, dtype_bytes=d)]


__all__ = ["gdn_part_kernels", "gdn_part_saved"]
