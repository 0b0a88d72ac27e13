"""Full-model parameter views of a rank's stages, for saving and for comparing with the reference.

Tensor-parallel shards are gathered back into full tensors over the TP group (column-parallel:
output rows, regrouped for qkv; row-parallel: input columns, bias replicated).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from executor.mesh import Mesh
from executor.models import EMBEDDING_WEIGHT


def _gather(shard: torch.Tensor, dim: int, group, size: int) -> torch.Tensor:
    parts = [torch.empty_like(shard) for _ in range(size)]
    dist.all_gather(parts, shard.detach().contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def ungroup_rows_by_rank(t: torch.Tensor, blocks: tuple[int, ...], tp: int) -> torch.Tensor:
    """Inverse of `models.group_rows_by_rank`: rows [A0 B0 | A1 B1] back to [A0 A1 | B0 B1]."""
    if len(blocks) == 1:
        return t
    per_rank = t.reshape(tp, t.shape[0] // tp, *t.shape[1:]).split([rows // tp for rows in blocks], dim=1)
    return torch.cat([part.reshape(rows, *t.shape[1:]) for part, rows in zip(per_rank, blocks, strict=True)])


def full_parameters(stages: dict, mesh: Mesh) -> dict[str, torch.Tensor]:
    """{full-model name: tensor} for every parameter this rank holds (collective over TP when tp > 1)."""
    return module_parameters([stage.module for stage in stages.values()], mesh.tp, mesh.tp_group)


def module_parameters(modules: Iterable[nn.Module], tp: int = 1, tp_group=None) -> dict[str, torch.Tensor]:
    """{full-model name: CPU copy} of the stage modules' parameters; with tp > 1 the shards are gathered over
    `tp_group` (collective). With tp 1 no process group is needed: a result can answer after its run is over."""
    out: dict[str, torch.Tensor] = {}
    if tp > 1:
        from executor.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    for stage_module in modules:
        for mod_name, module in stage_module.named_modules():
            direct = dict(module.named_parameters(recurse=False))
            if not direct:
                continue
            prefix = f"{mod_name}." if mod_name else ""
            tied = getattr(module, "tied_head", False)  # a tied head's weight is the embedding's (or its copy)
            for pname, param in direct.items():
                tensor = param.detach()
                if tp > 1 and isinstance(module, ColumnParallelLinear):
                    blocks = getattr(module, "blocks", (tensor.shape[0] * tp,))  # qkv: q, k, v; SwiGLU's fc1: gate, up
                    tensor = ungroup_rows_by_rank(_gather(tensor, 0, tp_group, tp), blocks, tp)
                elif tp > 1 and isinstance(module, RowParallelLinear) and pname == "weight":
                    tensor = _gather(tensor, 1, tp_group, tp)
                out[EMBEDDING_WEIGHT if tied and pname == "weight" else prefix + pname] = tensor.cpu().clone()
    return out
