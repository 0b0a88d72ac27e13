"""Delayed FP8 scaling's amax all-reduce: once at the end of each forward, and of each backward, of a stage's layers,
over every rank of the stage (tp x dp x cp), blocking the compute stream.

Megatron-core (NVIDIA/Megatron-LM @ d98e8a64dd) wraps a stage's whole layer loop in one fp8_autocast under the
delayed recipe (megatron/core/transformer/transformer_block.py: use_outer_quantization_context), whose fp8_group is
get_amax_reduction_group(with_context_parallel=True) (megatron/core/fp8_utils.py get_fp8_context): the stage's
tp x dp x cp ranks. Transformer Engine (NVIDIA/TransformerEngine @ d0067d0da, transformer_engine/pytorch/
quantization.py) reduces at the autocast's exit (forward) and at the end of the backward of its first module
(backward): reduce_and_update_fp8_tensors concatenates every module's current amaxes (amax_history[0]) and
all-reduces them with MAX, async_op=False, before it updates the scales. Bytes: a float32 per amax, 3 per GEMM in
the forward (input, weight, output) and 2 in the backward (output and input gradients), four GEMMs a layer (QKV,
projection, FC1, FC2; a MoE layer's grouped experts hold more, one set per local expert GEMM, which this count
leaves out: a few kilobytes at most, the all-reduce latency-bound either way). The current-scaling recipes reduce
per tensor over tp instead (pipesim.model.layer_collectives' amax reductions); the block-scaled ones reduce nothing.
"""

from __future__ import annotations

from pipesim.comm.tp_collective import TpCollective
from pipesim.model.fp8 import Fp8Options

AMAX_BYTES = 4  # one float32 amax
GEMMS_PER_LAYER = 4  # QKV, projection, FC1, FC2
FORWARD_AMAXES, BACKWARD_AMAXES = 3, 2  # per GEMM: input, weight, output; output and input gradients
AMAX_GROUP = "tp_dp_cp"  # every rank of the stage (pipesim.parallel_dims.ParallelDims.group)


def amax_reductions(fp8: Fp8Options | None, layers: int, *, first_stage: bool) -> dict[str, tuple[TpCollective, ...]]:
    """{action kind: its amax all-reduce} of a stage whose `layers` run in FP8 under delayed scaling: F's, and the
    backward's in B and in I (the first stage's backward is its W); {} under any other recipe or without FP8
    layers."""
    if fp8 is None or fp8.recipe != "delayed" or layers == 0:
        return {}
    forward = TpCollective("all_reduce", AMAX_BYTES * FORWARD_AMAXES * GEMMS_PER_LAYER * layers, axis=AMAX_GROUP)
    backward = TpCollective("all_reduce", AMAX_BYTES * BACKWARD_AMAXES * GEMMS_PER_LAYER * layers, axis=AMAX_GROUP)
    return {"F": (forward,), "W" if first_stage else "I": (backward,), "B": (backward,)}


__all__ = ["AMAX_GROUP", "amax_reductions"]
