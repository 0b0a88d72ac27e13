"""What the sequence mixers that replace self-attention (Mamba-2: pipesim.model.mamba_mixer; Gated DeltaNet:
pipesim.model.gdn_mixer) share: their two projections, their chunked scan's chunks, and their sizes' checks.

Both mixers read their input through one column-parallel in_proj (outputs split over tp) and write through one
row-parallel out_proj (inputs split over tp) on every token of the microbatch (all-gathered under sequence
parallelism), and both scan each sequence in chunks, the last one padded (mamba_ssm's and FLA's chunked kernels).
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.kernel_types import Linear


def positive(what: str, value: object) -> None:
    """One line unless `value` is a positive integer (not a bool)."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise PipesimError(f"{what} must be a positive integer, not {value!r}")


def projections(hidden: int, in_width: int, inner: int, tokens: int, tp: int) -> tuple[Linear, Linear]:
    """in_proj (h -> `in_width`, column-parallel: outputs / tp) and out_proj (`inner` -> h, row-parallel: inputs /
    tp), on all `tokens`."""
    return ("in_proj", hidden, in_width // tp, tokens), ("out_proj", inner // tp, hidden, tokens)


def scan_chunks(chunk: int, tokens: int, batch: int) -> int:
    """Chunks of a microbatch: each of its `batch` sequences of tokens / batch in chunks of `chunk`, the last
    padded."""
    positive("tokens", tokens)
    positive("batch", batch)
    if tokens % batch:
        raise PipesimError(f"{tokens} tokens do not split into {batch} sequences of equal length")
    return batch * -(-(tokens // batch) // chunk)


__all__ = ["positive", "projections", "scan_chunks"]
