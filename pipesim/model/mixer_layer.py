"""A layer whose sequence mixer replaces self-attention: its pre-norm, the mixer and its residual add.

A hybrid model's Mamba layer (Megatron-core's MambaLayer, megatron/core/ssm/mamba_layer.py: norm -> mixer -> residual
add; the mixer pipesim.model.mamba_mixer) and a linear-attention layer's attention half (Megatron-core's GPT layer
with the "gated_delta_net" variant: input norm -> GatedDeltaNet -> residual add, then the layer's MLP or experts as
any block; the mixer pipesim.model.gdn_mixer) share this frame. The norm is fused into in_proj's
TELayerNormColumnParallelLinear in both; pipesim costs the norm and the add as the attention sublayer's (a norm F
2nd, B 3nd; an add F 3nd, B 3nd on the rank's residual stream, split over tp under sp). Neither model has biases or
dropout (pipesim.model.hybrid and linear_attention refuse them), so nothing is fused with the add. Under full
recomputation the layer keeps its input (the caller's) and re-runs its forward first in I.
"""

from __future__ import annotations

from pipesim.model.config import ModelConfig
from pipesim.model.gdn_mixer import gdn_kernels, gdn_saved
from pipesim.model.kernel_types import MemoryBound, PieceKernels
from pipesim.model.layer_parts import MAMBA
from pipesim.model.mamba_mixer import mamba_kernels, mamba_saved
from pipesim.model.options import LayerOptions
from pipesim.model.tensor_types import SavedTensor


def _mixer(model: ModelConfig, opts: LayerOptions):
    """(the mixer's name in kernel and tensor names, its sizes, its kernels' and saved tensors' functions)."""
    if opts.part == MAMBA:
        assert model.hybrid is not None  # LayerOptions.check refuses part "mamba" without one
        return "Mamba", model.hybrid.mamba, mamba_kernels, mamba_saved
    assert model.linear_attention is not None  # LayerOptions.check refuses mixer "gdn" without it
    return "GDN", model.linear_attention.mixer, gdn_kernels, gdn_saved


def mixer_part_kernels(model: ModelConfig, b: int, opts: LayerOptions) -> PieceKernels:
    """The mixer half of one layer on one rank (a Mamba layer: the whole layer): the pre-norm, the mixer's kernels,
    the residual add; full recomputation's re-run of them first in I."""
    d = model.dtype_bytes
    tokens = b * opts.local_seq(model)
    hidden = opts.seq_sharded(tokens * model.hidden)  # residual-stream elements on this rank
    name, sizes, kernels, _ = _mixer(model, opts)
    mixer = kernels(sizes, model.hidden, tokens, opts.tp, sp=opts.sp, dtype_bytes=d, batch=b)
    norm = f"{name} {'RMSNorm' if model.norm == 'rmsnorm' else 'LayerNorm'}"
    f = [MemoryBound(norm, 2 * hidden * d), *mixer.F, MemoryBound(f"{name} residual add", 3 * hidden * d)]
    i = [MemoryBound(f"{name} residual add backward", 3 * hidden * d), *mixer.I,
         MemoryBound(f"{norm} backward", 3 * hidden * d)]
    if opts.recompute == "full":
        i = [*f, *i]
    return PieceKernels(tuple(f), tuple(i), mixer.W)


def mixer_part_saved(model: ModelConfig, b: int, opts: LayerOptions) -> list[SavedTensor]:
    """What the mixer half keeps without full recomputation: the pre-norm's input and the mixer's tensors."""
    d = model.dtype_bytes
    tokens = b * opts.local_seq(model)
    name, sizes, _, saved = _mixer(model, opts)
    return [SavedTensor(f"{name} norm input", opts.seq_sharded(d * tokens * model.hidden), block=name),
            *saved(sizes, model.hidden, tokens, opts.tp, sp=opts.sp, dtype_bytes=d)]


__all__ = ["mixer_part_kernels", "mixer_part_saved"]
