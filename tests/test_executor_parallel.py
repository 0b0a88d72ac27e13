"""Four-rank runs (pp 4, dp x pp, tp x pp; MLP and GPT) equal single-process training after K steps.

All configurations run as one `--then` chain in the session's shared 4-rank launch (tests/launch_shared.py);
each test asserts on its own configuration's saved results and trace.
"""

from __future__ import annotations

import json

import pytest

import schedules
from executor.models import group_rows_by_rank
from executor.params import ungroup_rows_by_rank
from pipesim.errors import PipesimError
from pipesim.timeline import Timeline
from tests.executor_helpers import TINY_GPT, TINY_MLP, assert_matches_reference, chain, model_of
from tests.launch_shared import register_run

STEPS = 2


def _admits(name: str, p: int, m: int) -> bool:
    try:
        schedules.build(name, p, m)
    except PipesimError:
        return False
    return True


PP4_NAMES = [n for n in schedules.names() if not schedules.spec(n).virtual and _admits(n, 4, 4)]
PP4_MLP = ["--model", "mlp", "--hidden", "16", "--layers", "6", "--batch", "8"]
V4_NAMES = [n for n in schedules.names() if n not in PP4_NAMES]  # two chunks per rank, or m >= 2p: m = 2p
V4_MLP = ["--model", "mlp", "--hidden", "16", "--layers", "8", "--batch", "8"]
DP_NAMES = ["1f1b", "zb-h1", "interleaved-1f1b"]
TP_MLP_NAMES = ["gpipe", "1f1b", "zb-h1"]
TP_GPT_NAMES = ["1f1b", "zb-h1"]


def _four_rank_flags(d):
    """Every configuration below, one after another in one process group (`--then`)."""
    common = ["--steps", str(STEPS), "--quiet"]
    return chain(
        [",".join(PP4_NAMES), "--microbatches", "4", *PP4_MLP, "--layer-split", "1,2,2,1", "--optimizer", "adam",
         "--lr", "0.001", *common, "--save-dir", str(d / "pp4")],
        [",".join(V4_NAMES), "--microbatches", "8", *V4_MLP, *common, "--save-dir", str(d / "v4")],
        [",".join(DP_NAMES), "--dp", "2", "--microbatches", "2", *TINY_MLP, "--bucket-bytes", "1024", *common,
         "--save-dir", str(d / "dp"), "--trace", str(d / "dp.json")],
        [",".join(TP_MLP_NAMES), "--tp", "2", "--microbatches", "4", *TINY_MLP, *common, "--save-dir", str(d / "tp")],
        [",".join(TP_GPT_NAMES), "--tp", "2", "--sequence-parallel", "--microbatches", "2", *TINY_GPT, *common,
         "--save-dir", str(d / "sp"), "--trace", str(d / "sp.json")],
        [",".join(TP_GPT_NAMES), "--tp", "2", "--microbatches", "2", *TINY_GPT, *common,
         "--save-dir", str(d / "tp_gpt"), "--trace", str(d / "tp_gpt.json")],
    )


FOUR_RANKS = register_run("executor_parallel", 4, _four_rank_flags)  # with the other modules' 4-rank cases


@pytest.fixture(scope="module")
def runs(shared_launches):
    """The case's folder in the session's shared 4-rank launch (tests/launch_shared.py); fails unless it finished."""
    return shared_launches.case(FOUR_RANKS).check()


@pytest.mark.dist
def test_every_schedule_trains_mlp_like_the_reference_on_four_ranks_uneven_split_adam(runs):
    for name in PP4_NAMES:
        assert_matches_reference(runs / "pp4", name, model_of(PP4_MLP), STEPS, optimizer="adam", lr=0.001)


@pytest.mark.dist
def test_every_chunked_schedule_trains_mlp_like_the_reference_on_four_ranks(runs):
    for name in V4_NAMES:  # interleaved, looped, V placements, dualpipev's overlapped pairs, dualpipe (m >= 2p)
        assert_matches_reference(runs / "v4", name, model_of(V4_MLP), STEPS)


@pytest.mark.dist
def test_dp2_pp2_matches_reference_with_buckets(runs):
    for name in DP_NAMES:  # load_run also checks that the two replicas hold identical parameters
        assert_matches_reference(runs / "dp", name, model_of(TINY_MLP), STEPS)
    # each replica sees batch 8 / dp 2 / m 2 = 2 samples per microbatch: 2 x 16 floats cross each boundary
    trace = Timeline.read(runs / "dp.json")  # the last schedule's (interleaved: 2 layers per rank)
    assert {e.bytes for e in trace.events if e.stream in ("send", "recv")} == {2 * 16 * 4}
    stage_grad_bytes = 2 * (16 * 16 + 16) * 4  # bytes: 2 layers of Linear(16, 16) per rank
    reduces = sorted((e.rank, e.step, e.bytes) for e in trace.events if e.kind == "all_reduce")
    assert reduces == [(r, s, stage_grad_bytes) for r in range(4) for s in range(STEPS)]


@pytest.mark.dist
def test_tp2_pp2_mlp_matches_reference(runs):
    for name in TP_MLP_NAMES:
        assert_matches_reference(runs / "tp", name, model_of(TINY_MLP), STEPS)
        # each rank holds half of its 2 layers: column (8x16 + 8) and row (16x8 + 16), not 2 x (16x16 + 16)
        result = json.loads((runs / "tp" / name / "result.json").read_text())
        assert result["param_elements_per_rank"] == [8 * 16 + 8 + 16 * 8 + 16] * 4


def _nested(trace: Timeline) -> dict[tuple[int, int, str, int, int], list]:
    """TP collective events under the compute event whose interval holds them, keyed like that event."""
    computes = [e for e in trace.events if e.stream == "compute"]
    out: dict[tuple[int, int, str, int, int], list] = {(e.rank, e.step, e.kind, e.stage, e.microbatch): []
                                                         for e in computes}
    for c in (e for e in trace.events if e.stream == "collective" and e.stage >= 0):
        host = [e for e in computes if e.rank == c.rank and e.start <= c.start <= c.end <= e.end]
        assert len(host) == 1, c
        h = host[0]
        assert (h.stage, h.microbatch, h.step) == (c.stage, c.microbatch, c.step)
        out[(h.rank, h.step, h.kind, h.stage, h.microbatch)].append(c)
    return out


@pytest.mark.dist
def test_tp2_pp2_gpt_sequence_parallel_matches_reference(runs):
    for name in TP_GPT_NAMES:
        assert_matches_reference(runs / "sp", name, model_of(TINY_GPT), STEPS)
    # each sequence of a microbatch of 8 / 2 = 4 samples is split over tp 2: 4 x seq 4 x hidden 16 floats per transfer
    trace = Timeline.read(runs / "sp.json")
    assert {e.bytes for e in trace.events if e.stream in ("send", "recv")} == {4 * 4 * 16 * 4}
    # per block forward: all_gather before qkv and fc1, reduce_scatter after proj and fc2 (2 blocks per stage),
    # each on the microbatch's full activation (4 samples x seq 8 x hidden 16 floats)
    nested = _nested(trace)
    for (_, _, kind, _, _), events in nested.items():
        if kind == "F":
            assert sorted(e.kind for e in events) == ["all_gather"] * 4 + ["reduce_scatter"] * 4
            assert {e.bytes for e in events} == {4 * 8 * 16 * 4}


@pytest.mark.dist
def test_tp2_pp2_gpt_shards_attention_heads_and_matches_reference(runs):
    for name in TP_GPT_NAMES:
        assert_matches_reference(runs / "tp_gpt", name, model_of(TINY_GPT), STEPS)
    # hidden 16, 2 heads, tp 2: a rank holds 1 head. Per block: 2 LayerNorms (2 x 32), qkv column (24x16 + 24),
    # proj row (16x8 + 16), fc1 column (32x16 + 32), fc2 row (16x32 + 16); 2 blocks per stage
    block = 2 * 32 + (24 * 16 + 24) + (16 * 8 + 16) + (32 * 16 + 32) + (16 * 32 + 16)
    first = 32 * 16 + 8 * 16 + 2 * block  # token and position embeddings (vocab 32, seq 8)
    last = 2 * block + 32 + 32 * 16  # final LayerNorm and the head (no bias)
    result = json.loads((runs / "tp_gpt" / "zb-h1" / "result.json").read_text())
    assert result["param_elements_per_rank"] == [first, first, last, last]
    # TP collectives, nested in the action that ran them (zb-h1): every F all-reduces proj's and fc2's partial
    # sums (2 per block); the input-gradient pass all-reduces the gradients into qkv and fc1: in I, except on
    # stage 0, whose I is empty and whose W does the whole backward. 4 samples x seq 8 x hidden 16 floats each.
    trace = Timeline.read(runs / "tp_gpt.json")
    nested = _nested(trace)
    assert len(nested) == 4 * STEPS * 2 * 3  # ranks x steps x microbatches x (F, I, W)
    collectives = [e for e in trace.events if e.stream == "collective"]  # no DP, no SP: all inside actions
    assert sum(map(len, nested.values())) == len(collectives) > 0
    for (_, _, kind, stage, _), events in nested.items():
        expected = 4 if kind == "F" or (kind == "I") == (stage == 1) else 0
        assert [(e.kind, e.bytes) for e in events] == [("all_reduce", 4 * 8 * 16 * 4)] * expected, (kind, stage)


def test_qkv_rows_grouped_by_rank_and_back():
    import torch

    full = torch.nn.Linear(2, 12)  # q, k, v of 4 rows each (2 heads of 2); tp 2
    grouped = group_rows_by_rank(full, (4, 4, 4), 2)
    w = full.weight.detach()
    assert torch.equal(grouped.weight[:6], torch.cat([w[0:2], w[4:6], w[8:10]]))  # rank 0: q, k, v of head 0
    assert torch.equal(grouped.bias[6:], torch.cat([full.bias[2:4], full.bias[6:8], full.bias[10:12]]).detach())
    assert torch.equal(ungroup_rows_by_rank(grouped.weight.detach(), (4, 4, 4), 2), w)
    gqa = torch.nn.Linear(2, 8, bias=False)  # grouped-query: q of 4 rows (2 heads of 2), k and v of 2 (1 kv head)
    w = gqa.weight.detach()
    grouped = group_rows_by_rank(gqa, (4, 2, 2), 2).weight.detach()
    assert torch.equal(grouped, torch.cat([w[0:2], w[4:5], w[6:7], w[2:4], w[5:6], w[7:8]]))  # rank 0, then rank 1
    assert torch.equal(ungroup_rows_by_rank(grouped, (4, 2, 2), 2), w)
