"""A hybrid model's Mamba layer: its pre-norm, the Mamba-2 mixer (pipesim.model.mamba_mixer) and its residual add.

Megatron-core's MambaLayer (megatron/core/ssm/mamba_layer.py) runs norm -> mixer -> residual add, the norm fused into
in_proj's TELayerNormColumnParallelLinear (megatron/core/models/hybrid/hybrid_layer_specs.py). pipesim costs the norm
and the add as the attention sublayer's (pipesim.model.elementwise: a norm F 2nd, B 3nd; an add F 3nd, B 3nd on the
rank's residual stream, split over tp under sp); a hybrid model has no biases and no dropout
(pipesim.model.hybrid.check_hybrid), so nothing is fused with the add. Under full recomputation the layer keeps its
input and re-runs its forward first in I, as a transformer layer does; no selective module re-runs any of it.
"""

from __future__ import annotations

from pipesim.model.config import ModelConfig
from pipesim.model.kernel_types import MemoryBound, PieceKernels
from pipesim.model.mamba_mixer import MambaMixer, mamba_kernels, mamba_saved
from pipesim.model.options import LayerOptions
from pipesim.model.tensor_types import SavedTensor


def _mixer(model: ModelConfig) -> MambaMixer:
    hybrid = model.hybrid
    assert hybrid is not None  # LayerOptions.check refuses part "mamba" without one
    return hybrid.mamba


def _norm_name(model: ModelConfig) -> str:
    return "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"


def mamba_layer_kernels(model: ModelConfig, b: int, opts: LayerOptions) -> PieceKernels:
    """One Mamba layer's kernels on one rank for a microbatch of b sequences: the pre-norm, the mixer's, the residual
    add; full recomputation's re-run forward first in I."""
    d = model.dtype_bytes
    tokens = b * opts.local_seq(model)
    hidden = opts.seq_sharded(tokens * model.hidden)  # residual-stream elements on this rank
    mixer = mamba_kernels(_mixer(model), model.hidden, tokens, opts.tp, sp=opts.sp, dtype_bytes=d, batch=b)
    norm = f"Mamba {_norm_name(model)}"
    f = [MemoryBound(norm, 2 * hidden * d), *mixer.F, MemoryBound("Mamba residual add", 3 * hidden * d)]
    i = [MemoryBound("Mamba residual add backward", 3 * hidden * d), *mixer.I,
         MemoryBound(f"{norm} backward", 3 * hidden * d)]
    if opts.recompute == "full":
        i = [*f, *i]
    return PieceKernels(tuple(f), tuple(i), mixer.W)


def mamba_layer_saved(model: ModelConfig, b: int, opts: LayerOptions, recompute: str) -> list[SavedTensor]:
    """What one Mamba layer keeps for its backward: under full recomputation its input (sharded under sp), else the
    pre-norm's input and the mixer's tensors."""
    d = model.dtype_bytes
    tokens = b * opts.local_seq(model)
    residual = opts.seq_sharded(d * tokens * model.hidden)
    if recompute == "full":
        return [SavedTensor("layer input", residual)]
    return [SavedTensor("Mamba norm input", residual, block="Mamba"),
            *mamba_saved(_mixer(model), model.hidden, tokens, opts.tp, sp=opts.sp, dtype_bytes=d)]


__all__ = ["mamba_layer_kernels", "mamba_layer_saved"]
