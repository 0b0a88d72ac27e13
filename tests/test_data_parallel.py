"""Data-parallel gradient averaging on real gloo groups, per parameter and in flat buckets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from executor.data_parallel import allreduce_gradients, plan_buckets
from executor.mesh import build_mesh_for
from pipesim.errors import PipesimError
from pipesim.parallel_dims import ParallelDims
from tests.launch_shared import register_call

SHAPES = [(3, 5), (7,), (4, 4), (2,), (6, 1)]  # 15, 7, 16, 2, 6 float32 elements


def _grads_of(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(s, generator=g) for s in SHAPES]


def test_plan_buckets_packs_in_order_up_to_the_limit() -> None:
    grads = [torch.zeros(s) for s in SHAPES]  # 60, 28, 64, 8, 24 bytes
    assert plan_buckets(grads, 100) == [[0, 1], [2, 3, 4]]  # 88; 64 + 8 + 24 = 96
    assert plan_buckets(grads, 64) == [[0], [1], [2], [3, 4]]
    assert plan_buckets(grads, 1) == [[0], [1], [2], [3], [4]]  # oversize grads get their own bucket
    assert plan_buckets(grads, 10**9) == [[0, 1, 2, 3, 4]]


def test_plan_buckets_splits_on_dtype_change() -> None:
    grads = [torch.zeros(2), torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]
    assert plan_buckets(grads, 10**6) == [[0], [1, 2]]


def test_plan_buckets_rejects_a_non_positive_size() -> None:
    with pytest.raises(PipesimError, match="bucket size must be at least 1 byte, got 0"):
        plan_buckets([torch.zeros(1)], 0)


def _mine(groups: list[list[int]], rank: int) -> list[int]:
    """The one group of a partition that holds `rank`."""
    (group,) = [g for g in groups if rank in g]
    return group


def allreduce_checks_on_rank(folder: Path) -> None:
    """Rank side, in the session's shared 4-rank launch (tests/workers/shared_ranks.py): the whole world, then
    the executor's DP groups of 2 inside it; an assertion that fails here fails the test with its traceback."""
    rank, world = dist.get_rank(), dist.get_world_size()
    expected = [torch.stack(parts).mean(0) for parts in zip(*(_grads_of(r) for r in range(world)))]
    for bucket_bytes, calls in ((None, len(SHAPES)), (100, 2), (1, len(SHAPES)), (10**9, 1)):
        params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
        for p, g in zip(params, _grads_of(rank)):
            p.grad = g
        no_grad = torch.nn.Parameter(torch.zeros(3))  # skipped, stays None
        assert allreduce_gradients([*params, no_grad], None, bucket_bytes=bucket_bytes) == calls
        assert no_grad.grad is None
        for p, want in zip(params, expected):
            torch.testing.assert_close(p.grad, want, rtol=1e-6, atol=1e-6)
    # the executor's meshes on this world: each group has the members ParallelDims gives (pp outermost,
    # tp innermost), written out here, and the DP groups average among themselves only
    # (mesh; its DP groups; its TP groups)
    meshes = [(build_mesh_for(ParallelDims(pp=2, dp=2)), [[0, 1], [2, 3]], None),
              (build_mesh_for(ParallelDims(dp=2, tp=2)), [[0, 2], [1, 3]], [[0, 1], [2, 3]])]
    for mesh, dp_groups, tp_groups in meshes:
        assert dist.get_process_group_ranks(mesh.dp_group) == mesh.members("dp") == _mine(dp_groups, rank)
        if tp_groups is None:
            assert mesh.tp_group is None
        else:
            assert dist.get_process_group_ranks(mesh.tp_group) == mesh.members("tp") == _mine(tp_groups, rank)
    for (mesh, dp_groups, _), bucket_bytes in zip(meshes, (None, 64)):
        params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
        for p, g in zip(params, _grads_of(rank)):
            p.grad = g
        allreduce_gradients(params, mesh.dp_group, bucket_bytes=bucket_bytes)
        a, b = _mine(dp_groups, rank)
        for p, mine_a, mine_b in zip(params, _grads_of(a), _grads_of(b)):
            torch.testing.assert_close(p.grad, (mine_a + mine_b) / 2, rtol=1e-6, atol=1e-6)


ALLREDUCE_CASE = register_call("data_parallel", 4, f"{__name__}:allreduce_checks_on_rank")


@pytest.mark.dist
def test_allreduce_gradients_is_the_mean_of_per_rank_grads(shared_launches) -> None:
    """World of 4, then the executor's DP groups of 2 inside it: checked on every rank of the session's shared
    4-rank launch (tests/launch_shared.py: starting processes is the slow part, paid once for several modules)."""
    shared_launches.case(ALLREDUCE_CASE).check()
