"""`pipesim run` refuses, before launching, a model whose weights alone cannot fit in this machine's memory: the floor
is each rank's parameter share (over pp x tp, the experts' over ep too) with its gradient and Adam's two states, in
the model's dtype; it never refuses what could fit."""

from __future__ import annotations

import pytest

from executor.run_config import RunConfig
from pipesim.commands.run_memory import check_host_memory, state_floor
from pipesim.errors import PipesimError
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.param_counts import model_params
from pipesim.parallel_dims import ParallelDims

MLP = ModelConfig(kind="mlp", hidden=256, layers=4, batch=8)


def test_the_floor_is_the_ranks_share_of_parameters_gradients_and_optimizer_states():
    params = model_params(MLP)
    sgd = RunConfig(names=("1f1b",), model=MLP)
    assert state_floor(sgd, 2) == int(params / 2 * 2 * 4)  # pp 2: half the parameters, each with its gradient
    adam = RunConfig(names=("1f1b",), model=MLP, optimizer="adam")
    assert state_floor(adam, 4) == int(params / 4 * 4 * 4)  # pp 4, Adam's exp_avg and exp_avg_sq as well
    dp = RunConfig(names=("1f1b",), model=MLP, job=Job(dims=ParallelDims(dp=2)))
    assert state_floor(dp, 4) == state_floor(sgd, 2)  # data parallelism replicates, it does not shard
    half = RunConfig(names=("1f1b",), model=ModelConfig(kind="mlp", hidden=256, layers=4, batch=8, dtype="bfloat16"))
    assert state_floor(half, 2) == state_floor(sgd, 2) // 2


def test_refused_only_above_the_machines_memory():
    cfg = RunConfig(names=("1f1b",), model=MLP, optimizer="adam")
    floor = state_floor(cfg, 2)
    check_host_memory(cfg, 2, 2, memory=2 * floor)  # fits exactly: accepted
    with pytest.raises(PipesimError, match=r"parameters, gradients and Adam's two states alone need .* GiB on each "
                                           r"of the 2 ranks here"):
        check_host_memory(cfg, 2, 2, memory=2 * floor - 1)
    check_host_memory(RunConfig(names=("1f1b",), model=MLP, backend="nccl"), 2, 2, memory=1)  # GPUs: their own
