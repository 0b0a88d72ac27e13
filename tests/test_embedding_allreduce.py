"""A tied head on another rank than the embedding: its copy's gradients all-reduced with the first stage's before
either optimizer runs (Megatron-core's finalize_model_grads, `_allreduce_word_embedding_grads`; pipesim.sim.step)."""

from __future__ import annotations

import json

import pytest

from pipesim.cli import main
from pipesim.comm.collective_algos import collective_seconds
from pipesim.hardware.toml_io import load_hardware

GPT = ["--model", "gpt", "--hidden", "256", "--layers", "4", "--heads", "4", "--seq", "128", "--vocab", "1000",
       "--batch", "8", "--dtype", "bfloat16", "--hardware", "dgx-h100"]
TIE = "--tie-embeddings-and-output-weights"


def _sim(capsys, *argv: str) -> dict:
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_last_stage_copy_is_all_reduced_with_the_first_stage_before_the_optimizer(capsys):
    d = _sim(capsys, "1f1b", "--stages", "2", "--microbatches", "4", *GPT, TIE)
    emb = [c for c in d["collectives"] if c["phase"] == "embedding"]
    assert [(c["rank"], c["stage"], c["kind"]) for c in emb] == [(0, 0, "all_reduce"), (1, 1, "all_reduce")]
    nbytes = 1000 * 256 * 4  # vocab x hidden, float32 main gradients (a bfloat16 model's default)
    seconds = collective_seconds(load_hardware("dgx-h100"), "all_reduce", [0, 1], nbytes)
    finish = max(r["finish"] for r in d["ranks"])  # both ready (no dp: no gradient collectives before it)
    for c in emb:
        assert c["bytes"] == nbytes and c["start"] == finish and c["end"] == finish + seconds
    for r in d["ranks"]:
        assert r["embedding_allreduce"] == emb[0]["end"] - emb[0]["start"]  # its span, as recorded
        assert r["optimizer_start"] == finish + seconds


def test_an_untied_head_a_shared_rank_or_one_stage_has_none(capsys):
    untied = _sim(capsys, "1f1b", "--stages", "2", "--microbatches", "4", *GPT)
    v_shape = _sim(capsys, "zb-v", "--stages", "2", "--microbatches", "4", *GPT, TIE)  # stage 0 and 3 on rank 0
    for d in (untied, v_shape):
        assert not [c for c in d["collectives"] if c["phase"] == "embedding"]
        assert all("embedding_allreduce" not in r for r in d["ranks"])
    tied = _sim(capsys, "1f1b", "--stages", "2", "--microbatches", "4", *GPT, TIE)
    assert tied["step_time"] > untied["step_time"]  # the same memory (the copy), one all-reduce more
    assert tied["memory"]["param_bytes"] == untied["memory"]["param_bytes"]


@pytest.mark.parametrize("hardware", ["dgx-h100", "local-cpu"])
def test_no_links_no_exchange(capsys, hardware):
    d = _sim(capsys, "1f1b", "--stages", "2", "--microbatches", "4", *GPT[:-2], "--hardware", hardware, TIE,
             "--comm", "none")
    assert not [c for c in d["collectives"] if c["phase"] == "embedding"]
