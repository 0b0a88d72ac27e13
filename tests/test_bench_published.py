"""bench/bench_published.py: the papers' conversion formulas, the report's tables and figures, every row's command."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from pipesim.cli import main as pipesim_main
from pipesim.errors import PipesimError

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_published", ROOT / "bench" / "bench_published.py")
bp = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bp  # dataclasses look their module up there
_spec.loader.exec_module(bp)

DATA = bp.load()
LAYER = ("pipesim simulate 1f1b --model gpt --hidden 6144 --layers 1 --heads 64 --seq 2048 --vocab 51200 --batch 4 "
         "--microbatch-size 4 --tp 8 --stages 3 --layer-split 0,1,0 --dp 1 --dtype float16 --hardware dgx-a100 "
         "--nodes 3 --attention eager")


def test_nar21_flops_formula_exactly():
    # 1.7B row: B 512, s 2048, l 24, h 2304, V 51200; eq. 3 term by term
    b, s, l, h, v = 512, 2048, 24, 2304, 51200
    expected = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert bp.nar21_flops_per_iteration(b, s, l, h, v) == pytest.approx(expected, rel=1e-15)
    # 1 + 2048/13824 + 51200/884736 = 1.2059...: the integer part is exact
    assert bp.nar21_flops_per_iteration(1, 6, 1, 1, 0) == 96 * 6 * (1 + 1.0)
    assert bp.nar21_flops_per_iteration(1, 1, 1, 1, 16) == 96 * (1 + 1 / 6 + 1.0)


def test_tflops_per_gpu_and_iteration_seconds():
    assert bp.tflops_per_gpu(4e15, 2.0, 10) == pytest.approx(200.0, rel=1e-15)
    assert bp.iteration_seconds({"step_time": 3.5, "makespan": 3.0}) == 3.5
    assert bp.iteration_seconds({"makespan": 3.0}) == 3.0  # older JSON without step_time


def test_nar21_metric_reads_the_command_flags():
    _, args = bp.parse_command(DATA_ROW("nar21-39.1b").command)
    assert (args.batch, args.seq, args.layers, args.hidden, args.vocab, bp.gpus(args)) == (1536, 2048, 48, 8192,
                                                                                          51200, 512)
    unit, convert = bp.METRICS["tflops_per_gpu_nar21"]
    flops = 96 * 1536 * 2048 * 48 * 8192**2 * (1 + 2048 / (6 * 8192) + 51200 / (16 * 48 * 8192))
    assert unit == "TFLOP/s per GPU"
    assert convert({"step_time": 10.0, "makespan": 9.0}, args) == pytest.approx(flops / (10.0 * 512) / 1e12, rel=1e-15)


def test_layer_times_from_the_middle_stage():
    _, args = bp.parse_command(LAYER)
    assert bp.layer_stage(args) == 1
    sim = {"critical_path": [{"name": "0F0", "kind": "compute", "start": 0.0, "end": 0.001},
                             {"name": "0SEND_F0", "kind": "transfer", "start": 0.001, "end": 0.002},
                             {"name": "1F0", "kind": "compute", "start": 0.002, "end": 0.0095},
                             {"name": "1B0", "kind": "compute", "start": 0.02, "end": 0.0325}]}
    assert bp.METRICS["layer_forward_ms"][1](sim, args) == pytest.approx(7.5, rel=1e-12)
    assert bp.METRICS["layer_backward_ms"][1](sim, args) == pytest.approx(12.5, rel=1e-12)
    _, two = bp.parse_command(LAYER.replace("--layers 1", "--layers 2").replace("0,1,0", "0,2,0"))
    with pytest.raises(ValueError, match="one stage of one layer"):
        bp.layer_stage(two)


def DATA_ROW(row_id: str):
    return next(r for r in DATA["rows"] if r.id == row_id)


def _result(row_id, source, published, predicted, metric="seconds_per_iteration", table="T"):
    row = bp.Row(id=row_id, source=source, table=table, configuration=row_id, metric=metric,
                 command="pipesim simulate 1f1b", published=published)
    return bp.Result(row, predicted, "f")


def test_table_summary_effects_and_trend_on_a_small_row_set():
    results = [_result("a", "S", 2.0, 2.5), _result("b", "S", 4.0, 3.0), _result("c", "S", 10.0, 10.5),
               _result("d", "S", None, 2.0)]
    assert [round(r.error, 12) if r.error is not None else None for r in results] == [0.25, -0.25, 0.05, None]
    assert bp.source_table(results[:2]) == [
        "| table | configuration | published | predicted | error | features used |",
        "|---|---|---:|---:|---:|---|",
        "| T | a | 2 s per iteration | 2.5 s per iteration | +25.0 % | f |",
        "| T | b | 4 s per iteration | 3 s per iteration | -25.0 % | f |"]
    n, med, worst = bp.summary(results)
    assert (n, med, worst) == (3, pytest.approx(0.25), pytest.approx(0.25))
    by_id = {r.row.id: r for r in results}
    lines = bp.effect_lines([{"name": "e", "pairs": [["b", "a"], ["a", "d"]]}], by_id)
    assert lines[2:] == ["| e | b / a | 2.000 | 1.200 |", "| e | a / d | not in published.md | 1.250 |"]
    by_id["e"] = _result("e", "S", 5.0, 1.0)  # published up from a, predicted down
    trend = bp.trend_lines([{"name": "t", "rows": ["a", "b", "c"]}, {"name": "u", "rows": ["a", "e", "c"]}], by_id)
    assert trend == ["- t: last / first 5.000 published, 4.200 predicted; 2 of 2 steps from one row to the next go "
                     "the same way (published range 2-10, predicted 2.5-10.5).",
                     "- u: last / first 5.000 published, 4.200 predicted; 1 of 2 steps from one row to the next go "
                     "the same way (published range 2-10, predicted 1-10.5)."]
    data = {"sources": {"S": {"citation": "Someone 2020"}}, "effects": [], "trends": [], "mechanisms": []}
    doc = bp.render(data, results, ["# H"])
    assert "3 of 3 published rows simulated: median |error| 25.0 %, max |error| 25.0 %." in doc
    assert "**not met**" in doc and "S: 3 rows, median |error| 5.0 %" not in doc
    assert "S: 3 rows, median |error| 25.0 %, max |error| 25.0 %." in doc
    failed = bp.Result(results[0].row, None, "f", failure="pipesim: error: x")
    assert "Rows whose command failed: `a` (pipesim: error: x)." in bp.render(data, [failed], ["# H"])


def test_every_row_parses_and_is_consistent():
    rows = DATA["rows"]
    assert {r.source for r in rows} == {"NAR21", "KOR22"}
    assert sum(r.published is not None for r in rows) == 10 + 8 + 6  # NAR21 T1, KOR22 T5 (2 columns), T4 (3 x 2)
    examples = (ROOT / "docs" / "published_examples.md").read_text()
    for r in rows:
        argv, args = bp.parse_command(r.command)
        assert argv[0] == "simulate" and args.hardware == "dgx-a100"
        assert bp.gpus(args) == 8 * args.nodes, r.id  # 8 A100s per node
        if r.table in ("Table 1", "Table 5") and r.published is not None:
            assert re.search(re.escape(r.command) + r"\s+# fits", examples), r.id  # the same line as the docs


def test_a_command_that_is_not_simulate_is_refused():
    with pytest.raises(ValueError, match="not a `pipesim simulate` command"):
        bp.parse_command("pipesim run 1f1b")


def test_a_row_runs_as_typed(tmp_path):
    row = DATA_ROW("kor22-22b-selective-sp")
    result = bp.simulate(row)
    out = tmp_path / "sim.json"
    assert pipesim_main(shlex.split(row.command)[1:] + ["--json", str(out)]) == 0
    assert result.predicted == json.loads(out.read_text())["step_time"]  # the simulator's figure, unchanged
    assert result.features == ("1f1b, tp 8 pp 1 dp 1, recompute selective, SP, eager attention, 1 x dgx-a100")


def test_main_writes_the_report_for_a_rows_file(tmp_path):
    rows = tmp_path / "rows.toml"
    rows.write_text(f"""
[sources.KOR22]
citation = "K"

[[rows]]
id = "fwd"
source = "KOR22"
table = "Table 4"
configuration = "layer forward"
metric = "layer_forward_ms"
published = 7.7
command = "{LAYER}"

[[rows]]
id = "bwd"
source = "KOR22"
table = "Table 4"
configuration = "layer backward"
metric = "layer_backward_ms"
published = 11.9
command = "{LAYER}"

[[effects]]
name = "bwd / fwd"
pairs = [["bwd", "fwd"]]
""")
    out = tmp_path / "p.md"
    assert bp.main(["--rows", str(rows), "--out", str(out)]) == 0
    doc = out.read_text()
    assert doc.startswith("# Published results: predicted vs measured\n\nGenerated by `pipesim bench published` on ")
    assert "2 of 2 published rows simulated" in doc
    assert "| bwd / fwd | layer backward / layer forward | 1.545 |" in doc
    with pytest.raises(PipesimError, match="--only: unknown source NAR21"):
        bp.main(["--rows", str(rows), "--out", str(out), "--only", "NAR21"])
    with pytest.raises(PipesimError, match="missing.toml"):
        bp.main(["--rows", str(tmp_path / "missing.toml"), "--out", str(out)])
