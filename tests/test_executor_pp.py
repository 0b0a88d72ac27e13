"""Pipeline-parallel execution equals single-process training, for every registered schedule."""

from __future__ import annotations

import copy

import pytest
import torch

import schedules
from executor.mesh import coords_of, grid
from executor.models import Block, build_full, piece_ranges
from executor.stage import Stage
from executor.timing import RankLog, median_step_time, step_times
from pipesim.model_config import ModelConfig
from tests.executor_helpers import TINY_GPT, assert_matches_reference, model_of, torchrun

STEPS = 3


def _stage_pair(module: torch.nn.Module, shape: tuple[int, ...]):
    torch.manual_seed(1)
    x = torch.randn(shape, requires_grad=True)
    g = torch.randn(shape)
    a, b = module, copy.deepcopy(module)
    return a, b, x, g


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_split_backward_equals_full_backward(kind):
    if kind == "mlp":
        cfg = ModelConfig(kind="mlp", hidden=8, layers=3)
        module, shape = torch.nn.Sequential(*build_full(cfg).pieces), (4, 8)
    else:
        cfg = ModelConfig(kind="gpt", hidden=8, heads=2, seq=5, layers=2)
        module, shape = torch.nn.Sequential(Block(cfg), Block(cfg)), (3, 5, 8)
    a, b, x, g = _stage_pair(module, shape)
    full = Stage(1, a, is_last=False, loss=None, scale=1.0)
    split = Stage(1, b, is_last=False, loss=None, scale=1.0)
    xa, xb = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    full.forward(0, xa)
    split.forward(0, xb)
    dx_full = full.backward(0, g)
    dx_split = split.backward_input(0, g)
    assert all(p.grad is None for p in b.parameters()), "I must not compute weight gradients"
    torch.testing.assert_close(dx_split, dx_full, rtol=0, atol=0)
    split.backward_weight(0)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-6, atol=1e-7)


def test_grid_coordinates_tp_innermost():
    assert grid(2, 2, 2).tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert [tuple(vars(coords_of(r, 2, 2, 2)).values()) for r in (0, 1, 2, 5, 7)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 1)]


def test_gpt_pieces_put_embedding_first_and_head_last():
    cfg = ModelConfig(kind="gpt", layers=5)
    assert piece_ranges(cfg, [3, 2]) == [range(0, 4), range(4, 7)]
    assert piece_ranges(ModelConfig(kind="mlp", layers=5), [1, 3, 1]) == [range(0, 1), range(1, 4), range(4, 5)]


@pytest.mark.dist
def test_every_schedule_trains_gpt_like_the_reference_on_two_ranks(tmp_path):
    names = schedules.names()  # a new registered schedule is picked up with no edit here
    proc = torchrun(2, [",".join(names), "--microbatches", "4", *TINY_GPT, "--steps", str(STEPS), "--quiet",
                        "--save-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    for name in names:
        assert_matches_reference(tmp_path, name, model_of(TINY_GPT), STEPS)


@pytest.mark.dist
def test_every_schedule_trains_mlp_like_the_reference_on_four_ranks_uneven_split_adam(tmp_path):
    names = [n for n in schedules.names() if not schedules.spec(n).virtual]  # interleaved: see the dp test
    mlp = ["--model", "mlp", "--hidden", "16", "--layers", "6", "--batch", "8"]
    proc = torchrun(4, [",".join(names), "--microbatches", "4", *mlp, "--layer-split", "1,2,2,1", "--optimizer",
                        "adam", "--lr", "0.001", "--steps", "2", "--quiet", "--save-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    for name in names:
        assert_matches_reference(tmp_path, name, model_of(mlp), 2, optimizer="adam", lr=0.001)


def test_step_time_spans_all_ranks_and_skips_warmup():
    a, b = RankLog(0), RankLog(1)
    a.steps = [(0, 50), (100, 160), (200, 240)]  # ns
    b.steps = [(10, 70), (105, 150), (190, 260)]
    times = step_times([a, b])
    assert times == [70e-9, 60e-9, 70e-9]
    assert median_step_time(times, warmup=1) == 65e-9
    assert median_step_time(times, warmup=5) == 70e-9  # no step left after warm-up: all count
