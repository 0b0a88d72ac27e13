"""What a rank reduces between its last backward and the optimizer step, in the order it runs them.

After the last action of a step the gradients are still each rank's own share: under sequence parallelism the
parameters outside the TP layers saw 1/tp of the tokens (summed over the TP group; the QK-norms saw 1/tp of the heads,
with or without it), a head tied to the embedding on another rank holds its copy's (summed with the first stage's, as
Megatron-LM does), DualPipe's two chains hold two copies of each model stage (summed between the copies' ranks,
executor.replicas), and data parallelism holds one replica per dp rank (averaged over the DP group; the routed experts'
gradients over their expert-data-parallel group instead). The runtime (executor.runtime) runs
`GradientSync.reductions` one after the other, naming each as what its rank is doing, and times each as one
"all_reduce" collective. Kept apart from the interpreter because none of it depends on the program: which reductions a
rank runs is known once its stages are built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch.distributed as dist
from torch import nn

from executor.data_parallel import allreduce_gradients
from executor.experts import expert_parameters
from executor.mesh import Mesh
from executor.models import Embed, Head, head_parameters, replicated_parameters
from executor.replicas import sum_chain_replicas, sum_tied_embedding, tied_partner
from executor.stage import Stage
from pipesim.ir.schedule import Schedule


@dataclass(frozen=True)
class Reduction:
    """One reduction of a step: what the rank is doing meanwhile (its failure line names it), and the call."""

    text: str
    run: Callable[[], int] | None  # returns the bytes reduced; None: nothing to reduce on this rank


class GradientSync:
    """This rank's gradient reductions after the backward: TP sum of replicated parameters, the chain replicas' sum,
    the DP (and expert-data-parallel) mean."""

    def __init__(self, schedule: Schedule, me: int, stages: dict[int, Stage], mesh: Mesh,
                 params: list[nn.Parameter], *, sp: bool, bucket_bytes: int | None, tied: bool = False) -> None:
        """`params`: the stages' parameters; `sp`: sequence parallelism over tp > 1 ranks; `bucket_bytes`: the DP
        all-reduce's buckets (None: one all_reduce per parameter, executor.data_parallel); `tied`: the head's weight
        is the embedding's, summed between the first and last stage when two ranks hold them."""
        modules = [st.module for st in stages.values()]
        self.mesh, self.params, self.bucket_bytes = mesh, params, bucket_bytes  # bucket_bytes in bytes
        self.experts = {id(p) for p in expert_parameters(modules)}  # reduced over edp, not dp
        # routed experts are not replicated over tp: each tp rank holds its ep coordinate's own (etp 1); without
        # sequence parallelism only the QK-norms and the attention sinks see a share (their rank's heads)
        partial_sums = replicated_parameters(modules) if sp else head_parameters(modules) if mesh.tp > 1 else []
        self.replicated = [p for p in partial_sums if id(p) not in self.experts]
        reductions = []
        if self.replicated:
            reductions.append(Reduction("the tensor-parallel all-reduce of replicated gradients", self._sum_replicated))
        if schedule.chains > 1:
            reductions.append(Reduction("the sum of the replicated stages' gradients",
                                        partial(sum_chain_replicas, schedule, me, stages, mesh)))
        ends = tied_partner(schedule) if tied else None
        if ends is not None and me in ends:
            weight = next(piece.tok.weight if isinstance(piece, Embed) else piece.out.weight for st in stages.values()
                          for piece in st.module.pieces.values() if isinstance(piece, Embed | Head))
            reductions.append(Reduction("the sum of the tied embedding's gradients between the first and last stage",
                                        partial(sum_tied_embedding, schedule, me, weight, mesh)))
        data_parallel = mesh.dp > 1 or mesh.edp_group is not None  # else the phase is named, nothing reduced
        reductions.append(Reduction("the data-parallel gradient all-reduce",
                                    self._allreduce if data_parallel else None))
        self.reductions: tuple[Reduction, ...] = tuple(reductions)

    def _allreduce(self) -> int:
        """Average gradients over the DP group; returns the bytes reduced.

        A routed expert's gradient already sums the rows of its ep group's ranks (the all-to-all brought them; under
        sequence parallelism each tp rank's rows are its share of a replica's loss): it is summed over the
        expert-data-parallel group and divided by dp, so it is the mean over all replicas as the dense gradients
        are."""
        grads = [p for p in self.params if p.grad is not None]
        nbytes = sum(p.grad.numel() * p.grad.element_size() for p in grads)
        dense = [p for p in grads if id(p) not in self.experts]
        if self.mesh.dp > 1:
            allreduce_gradients(dense, self.mesh.dp_group, bucket_bytes=self.bucket_bytes)
        experts = [p for p in grads if id(p) in self.experts]
        if experts and self.mesh.edp_group is not None:
            allreduce_gradients(experts, self.mesh.edp_group, bucket_bytes=self.bucket_bytes)  # mean over edp
        scale = self.mesh.dims.edp / self.mesh.dims.dp_cp  # the edp mean times edp: their sum, over dp replicas
        for p in experts:
            p.grad.mul_(scale)
        return nbytes

    def _sum_replicated(self) -> int:
        """Parameters outside the TP layers that saw 1/tp of the rows (sequence parallel) or of the heads (QK-norm):
        sum their grads."""
        nbytes = 0
        for p in self.replicated:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.mesh.tp_group)
                nbytes += p.grad.numel() * p.grad.element_size()
        return nbytes


__all__ = ["GradientSync", "Reduction"]
