"""The two tensor records the per-layer costs list: a tensor a layer keeps for its backward, and a trainable one.

Their own module so that every layer's cost modules (the transformer's pipesim.model.activations and weight_tensors,
the Mamba mixer's pipesim.model.mamba_mixer) can list them without importing each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SavedTensor:
    """One tensor a layer keeps for its backward, on one rank, for one microbatch."""

    name: str
    nbytes: int  # bytes
    dropped_by: tuple[str, ...] = ()  # the --recompute-modules any of which re-runs it instead of keeping it
    only_with: str = ""  # saved only when this module is recomputed (an input its checkpoint keeps)
    block: str = "MLP"  # the block whose backward re-creates it: "attention" or "MLP"

    @property
    def core(self) -> bool:
        """Inside the attention core (what the default selective recomputation, core_attn, drops)."""
        return "core_attn" in self.dropped_by


@dataclass(frozen=True)
class WeightTensor:
    """One trainable tensor on one rank: its name, its shape, and `count` of them alike (a layer's local experts)."""

    name: str
    shape: tuple[int, ...]
    count: int = 1
    expert: bool = False  # a routed expert's: its gradient reduced over the expert-data-parallel group
    embedding: bool = False  # the word embedding or the output layer

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def matrix(self) -> bool:
        """A 2-D weight other than the embedding's and the output layer's: what Muon orthogonalizes."""
        return len(self.shape) == 2 and not self.embedding


__all__ = ["SavedTensor", "WeightTensor"]
