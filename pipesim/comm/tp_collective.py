"""One tensor-parallel collective inside a compute action, as the cost model hands it to the simulator.

Megatron's layer runs its TP collectives inside F, B, I and W: most block the rank (the forward's
all-reduce, sequence parallelism's all-gather and reduce-scatter), and on the kernel path with
`--async-tensor-model-parallel-allreduce` a fused backward's input-gradient collective runs beside the
weight-gradient GEMM instead, which loses the SMs of NCCL's channels meanwhile
(pipesim.comm.overlap_interference); with `--tp-comm-overlap` the dense linears' collectives run inside their own
GEMMs by Transformer Engine's userbuffers (pipesim.comm.ub_overlap). One record type for all, so no consumer tells
shapes apart; `axis` names another of the stage's groups where a collective is not tp's (delayed FP8 scaling's amax
all-reduce over the whole stage: pipesim.cost.fp8_amax).
"""

from __future__ import annotations

from typing import NamedTuple

from pipesim.comm.overlap_interference import HidingGemm
from pipesim.comm.ub_overlap import UbMethod


class TpCollective(NamedTuple):
    """A collective over one of the stage's groups (tp unless `axis` says otherwise): `nbytes` of `kind`, blocking or
    beside a GEMM."""

    kind: str  # "all_reduce", "all_gather" or "reduce_scatter"
    nbytes: int  # bytes of the full tensor (the collective's size as nccl-tests count it)
    beside: HidingGemm | None = None  # the GEMM it runs beside (sharing its SMs); None: it blocks whole
    ub: UbMethod | None = None  # with `beside`: by userbuffers' method (pipesim.comm.ub_overlap), else NCCL beside it
    axis: str = "tp"  # the group (pipesim.parallel_dims.ParallelDims.group's axis)


__all__ = ["TpCollective"]
