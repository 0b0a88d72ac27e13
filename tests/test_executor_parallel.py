"""dp x pp and tp x pp runs equal single-process training (losses and parameters after K steps)."""

from __future__ import annotations

import json

import pytest

from pipesim.timeline import Timeline
from tests.executor_helpers import TINY_GPT, TINY_MLP, assert_matches_reference, model_of, torchrun

STEPS = 2


@pytest.mark.dist
def test_dp2_pp2_matches_reference_with_buckets(tmp_path):
    names = ["1f1b", "zb-h1", "interleaved-1f1b"]
    proc = torchrun(4, [",".join(names), "--dp", "2", "--microbatches", "2", *TINY_MLP, "--steps", str(STEPS),
                        "--bucket-bytes", "1024", "--quiet", "--save-dir", str(tmp_path),
                        "--trace", str(tmp_path / "trace.json")])
    assert proc.returncode == 0, proc.stderr
    for name in names:  # load_run also checks that the two replicas hold identical parameters
        assert_matches_reference(tmp_path, name, model_of(TINY_MLP), STEPS)
    # each replica sees batch 8 / dp 2 / m 2 = 2 samples per microbatch: 2 x 16 floats cross each boundary
    trace = Timeline.read(tmp_path / "trace.json")  # the last schedule's (interleaved: 2 layers per rank)
    assert {e.bytes for e in trace.events if e.stream in ("send", "recv")} == {2 * 16 * 4}
    stage_grad_bytes = 2 * (16 * 16 + 16) * 4  # bytes: 2 layers of Linear(16, 16) per rank
    reduces = sorted((e.rank, e.step, e.bytes) for e in trace.events if e.kind == "all_reduce")
    assert reduces == [(r, s, stage_grad_bytes) for r in range(4) for s in range(STEPS)]


@pytest.mark.dist
def test_tp2_pp2_mlp_matches_reference(tmp_path):
    names = ["gpipe", "1f1b", "zb-h1"]
    proc = torchrun(4, [",".join(names), "--tp", "2", "--microbatches", "4", *TINY_MLP, "--steps", str(STEPS),
                        "--quiet", "--save-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    for name in names:
        assert_matches_reference(tmp_path, name, model_of(TINY_MLP), STEPS)
        # each rank holds half of its 2 layers: column (8x16 + 8) and row (16x8 + 16), not 2 x (16x16 + 16)
        result = json.loads((tmp_path / name / "result.json").read_text())
        assert result["param_elements_per_rank"] == [8 * 16 + 8 + 16 * 8 + 16] * 4


@pytest.mark.dist
def test_tp2_pp2_gpt_sequence_parallel_matches_reference(tmp_path):
    proc = torchrun(4, ["1f1b,zb-h1", "--tp", "2", "--sequence-parallel", "--microbatches", "2", *TINY_GPT,
                        "--steps", str(STEPS), "--quiet", "--save-dir", str(tmp_path),
                        "--trace", str(tmp_path / "trace.json")])
    assert proc.returncode == 0, proc.stderr
    for name in ("1f1b", "zb-h1"):
        assert_matches_reference(tmp_path, name, model_of(TINY_GPT), STEPS)
    # a microbatch of 8 / 2 = 4 samples is split over tp 2: 2 x seq 8 x hidden 16 floats per transfer
    trace = Timeline.read(tmp_path / "trace.json")
    assert {e.bytes for e in trace.events if e.stream in ("send", "recv")} == {2 * 8 * 16 * 4}
