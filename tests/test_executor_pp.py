"""Pipeline-parallel execution equals single-process training, for every registered schedule (two ranks),
with and without activation recomputation.

One chain of `pipesim run` configurations (`--then`) serves the launch tests, run in the session's shared 2-rank
launch (tests/launch_shared.py); the four-rank runs are in test_executor_parallel.py.
"""

from __future__ import annotations

import copy
import json
import statistics

import pytest
import torch

import executor.transformer
import schedules
from executor.models import build_full, build_stages, piece_ranges, set_recompute
from executor.stage import Stage
from executor.timing import RankLog, median_step_time, step_times
from executor.transformer import Block
from pipesim.ir import torch_csv
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Action, Kind
from pipesim.model.config import ModelConfig
from pipesim.timeline import Timeline
from tests.executor_helpers import TINY_GPT, assert_matches_reference, chain, model_of
from tests.launch_shared import register_run

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


def test_gpt_pieces_put_embedding_first_and_head_last():
    cfg = ModelConfig(kind="gpt", layers=5)
    assert piece_ranges(cfg, [3, 2]) == [range(0, 4), range(4, 7)]
    assert piece_ranges(ModelConfig(kind="mlp", layers=5), [1, 3, 1]) == [range(0, 1), range(1, 4), range(4, 5)]


# V placement (rank 0 holds stages 0 and 3), split backward: exercises stage-to-stage hand-off on one rank
V_CSV = ("0F0,3F0,3I0,0I0,0F1,3F1,3I1,3W0,0I1,3W1,0W0,0W1\n"
         "1F0,2F0,2I0,1I0,2W0,1F1,2F1,2I1,1I1,1W0,1W1,2W1\n")


def _two_rank_flags(d):
    """`pipesim run` flags for 2 ranks: a torch CSV schedule (progress, --json, --trace), then `--then` every
    registered schedule on a GPT, in the same process group."""
    (d / "v.csv").write_text(V_CSV)
    # no -m: the CSV's own 2 microbatches
    csv_run = ["--from-csv", str(d / "v.csv"), "--model", "mlp", "--hidden", "16", "--layers",
               "4", "--batch", "8", "--steps", "3", "--pg-timeout", "20", "--json", str(d / "result.json"), "--trace",
               str(d / "measured.json"), "--save-dir", str(d / "csv")]
    gpt_run = [",".join(schedules.names()), "--microbatches", "4", *TINY_GPT, "--steps", str(STEPS), "--quiet",
               "--save-dir", str(d / "gpt")]
    full = [*gpt_run[:-1], str(d / "full"), "--recompute", "full"]
    selective = ["1f1b,zb-h1", *gpt_run[1:-1], str(d / "selective"), "--recompute", "selective"]
    return chain(csv_run, gpt_run, full, selective)


TWO_RANKS = register_run("executor_pp", 2, _two_rank_flags)  # one launch with the other modules' 2-rank cases


@pytest.fixture(scope="module")
def two_ranks(shared_launches):
    """The case's folder and its part of the launch's stderr (tests/launch_shared.py)."""
    return shared_launches.case(TWO_RANKS)


@pytest.mark.dist
def test_every_schedule_trains_gpt_like_the_reference_on_two_ranks(two_ranks):
    d = two_ranks.check()
    for name in schedules.names():  # a new registered schedule is picked up with no edit here
        assert_matches_reference(d / "gpt", name, model_of(TINY_GPT), STEPS)


@pytest.mark.dist
def test_recomputation_trains_like_the_reference_for_every_schedule(two_ranks):
    """`--recompute full` (every schedule) and `selective` (a fused and a split backward): the same losses and
    parameters as the reference, hence as the run without recomputation."""
    d = two_ranks.check()
    for name in schedules.names():
        assert_matches_reference(d / "full", name, model_of(TINY_GPT), STEPS)
    for name in ("1f1b", "zb-h1"):
        assert_matches_reference(d / "selective", name, model_of(TINY_GPT), STEPS)


@pytest.mark.parametrize(("mode", "split", "runs"), [
    ("none", False, 2), ("full", False, 4), ("selective", False, 4),
    # torch's non-reentrant checkpoint re-runs a layer once per autograd call: I and W are one each
    ("none", True, 2), ("full", True, 6), ("selective", True, 4),
])
def test_recomputation_reruns_the_forward_and_keeps_gradients_exact(mode, split, runs, monkeypatch):
    """Attention cores run per stage of 2 blocks: 2 in the forward, plus 2 per recomputing backward pass;
    the input and weight gradients are bit for bit those of the stage without recomputation."""
    calls = []
    core = executor.transformer.attention_core
    monkeypatch.setattr(executor.transformer, "attention_core",
                        lambda q, k, v, *shape: calls.append(1) or core(q, k, v, *shape))
    cfg = ModelConfig(kind="gpt", hidden=8, heads=2, seq=5, layers=4, vocab=16)
    plain, recomputing = (build_stages(cfg, [1, 2, 1], [1])[1] for _ in range(2))  # a middle stage: 2 blocks
    set_recompute(recomputing, mode)
    torch.manual_seed(1)
    x, g = torch.randn(3, 5, 8), torch.randn(3, 5, 8)
    grads = []
    for module in (plain, recomputing):
        calls.clear()
        stage = Stage(1, module, is_last=False, loss=None, scale=1.0)
        stage.forward(0, x.clone().requires_grad_())
        if split:
            dx = stage.backward_input(0, g)
            stage.backward_weight(0)
        else:
            dx = stage.backward(0, g)
        grads.append([dx] + [p.grad for p in module.parameters()])
    assert len(calls) == runs
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


@pytest.mark.dist
def test_pipesim_run_from_csv_writes_result_and_measured_trace(two_ranks):
    d = two_ranks.check()
    assert "v.csv step 3/3" in two_ranks.stderr  # progress from rank 0: plain lines, stderr is not a terminal
    assert "zb-h1 step" not in two_ranks.stderr  # the --then run is --quiet
    assert_matches_reference(d / "csv", "v.csv", ModelConfig(kind="mlp", hidden=16, layers=4, batch=8), 3)
    data = json.loads((d / "result.json").read_text())
    assert len(data["losses"]) == 3 and len(data["step_times"]) == 3
    assert data["step_time"] == statistics.median(data["step_times"][1:])
    timeline = Timeline.read(d / "measured.json")
    assert timeline.source == "measured" and timeline.num_ranks == 2
    lowered = add_p2p(torch_csv.load(d / "v.csv"))
    for step in range(3):
        for rank, program in enumerate(lowered.programs):  # one event per action, in program order
            events = [e for e in timeline.events if e.rank == rank and e.step == step]
            assert [f"{e.stage}{e.kind}{e.microbatch}" for e in sorted(events, key=lambda e: e.start)] == [
                str(a) for a in program]
            assert all(e.end >= e.start >= 0 for e in events)
    # a SEND ends when its isend completed, which on gloo needs the receiver's irecv posted (the payload
    # leaves only after the peer's recv-ready notice): never before the matching RECV began
    by_action = {(e.step, e.stage, e.kind, e.microbatch): e for e in timeline.events}
    sends = [e for e in timeline.events if e.stream == "send"]
    assert len(sends) == 3 * 8  # 4 SENDs per rank per step
    for send in sends:
        recv = Action(send.stage, Kind(send.kind), send.microbatch).matching()
        assert send.end >= by_action[(send.step, recv.stage, recv.kind.value, recv.microbatch)].start, send


def test_step_time_spans_all_ranks_and_skips_warmup():
    a, b = RankLog(0), RankLog(1)
    a.steps = [(0, 50), (100, 160), (200, 240)]  # ns
    b.steps = [(10, 70), (105, 150), (190, 260)]
    times = step_times([a, b])
    assert times == [70e-9, 60e-9, 70e-9]
    assert median_step_time(times, warmup=1) == 65e-9
    assert median_step_time(times, warmup=5) == 70e-9  # no step left after warm-up: all count
