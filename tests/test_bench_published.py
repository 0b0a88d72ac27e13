"""bench/bench_published.py: the report's tables and figures, the switches, every row's command (the conversion
formulas: tests/test_published_metrics.py)."""

from __future__ import annotations

import json
import math
import re
import shlex
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from pipesim.cli import main as pipesim_main
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from tests.published_bench import DATA, DATA_ROW, LAYER, LAYER_ROWS, MOE_SOURCES, ROOT, _result, bp, pr


def test_table_summary_effects_and_trend_on_a_small_row_set():
    results = [_result("a", "S", 2.0, 2.5), _result("b", "S", 4.0, 3.0), _result("c", "S", 10.0, 10.5),
               _result("d", "S", None, 2.0)]
    assert [round(r.error, 12) if r.error is not None else None for r in results] == [0.25, -0.25, 0.05, None]
    assert pr.source_table(results[:2]) == [
        "| table | configuration | published | predicted | error | features used |",
        "|---|---|---:|---:|---:|---|",
        "| T | a | 2 s per iteration | 2.5 s per iteration | +25.0 % | f |",
        "| T | b | 4 s per iteration | 3 s per iteration | -25.0 % | f |"]
    n, med, worst = pr.summary(results)
    assert (n, med, worst) == (3, pytest.approx(0.25), pytest.approx(0.25))
    by_id = {r.row.id: r for r in results}
    lines = pr.effect_lines([{"name": "e", "pairs": [["b", "a"], ["a", "d"]]}], by_id)
    # b / a: published 4 / 2 = 2, predicted 3 / 2.5 = 1.2, ratio error 1.2 / 2 - 1 = -40 %
    assert lines[2:] == ["| e | b / a | 2.000 | 1.200 | -40.0 % |", "| e | a / d | not in published.md | 1.250 | - |"]
    by_id["e"] = _result("e", "S", 5.0, 1.0)  # published up from a, predicted down
    trend = pr.trend_lines([{"name": "t", "rows": ["a", "b", "c"]}, {"name": "u", "rows": ["a", "e", "c"]}], by_id)
    assert trend == ["- t: last / first 5.000 published, 4.200 predicted; 2 of 2 steps from one row to the next go "
                     "the same way (published range 2-10, predicted 2.5-10.5).",
                     "- u: last / first 5.000 published, 4.200 predicted; 1 of 2 steps from one row to the next go "
                     "the same way (published range 2-10, predicted 1-10.5)."]
    data = {"sources": {"S": {"citation": "Someone 2020"}}, "effects": [], "trends": [], "mechanisms": []}
    doc = pr.render(data, results, ["# H"])
    assert ("Rows of shared/reference/published.md (S): 3 of 3 simulated, median |error| 25.0 %, max |error| 25.0 %."
            in doc)
    assert "**not met**" in doc and "S: 3 rows, median |error| 5.0 %" not in doc
    assert "S: 3 rows, median |error| 25.0 %, max |error| 25.0 %; signed (speed, + = optimistic) mean" in doc
    failed = pr.Result(results[0].row, None, "f", failure="pipesim: error: x")
    assert "Rows whose command failed: `a` (pipesim: error: x)." in pr.render(data, [failed], ["# H"])


def test_relative_effects_summary_causes_and_their_table_under_each_switch():
    base = {r.row.id: r for r in (_result("a", "S", 2.0, 2.5), _result("b", "S", 4.0, 4.0), _result("c", "S", 3.0, 3.3),
                                  _result("x", "S", None, 5.0))}
    effects = [{"name": "e", "pairs": [["b", "a"], ["c", "a"]], "why": "because."},
               {"name": "f", "pairs": [["x", "a"]]}]
    pairs = pr.effect_pairs(effects, base)
    # b / a: published 2, predicted 1.6 (-20 %); c / a: published 1.5, predicted 1.32 (-12 %); x / a: predicted only
    assert [(p.label, p.published, p.predicted) for p in pairs] == [
        ("b / a", 2.0, 4.0 / 2.5), ("c / a", 1.5, 3.3 / 2.5), ("x / a", None, 5.0 / 2.5)]
    assert [round(p.error, 12) if p.error is not None else None for p in pairs] == [-0.2, -0.12, None]
    assert pr.effect_stats_line(pairs) == (
        "Relative effects (issue 15 asks that they hold too; not part of the goal line above): 2 pairs with a "
        "published ratio, median |ratio error| 16.0 %, max 20.0 % (ratio error = predicted ratio / published ratio "
        "- 1; the causes, effect by effect, under \"Relative effects\").")
    assert pr.effect_stats_line(pairs[2:]) == "Relative effects: no pair with a published ratio."
    assert pr.causes(effects + [{"name": "t", "rows": []}]) == ["- e: because."]
    # a switch that slows row a to 3.2 (every ratio over a falls), and one whose run of x failed
    slow = pr.Switched("1. m", "off: x (y: z): w", [_result("a", "S", 2.0, 3.2), base["b"], base["c"], base["x"]],
                       "1 off")
    broke = pr.Switched("2. n", "on", [base["a"], base["b"], base["c"], pr.Result(base["x"].row, None, "f")])
    assert pr.effect_switch_table(effects, base, [slow, broke]) == [
        "| pair | published | as run | 1 off | 2. n |", "|---|---:|---:|---:|---:|",
        "| b / a | 2.000 | 1.600 | 1.250 | 1.600 |", "| c / a | 1.500 | 1.320 | 1.031 | 1.320 |",
        "| x / a | - | 2.000 | 1.562 | failed |"]
    assert [pr.label_head(s) for s in ("off: x (y: z): w", "DP on (what-if: not used): `--f`", "plain")] == [
        "off", "DP on (what-if: not used)", "plain"]
    data = {"sources": {"S": {"citation": "C"}}, "effects": effects, "trends": [], "mechanisms": []}
    doc = pr.render(data, list(base.values()), ["# H"], [slow, broke])
    assert pr.effect_stats_line(pairs) in doc and "- e: because." in doc
    assert "| b / a | 2.000 | 1.600 | 1.250 | 1.600 |" in doc[doc.index("### Relative effects under each switch"):]
    assert "1 off = 1. m, off; 2. n = 2. n, on)" in doc


def test_every_row_parses_and_is_consistent():
    rows = DATA["rows"]
    moe = MOE_SOURCES  # the per-source figures: tests/test_bench_sources.py
    assert {r.source for r in rows} == {"NAR21", "KOR22", "KOR22T4", "LLAMA3", "BLOOM", "MTNLG", "DGXC25", "DGXC25FP8",
                                        "DGXC25PROXY", "MB25", "MB25B200", "MB25GB200", "MB26GB300", "TT24", "TT25H200",
                                        "TORCHAO25", "TORCHAO25B200", "ZB24", "MLPERF50", "MLPERF51",
                                        "MLPERF51NVFP4"} | moe
    examples = (ROOT / "docs" / "published_examples.md").read_text()
    for r in rows:
        argv, args = bp.parse_command(r.command)
        hardware = {"LLAMA3": "dgx-h100", "BLOOM": str(ROOT / "bench" / "hardware" / "jean-zay-a100.toml"),
                    **dict.fromkeys(moe | {"DGXC25", "DGXC25FP8", "DGXC25PROXY", "MB25", "MLPERF50"}, "dgx-h100"),
                    "TT25H200": "hgx-h200", "MB25B200": "hgx-b200", "TORCHAO25B200": "hgx-b200",
                    "MB25GB200": "gb200-nvl72", "MB26GB200MOE": "gb200-nvl72", "MB26GB300": "gb300-nvl72",
                    "MB26GB300MOE": "gb300-nvl72", "MB26B300MOE": "hgx-b300", "MB26B200MOE": "hgx-b200",
                    "MB26KIMI": "gb300-nvl72",
                    "MB26GPTOSS": next((h for x, h in (("h100", "dgx-h100"), ("gb200", "gb200-nvl72"),
                                                       ("b200", "hgx-b200")) if f"-{x}-" in r.id), None),
                    "MB26NANO": next((h for x, h in (("h100", "dgx-h100"), ("gb200", "gb200-nvl72"),
                                                     ("gb300", "gb300-nvl72"), ("b300", "hgx-b300"))
                                      if f"-{x}-" in r.id), None),
                    **dict.fromkeys(("MLPERF51", "MLPERF51NVFP4"), "gb300-nvl72" if "gb300" in r.id else "gb200-nvl72"),
                    "DEEPSEEKV3": str(ROOT / "bench" / "hardware" / "h800-deepseek.toml"),
                    **dict.fromkeys(("TT24", "TORCHAO25"), str(ROOT / "bench" / "hardware" / "grand-teton-h100.toml"))}
        assert argv[0] == "simulate" and args.hardware == hardware.get(r.source, "dgx-a100")  # a file: the repo's
        # racks filled as Slurm's segment of 4-GPU trays: all 2, else 16 of 18 per rack
        if r.source in ("MLPERF51", "MLPERF51NVFP4"):  # SEGMENT 18: one rack, one NVLink domain; 16: domains of 64
            assert (bp.metrics.gpus(args), args.nvlink_domain) in ((72, None), (64 * (args.nodes or 0), 64)), r.id
        elif r.source in ("MB25GB200", "MB26GB200MOE", "MB26GB300", "MB26GB300MOE", "MB26KIMI") or "-gb200-" in r.id \
                or "-gb300-" in r.id:
            assert bp.metrics.gpus(args) == args.nvlink_domain * (args.nodes or 1), r.id
            assert args.nvlink_domain == min(bp.metrics.gpus(args), 64), r.id
        else:
            assert bp.metrics.gpus(args) == 8 * args.nodes, r.id  # 8 GPUs per node
        if r.table in ("Table 1", "Table 5") and r.published is not None or r.source in ("LLAMA3", "BLOOM", "MTNLG"):
            assert re.search(re.escape(r.command) + r"\s+# fits", examples), r.id  # the same line as the docs


def test_a_command_that_is_not_simulate_is_refused():
    with pytest.raises(ValueError, match="not a `pipesim simulate` command"):
        bp.parse_command("pipesim run 1f1b")


def test_a_row_runs_as_typed(tmp_path):
    row = DATA_ROW("kor22-22b-selective-sp")
    argv, args = bp.parse_command(row.command)
    result = bp.result(row, bp.run_argv(argv), args)
    out = tmp_path / "sim.json"
    assert pipesim_main(shlex.split(row.command)[1:] + ["--json", str(out)]) == 0
    assert result.predicted == json.loads(out.read_text())["step_time"]  # the simulator's figure, unchanged
    assert result.features == ("1f1b, tp 8 pp 1 dp 1, recompute selective, SP, eager attention, unfused gradient "
                               "accumulation, 1 x dgx-a100")


def test_main_writes_the_report_for_a_rows_file(tmp_path):
    rows = tmp_path / "rows.toml"
    rows.write_text(f"""
[sources.KOR22]
citation = "K"

{LAYER_ROWS}
[[effects]]
name = "bwd / fwd"
pairs = [["bwd", "fwd"]]
""")
    out = tmp_path / "p.md"
    assert bp.main(["--rows", str(rows), "--out", str(out), "--jobs", "1"]) == 0
    doc = out.read_text()
    assert doc.startswith("# Published results: predicted vs measured\n\nGenerated by `pipesim bench published` on ")
    assert "Rows of shared/reference/published.md (KOR22): 2 of 2 simulated" in doc
    assert "| bwd / fwd | layer backward / layer forward | 1.545 |" in doc
    with pytest.raises(PipesimError, match="--only: unknown source NAR21"):
        bp.main(["--rows", str(rows), "--out", str(out), "--only", "NAR21"])
    with pytest.raises(PipesimError, match="missing.toml"):
        bp.main(["--rows", str(tmp_path / "missing.toml"), "--out", str(out)])


def test_signed_speed_statistics_exactly():
    # a throughput 1.25x the published, a time 0.8x (speed 1.25x), a time 1.25x (speed 0.8x)
    results = [_result("a", "S", 100.0, 125.0, metric="tflops_per_gpu_nar21"), _result("b", "S", 2.0, 1.6),
               _result("c", "S", 4.0, 5.0), _result("d", "S", None, 1.0)]
    assert [r.speed_ratio for r in results[:3]] == [pytest.approx(1.25), pytest.approx(1.25), pytest.approx(0.8)]
    s = pr.stats(results)
    assert s.rows == 3
    assert (s.median_abs, s.max_abs) == (pytest.approx(0.25), pytest.approx(0.25))  # |errors| 0.25, 0.2, 0.25
    assert s.signed_mean == pytest.approx((0.25 + 0.25 - 0.2) / 3, rel=1e-12)
    assert s.signed_median == pytest.approx(0.25, rel=1e-12)
    assert s.speed_factor == pytest.approx(1.25 ** (1 / 3), rel=1e-12)  # (1.25 x 1.25 x 0.8)^(1/3)
    assert pr.stats_line("S", s) == ("S: 3 rows, median |error| 25.0 %, max |error| 25.0 %; signed (speed, + = "
                                     "optimistic) mean +10.0 %, median +25.0 %; speed factor 1.077.")


def test_breakdown_table_arithmetic():
    base = [_result("a", "S", 100.0, 125.0, metric="tflops_per_gpu_nar21"), _result("b", "S", 2.0, 1.6)]
    off = [_result("a", "S", 100.0, 90.0, metric="tflops_per_gpu_nar21"), _result("b", "S", 2.0, 2.5)]
    failed = [base[0], pr.Result(base[1].row, None, "f", failure="x")]
    lines = pr.breakdown_table(base, [pr.Switched("1. m", "off: x", off), pr.Switched("2. n", "on: y", failed)])
    # as run: |errors| 0.25, 0.2; speed ratios 1.25, 1.25. Switched: |errors| 0.1, 0.25; speed 0.9, 0.8
    assert lines[2] == ("| 1. m | off: x | 2 | 22.5 % -> 17.5 % | 25.0 % -> 25.0 % | +25.0 % -> -15.0 % | "
                        f"1.250 -> {(0.9 * 0.8) ** 0.5:.3f} |")
    assert lines[3] == "| 2. n | on: y | 1 (1 failed) | 22.5 % -> 25.0 % | 25.0 % -> 25.0 % | +25.0 % -> +25.0 % | " \
                       "1.250 -> 1.250 |"


def test_switched_argv(tmp_path):
    sw = bp.Switch("m", "l", add_flags=("--no-async-tensor-model-parallel-allreduce",),
                   drop_flags=("--scatter-gather",), skip_when=(("--tp", "1"),))
    cmd = LAYER + " --scatter-gather"
    blocking = ["--no-async-tensor-model-parallel-allreduce"]
    assert bp.switched_argv(cmd, sw, tmp_path) == shlex.split(LAYER)[1:] + blocking  # dropped, added
    assert bp.switched_argv(cmd.replace("--tp 8", "--tp 1"), sw, tmp_path) is None  # skip_when
    already = bp.Switch("m", "l", drop_flags=("--sequence-parallel",))
    assert bp.switched_argv(LAYER, already, tmp_path) is None  # nothing to drop: the same run
    assert bp.switched_argv(LAYER, bp.Switch("m", "l", without_optimizer=True), tmp_path) is None
    ub = bp.Switch("m", "l", drop_flags=("--tp-comm-overlap",), drop_valued=("--tp-comm-overlap-cfg",))
    cfg = " --tp-comm-overlap --tp-comm-overlap-cfg bench/tp_overlap/nemo_gpt3_175b_h100.yaml"
    assert bp.switched_argv(LAYER + cfg, ub, tmp_path) == shlex.split(LAYER)[1:]  # the flag and its file dropped
    hw = bp.Switch("m", "l", hardware=(("device.family", ""), ("scale_out.name", "plain")))
    argv = bp.switched_argv(LAYER, hw, tmp_path)
    path = argv[argv.index("--hardware") + 1]
    expected = shlex.split(LAYER)[1:]
    expected[expected.index("--hardware") + 1] = path  # only the hardware changes, to a file in tmp_path
    assert argv == expected and Path(path).parent == tmp_path
    variant, preset = load_hardware(path), load_hardware("dgx-a100")
    assert (variant.device.family, variant.scale_out.name) == ("", "plain")
    assert variant == replace(preset, device=replace(preset.device, family=""),
                              scale_out=replace(preset.scale_out, name="plain"))
    with pytest.raises(ValueError, match="no field 'device.famly'"):
        bp.hardware_variant("dgx-a100", (("device.famly", ""),), tmp_path)
    burst = bp.Switch("m", "l", hardware=(("device.kernels.matmul_efficiency", 0.803),), family="H100")
    assert bp.switched_argv(LAYER, burst, tmp_path) is None  # an A100 row: another family's figures
    h100 = bp.switched_argv(LAYER.replace("dgx-a100", "dgx-h100"), burst, tmp_path)
    assert load_hardware(h100[h100.index("--hardware") + 1]).device.kernels.matmul_efficiency == 0.803


def test_skip_when_rules_of_the_rows_file_hold():
    """A row a switch skips keeps its result: the switched command must give the same run on such a row."""
    small = {("--tp", "1"): LAYER.replace("--tp 8", "--tp 1"), ("--dp", "1"): LAYER,
             ("--sequence-parallel",): LAYER + " --sequence-parallel --recompute selective"}
    checked = 0
    for sw in DATA["switches"]:
        for seq in sw.skip_when:
            cmd = small[seq] + " --scatter-gather"
            assert bp.commands.contains(shlex.split(cmd), seq)
            assert bp.switched_argv(cmd, sw, Path("/nonexistent")) is None
            forced = bp.switched_argv(cmd, replace(sw, skip_when=()), Path("/nonexistent"))
            assert forced is not None and forced != shlex.split(cmd)[1:], (sw.label, seq)
            base, switched = bp.run_argv(shlex.split(cmd)[1:]), bp.run_argv(forced)
            assert isinstance(base, dict) and switched == base, (sw.label, seq)
            checked += 1
    assert checked == 4  # TP part: tp 1; DP part: dp 1; scatter/gather: SP, tp 1


def test_breakdown_through_main_on_a_tiny_rows_file(tmp_path):
    sp = LAYER + " --recompute selective --sequence-parallel"
    rows = tmp_path / "rows.toml"
    rows.write_text(f"""
[sources.KOR22]
citation = "K"
in_published_md = true

[sources.OTHER]
citation = "O"
in_published_md = false

{LAYER_ROWS}
[[rows]]
id = "sp-bwd"
source = "OTHER"
table = "T"
configuration = "layer backward, selective + SP"
metric = "layer_backward_ms"
published = 13.1
command = "{sp}"

[[mechanisms]]
short = "1. k"
name = "kernels"
state = "in"

[[mechanisms.switch]]
label = "off: no family"
hardware = {{ "device.family" = "" }}

[[mechanisms]]
short = "2. t"
name = "tp overlap"
state = "in"

[[mechanisms.switch]]
label = "off: blocking"
add_flags = ["--no-async-tensor-model-parallel-allreduce"]
skip_when = ["--sequence-parallel"]

[[mechanisms]]
short = "4. o"
name = "optimizer"
state = "in"

[[mechanisms.switch]]
label = "off: less the optimizer"
without_optimizer = true
""")
    out = tmp_path / "p.md"
    assert bp.main(["--rows", str(rows), "--out", str(out), "--jobs", "1"]) == 0
    doc = out.read_text()

    def ms(command: str, stage_kind: str, extra: list[str] | None = None) -> float:
        sim = bp.run_argv(shlex.split(command)[1:] + (extra or []))
        return bp.metrics.action_ms(sim, 1, stage_kind)

    def line(label: str, pairs_on: list[tuple[float, float]], pairs_off: list[tuple[float, float]]) -> str:
        def figures(pairs):  # (published, predicted) of times: |error|s and speed ratios
            errs = sorted(abs(p / q - 1) for q, p in pairs)
            speed = [q / p for q, p in pairs]
            med = errs[len(errs) // 2] if len(errs) % 2 else (errs[0] + errs[1]) / 2
            return med, errs[-1], sum(speed) / len(speed) - 1, math.prod(speed) ** (1 / len(speed))
        a, b = figures(pairs_on), figures(pairs_off)
        return (f"| {label} | {len(pairs_off)} | {a[0] * 100:.1f} % -> {b[0] * 100:.1f} % | {a[1] * 100:.1f} % -> "
                f"{b[1] * 100:.1f} % | {a[2] * 100:+.1f} % -> {b[2] * 100:+.1f} % | {a[3]:.3f} -> {b[3]:.3f} |")

    on = [(7.7, ms(LAYER, "F")), (11.9, ms(LAYER, "B"))]
    on_sp = [(13.1, ms(sp, "B"))]
    with tempfile.TemporaryDirectory() as d:
        roofline = bp.hardware_variant("dgx-a100", (("device.family", ""),), Path(d))
        cmd_k, sp_k = (c.replace("dgx-a100", str(roofline)) for c in (LAYER, sp))
        k = [(7.7, ms(cmd_k, "F")), (11.9, ms(cmd_k, "B"))]
        k_sp = [(13.1, ms(sp_k, "B"))]
    blocking = ["--no-async-tensor-model-parallel-allreduce"]
    t = [(7.7, ms(LAYER, "F", blocking)), (11.9, ms(LAYER, "B", blocking))]
    assert k != on and t != on and t[1][1] > on[1][1]  # each switch changes the goal's rows; blocking is slower
    assert line("1. k | off: no family", on, k) in doc
    assert line("2. t | off: blocking", on, t) in doc
    assert line("4. o | off: less the optimizer", on, on) in doc  # layer times hold no optimizer
    # the other source's own table: the skipped row keeps its result
    other = doc[doc.index("### Other published results"):]
    assert line("1. k | off: no family", on_sp, k_sp) in other
    assert line("2. t | off: blocking", on_sp, on_sp) in other
    assert "Other published results (not in published.md, outside the goal): 1 rows" in doc



def test_hardware_substitution_runs_every_row_on_a_measured_file(tmp_path):
    """--hardware dgx-a100=FILE: each row runs on FILE (as a `calibrate --gpu` file would be used), the report says so;
    a malformed pair or a file that does not load is one line, before any run."""
    measured_file = bp.diagnosis.variant(bp, "dgx-a100", "matmul_efficiency", 0.7, tmp_path)
    rows = tmp_path / "rows.toml"
    rows.write_text(f"""
[sources.KOR22]
citation = "K"

{LAYER_ROWS}""")
    out = tmp_path / "p.md"
    assert bp.main(["--rows", str(rows), "--out", str(out), "--jobs", "1", "--no-breakdown", "--no-diagnosis",
                    "--hardware", f"dgx-a100={measured_file}"]) == 0
    doc = out.read_text()
    argv, _ = bp.parse_command(LAYER)
    on_file = bp.run_argv([str(measured_file) if a == "dgx-a100" else a for a in argv])
    forward, shipped = bp.metrics.action_ms(on_file, 1, "F"), bp.metrics.action_ms(bp.run_argv(argv), 1, "F")
    assert f"| Table 4 | layer forward | 7.7 ms | {pr.num(forward)} ms |" in doc and forward != shipped
    assert f"- Hardware substituted in every row: dgx-a100={measured_file} (`--hardware`)." in doc
    data = bp.substitute_hardware(bp.load(rows), [f"dgx-h100={measured_file}"])  # no row uses it: unchanged
    assert [r.command for r in data["rows"]] == [r.command for r in bp.load(rows)["rows"]]
    with pytest.raises(PipesimError, match="give PRESET=FILE"):
        bp.main(["--rows", str(rows), "--out", str(out), "--hardware", "dgx-a100"])
    with pytest.raises(PipesimError, match="missing.toml"):
        bp.main(["--rows", str(rows), "--out", str(out), "--hardware", f"dgx-a100={tmp_path / 'missing.toml'}"])


# ---- issue 33's goals (bench/published_goals.py) ----------------------------------------------------------------
