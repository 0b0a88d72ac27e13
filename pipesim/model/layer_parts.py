"""A transformer layer cut into its two sublayers: what of a block's kernels, saved tensors, collectives and weights
belong to its attention and what to its MLP.

Megatron-core's hybrid models (megatron/core/models/hybrid, the `hybrid_layer_pattern` of Nemotron-H and Nemotron 3)
build a layer per symbol: `*` an attention sublayer (norm, attention, residual add), `-` an MLP sublayer, `E` a
mixture-of-experts one, `M` a Mamba mixer. pipesim costs such a layer as the part of its block
(LayerOptions.part): the block's costs filtered by sublayer, so that the attention part plus the MLP part is the
block exactly (tests/test_layer_parts.py holds it as multisets). The names are the ones pipesim.model.layer_kernels,
activations, layer_collectives and weight_tensors give; a name of the MLP's starts with one of the prefixes below,
every other one is the attention's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from pipesim.errors import PipesimError
from pipesim.model.kernel_types import PieceKernels

BLOCK = "block"  # a whole transformer layer: attention and MLP
MAMBA = "mamba"  # a hybrid model's Mamba layer (pipesim.model.mixer_layer)
PARTS = (BLOCK, "attention", "mlp", MAMBA)  # LayerOptions.part

# kernel names (pipesim.model.layer_kernels, grouped_mlp_extras, shared_gate) of the MLP sublayer: its norm,
# linears, activation, residual add, the experts' router, permutation and grouped GEMMs, the shared experts
MLP_KERNELS = ("MLP ", "FC1", "FC2", "expert ", "shared ", "router", "token ", "weighted FC2 bias", "SwiGLU", "GeLU",
               "GeGLU", "squared ReLU")
MLP_SAVED = ("MLP ", "gate and up", "down projection", "GeLU input", "ReLU output", "second linear input",
             "dispatched tokens", "expert ", "routed ", "router ", "shared ")
MLP_TENSORS = ("MLP ", "FC1", "FC2", "expert ", "router", "shared expert")
MLP_COLLECTIVES = ("MLP", "shared experts'")  # anywhere in the text: "recompute: MLP output", "MLP ... amax"


def check_part(part: str) -> None:
    """One line unless `part` is a known LayerOptions.part."""
    if part not in PARTS:
        raise PipesimError(f"unknown layer part {part!r}; choose {', '.join(PARTS)}")


def kernel_sublayer(name: str) -> str:
    """The sublayer ("attention" or "mlp") a block's kernel of this name belongs to."""
    return "mlp" if name.startswith(MLP_KERNELS) else "attention"


def saved_sublayer(name: str) -> str:
    """The sublayer a block's saved tensor of this name belongs to."""
    return "mlp" if name.startswith(MLP_SAVED) else "attention"


def tensor_sublayer(name: str) -> str:
    """The sublayer a block's weight tensor of this name belongs to."""
    return "mlp" if name.startswith(MLP_TENSORS) else "attention"


def collective_sublayer(what: str) -> str:
    """The sublayer a block's tensor-parallel collective (its `what`) belongs to."""
    return "mlp" if any(word in what for word in MLP_COLLECTIVES) else "attention"


Options = TypeVar("Options")  # LayerOptions (pipesim.model.options imports this module)


def mlp_half(opts: Options) -> Options:
    """The options of a layer's MLP part, whatever the layer attends with: what a linear-attention layer keeps of the
    block beside its Gated DeltaNet (pipesim.model.mixer_layer)."""
    return replace(opts, mixer="attention", part="mlp")


def part_kernels(kernels: PieceKernels, part: str) -> PieceKernels:
    """The block's kernels of `part` (all of them for the block), in the block's order per phase."""
    if part == BLOCK:
        return kernels
    keep = [tuple(k for k in ks if kernel_sublayer(k.name) == part) for ks in kernels.phases()]
    return PieceKernels(*keep)


__all__ = ["BLOCK", "MAMBA", "PARTS", "check_part", "collective_sublayer", "kernel_sublayer", "mlp_half",
           "part_kernels", "saved_sublayer", "tensor_sublayer"]
