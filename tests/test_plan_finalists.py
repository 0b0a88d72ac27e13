"""`plan(..., ilp_seconds=S)`: zb-auto, zb-2p and zb-v tried on the best layouts, their orders ILP-searched, each new
row exactly what an Evaluator with the ILP gives for that candidate, and the ranking kept sorted."""

from __future__ import annotations

from dataclasses import replace

from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig
from pipesim.plan.backends import visit
from pipesim.plan.evaluate import Evaluator
from pipesim.plan.finalists import search_finalists
from pipesim.plan.ranking import PlanRow
from pipesim.plan.search import plan
from pipesim.plan.space import PlanRequest

# 13B-ish on 8 H100s, pipelines only (tp 1): every finalist is a pipeline layout
MODEL = ModelConfig(kind="gpt", hidden=8192, layers=16, heads=64, seq=2048, vocab=32000, batch=16, dtype="bfloat16")


def request() -> PlanRequest:
    return PlanRequest(MODEL, load_hardware("dgx-h100"), 8, ("1f1b", "zb-h1"), 1, ("none", "full"), (1,))


def test_finalists_add_the_searched_schedules_on_the_best_layouts():
    req = request()
    base = plan(req, progress=False, workers=1)
    searched = plan(req, progress=False, workers=1, ilp_seconds=2.0, finalists=2)
    c = searched.counts
    assert c["finalists_tried"] > 0 and c["finalists_added"] + c["finalists_improved"] > 0
    assert [r.step_time for r in searched.rows] == sorted(r.step_time for r in searched.rows)
    assert searched.best.step_time <= base.best.step_time
    top = {replace(r.candidate, schedule="x", v=1) for r in base.rows[:2]}
    added = [r for r in searched.rows if r.candidate.schedule in ("zb-auto", "zb-2p", "zb-v")]
    assert {r.candidate.schedule for r in added} == {"zb-auto", "zb-2p", "zb-v"}  # zb-v: the V search's order
    assert all(replace(r.candidate, schedule="x", v=1) in top for r in added)
    ev = Evaluator(req, ilp_seconds=2.0)
    ev.flops = 0.0  # MFU aside: the step time and the peak memory are compared
    for row in [r for r in added if r.candidate.schedule != "zb-v"]:  # zb-v's 2 s search may stop elsewhere
        # each row is the candidate simulated with its searched order, nothing else
        kind, value = visit(ev, row.candidate)
        assert kind == "row" and value.step_time == row.step_time and value.peak_memory == row.peak_memory


def test_finalists_keep_a_row_the_search_does_not_beat():
    req = request()
    ev = Evaluator(req)
    base = plan(req, progress=False, workers=1, evaluator=ev)
    fake = [replace(base.rows[0], step_time=0.0)]  # nothing beats a zero step time
    rows, report = search_finalists(ev, fake, count=1, seconds=2.0)
    assert rows[0] is fake[0] and report.improved == 0
    assert all(isinstance(r, PlanRow) for r in rows)
