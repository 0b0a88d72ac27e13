"""`pipesim plan` with context parallelism (--cp): the layouts the model layer admits (ring attention's split, a2a's
heads), plans of long sequences and their exports, and default plans unchanged by the cp search."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport (a dependency there)
    import tomli as tomllib

from pipesim.cli import build_parser, main
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.flops import model_flops
from pipesim.plan.search import plan
from pipesim.plan.space import NoLayout, PlanRequest, enumerate_candidates, layouts
from tests.test_plan import SCHEDULES, SMALL, big_request


def test_ulysses_layouts_split_each_tp_ranks_heads_over_cp():
    """--cp-comm-type a2a: 8 heads and 4 key/value heads; (t, cp) = (4, 2) leaves one key/value head per tp rank,
    which two cp ranks cannot split, so that pair is never a layout; ring attention (p2p) keeps it."""
    model = ModelConfig(kind="gpt", hidden=256, layers=4, heads=8, kv_heads=4, seq=1024, batch=16,
                        dtype="bfloat16")
    hw = load_hardware("dgx-h100").with_nodes(2)
    pairs = {(t, cp) for t, cp, _, _ in layouts(PlanRequest(model, hw, 16, ("1f1b",), cps=(1, 2),
                                                            job=Job(cp_comm="a2a")))}
    ring = {(t, cp) for t, cp, _, _ in layouts(PlanRequest(model, hw, 16, ("1f1b",), cps=(1, 2)))}
    assert (4, 2) in ring and (4, 2) not in pairs and (2, 2) in pairs and ring - pairs == {(4, 2)}


# 384k tokens, 25 heads (no tp but 1 on a node of 8), 2 layers, 2 sequences on 4 H100s: with cp 1 the only layout
# (p 2 x d 2) needs 98 GiB; cp 2 and cp 4 fit
LONG = ["--model", "gpt", "--hidden", "3200", "--layers", "2", "--heads", "25", "--seq", "393216", "--vocab", "32000",
        "--batch", "2", "--dtype", "bfloat16", "--hardware", "dgx-h100", "--gpus", "4", "--schedules", "1f1b"]


def test_long_sequence_plans_context_parallel_and_exports_it(capsys, tmp_path):
    assert main(["plan", *LONG]) == 2  # default --cp 1: nothing fits
    assert "no configuration fits 80.00 GiB per GPU: the closest, 1f1b p2 t1 d2" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse's own refusal of the flag
        main(["plan", *LONG, "--cp", "0,2"])
    assert exc.value.code == 2 and "positive context-parallel sizes such as 1,2,4; got '0,2'" in capsys.readouterr().err
    out = tmp_path / "plan.json"
    assert main(["plan", *LONG, "--cp", "1,2,4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    best = data["rows"][0]
    assert best["cp"] > 1 and all(r["cp"] > 1 for r in data["rows"])  # every cp 1 layout is over memory
    # MFU counts the causal half of attention: under 100 % even where attention is most of the work (it was 125 %)
    assert all(0 < r["mfu"] < 1 for r in data["rows"]) and best["mfu"] == pytest.approx(
        model_flops(ModelConfig(kind="gpt", hidden=3200, heads=25, layers=2, seq=393216, vocab=32000, batch=2,
                                dtype="bfloat16"), 2) / (best["step_time"] * 4 * 989e12), rel=1e-12)
    assert data["counts"]["over_memory_bound"] + data["counts"]["over_memory"] >= 6  # (p2 d2 cp1: 6 candidates)
    assert best["tp"] * best["cp"] * best["pp"] * best["dp"] == 4 and best["peak_memory"] <= data["device_memory"]
    argv = shlex.split(data["winner"]["simulate_command"])
    assert argv[argv.index("--cp") + 1] == str(best["cp"])
    assert main(argv[1:] + ["--json"]) == 0  # the exported command reproduces the step time, bit for bit
    sim = json.loads(capsys.readouterr().out)
    assert sim["step_time"] == best["step_time"]
    megatron = data["winner"]["megatron_args"]
    assert f"--context-parallel-size {best['cp']}" in megatron
    par = tomllib.loads(data["winner"]["torchtitan_toml"])["parallelism"]
    assert par["context_parallel_degree"] == best["cp"]
    assert (par["tensor_parallel_degree"] * par["context_parallel_degree"] * par["pipeline_parallel_degree"]
            * par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"]) == 4
    ns = build_parser().parse_args(shlex.split(data["winner"]["run_command"])[1:])  # the executor has no cp:
    assert not hasattr(ns, "cp") and ns.nproc * (ns.nnodes or 1) == 4 // best["cp"]  # t x p x d ranks, said so
    assert data["winner"]["run_note"].startswith("# the executor has no context parallelism")
    assert data["winner"]["run_note"] in text


def test_space_respects_context_parallel_rules():
    model = ModelConfig(kind="gpt", hidden=8192, layers=16, heads=64, seq=24, vocab=32000, batch=16,
                        dtype="bfloat16")
    hw = load_hardware("dgx-h100").with_nodes(2)
    req = PlanRequest(model, hw, 16, SCHEDULES, None, ("none",), (0,), cps=(1, 2, 3, 4, 8, 16))
    cands = enumerate_candidates(req)
    # cp 8 and 16: 24 tokens not divisible by 2 cp; cp 3 divides no GPU count left by t
    assert {c.cp for c in cands} == {1, 2, 4}
    for c in cands:
        assert c.tp * c.cp * c.p * c.dp == 16 and 8 % c.tp == 0 and model.seq % (2 * c.cp) == 0
    assert any(c.tp * c.cp > 8 for c in cands)  # tp stays in a node; tp x cp may cross nodes
    assert {(t, cp, p, d) for t, cp, p, d in layouts(req)} >= {(8, 2, 1, 1), (1, 4, 2, 2)}
    assert [c for c in cands if c.cp == 1] == enumerate_candidates(PlanRequest(model, hw, 16, SCHEDULES, None,
                                                                               ("none",), (0,)))
    eager = PlanRequest(model, hw, 16, SCHEDULES, None, ("none",), (0,), Job(attention="eager"), cps=(1, 2))
    assert {c.cp for c in enumerate_candidates(eager)} == {1}
    with pytest.raises(NoLayout, match=r"--cp 2 needs --attention flash"):
        enumerate_candidates(PlanRequest(model, hw, 16, SCHEDULES, job=Job(attention="eager"), cps=(2,)))
    with pytest.raises(NoLayout, match=r"--seq 24 is not divisible by 2 x cp\(8\)"):
        enumerate_candidates(PlanRequest(model, hw, 16, SCHEDULES, cps=(8,)))
    with pytest.raises(NoLayout, match="--cp 3 divides none of the 16 GPUs"):
        enumerate_candidates(PlanRequest(model, hw, 16, SCHEDULES, cps=(3,)))


def test_default_plans_unchanged_by_the_cp_search(capsys, tmp_path):
    """The default searches cp 1 only; searching cp 1,2 too leaves every cp 1 row's figures as they were."""
    assert big_request().cps == (1,)
    plain = plan(big_request(), max_candidates=10_000, max_work=10**9, progress=False)
    both = plan(big_request(cps=(1, 2)), max_candidates=10_000, max_work=10**9, progress=False)
    assert {r.candidate.cp for r in plain.rows} == {1} and {r.candidate.cp for r in both.rows} == {1, 2}
    assert [r.to_dict() for r in both.rows if r.candidate.cp == 1] == [r.to_dict() for r in plain.rows]
    runs = []
    for extra in ([], ["--cp", "1"]):
        out = tmp_path / f"cp{len(extra)}.json"
        assert main(["plan", *SMALL, "--hardware", "dgx-h100", "--gpus", "4", "--schedules", "1f1b",
                     "--json", str(out), *extra]) == 0
        runs.append(json.loads(out.read_text()))
    assert runs[0] == runs[1] and "run_note" not in runs[0]["winner"]
    assert "--context-parallel-size" not in " ".join(runs[0]["winner"]["megatron_args"])
