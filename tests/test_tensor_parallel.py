"""Tensor parallelism on real gloo groups: a sharded MLP block equals the unsharded one.

Each rank builds the full block and input from one seed, runs it unsharded as the reference, then
sharded over its tp group, and compares output, input grad and every (gathered) weight grad.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from executor.mesh import build_mesh_for
from executor.tensor_parallel import ColumnParallelLinear, RowParallelLinear, _reduce_scatter_dim0
from pipesim.errors import PipesimError
from pipesim.parallel_dims import ParallelDims
from tests.launch_shared import register_call

pytestmark = pytest.mark.dist

SEQ, BATCH, HIDDEN, FFN = 8, 2, 12, 16  # tokens (dim 0), samples, model width, inner width
TOL = {"rtol": 1e-5, "atol": 1e-5}  # float32


def _reference(seed: int):
    torch.manual_seed(seed)
    fc1, fc2 = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)
    x = torch.randn(SEQ, BATCH, HIDDEN)
    probe = torch.randn(SEQ, BATCH, HIDDEN)  # loss = <y, probe>, so dL/dy = probe (not all ones)
    return fc1, fc2, x, probe


def _gather(t: torch.Tensor, group, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _check_block(group, sequence_parallel: bool, seed: int) -> None:
    fc1, fc2, x, probe = _reference(seed)
    xr = x.clone().requires_grad_()
    (fc2(nn.functional.gelu(fc1(xr))) * probe).sum().backward()
    y_ref = fc2(nn.functional.gelu(fc1(x))).detach()

    col = ColumnParallelLinear(fc1, group, sequence_parallel=sequence_parallel)
    row = RowParallelLinear(fc2, group, sequence_parallel=sequence_parallel)
    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    tokens = slice(rank * SEQ // tp, (rank + 1) * SEQ // tp)
    xs = (x[tokens] if sequence_parallel else x).clone().requires_grad_()
    y = row(nn.functional.gelu(col(xs)))
    (y * (probe[tokens] if sequence_parallel else probe)).sum().backward()

    torch.testing.assert_close(y, y_ref[tokens] if sequence_parallel else y_ref, **TOL)
    torch.testing.assert_close(xs.grad, xr.grad[tokens] if sequence_parallel else xr.grad, **TOL)
    torch.testing.assert_close(_gather(col.weight.grad, group, 0), fc1.weight.grad, **TOL)
    torch.testing.assert_close(_gather(col.bias.grad, group, 0), fc1.bias.grad, **TOL)
    torch.testing.assert_close(_gather(row.weight.grad, group, 1), fc2.weight.grad, **TOL)
    torch.testing.assert_close(row.bias.grad, fc2.bias.grad, **TOL)
    assert col.weight.shape == (FFN // tp, HIDDEN) and row.weight.shape == (HIDDEN, FFN // tp)


def tp_checks_on_rank(folder: Path, *tp_sizes: int) -> None:
    """Rank side, in the session's shared launch of this world size (tests/workers/shared_ranks.py); the last tp
    size is 2 for the error checks. An assertion that fails here fails the test with its traceback."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for tp in tp_sizes:
        mesh = build_mesh_for(ParallelDims(dp=world // tp, tp=tp))  # the executor's TP groups (every rank makes all)
        group = mesh.tp_group  # rank in group != global rank when world > tp
        for sp in (False, True):
            _check_block(group, sp, seed=7 + mesh.coords.dp)
        # gloo runs all_reduce + slice; the native reduce_scatter (NCCL's path) must agree with it
        t = torch.arange(4.0 * tp * 3).view(4 * tp, 3) * (rank + 1)
        torch.testing.assert_close(_reduce_scatter_dim0(t, group, native=True),
                                   _reduce_scatter_dim0(t, group, native=False), rtol=0, atol=0)
    with pytest.raises(PipesimError, match="out_features 3 is not divisible by tensor-parallel size 2"):
        ColumnParallelLinear(nn.Linear(4, 3), group)
    with pytest.raises(PipesimError, match="in_features 5 is not divisible by tensor-parallel size 2"):
        RowParallelLinear(nn.Linear(5, 4), group)


WORLDS = [(2, (2,)), (4, (4, 2))]  # (ranks, tp sizes): one case per world size, in its shared launch
TP_CASES = {world: register_call(f"tensor_parallel_world{world}", world, f"{__name__}:tp_checks_on_rank", *tp_sizes)
            for world, tp_sizes in WORLDS}


@pytest.mark.parametrize(("world", "tp_sizes"), WORLDS, ids=["world2-tp2", "world4-tp4-then-2x-tp2"])
def test_mlp_block_matches_unsharded(world: int, tp_sizes: tuple[int, ...], shared_launches) -> None:
    """Every tp size of the world, checked on every rank of the session's shared launch of `world` ranks
    (tests/launch_shared.py: spawning is the slow part, paid once per world size for several modules)."""
    shared_launches.case(TP_CASES[world]).check()
