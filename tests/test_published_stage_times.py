"""The Zero Bubble paper's per-stage times in `pipesim bench published` (ZB24, bench/published_rows.toml): the metrics
read the stage p // 2's F, I and W actions (bench/published_metrics.py), a W off the critical path included (the
bench keeps every compute action of those runs, from --trace), and the rows are Table 9's first-m figures on Table 3's
models and the paper's layer cut (bench/zb_paper_table.py, bench/zb_paper_settings.py)."""

from __future__ import annotations

import pytest

import schedules
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.sim.sim_setup import SimSetup
from tests.published_bench import DATA, bp

# three stages, one microbatch, hand-given seconds: stage 1's W (3.0 -> 4.25 s) ends before rank 0's, off the path
COST = "pipesim simulate zb-h1 --stages 3 --microbatches 1 --cost F=0.5,I=0.75,W=1.25"
STAGE_METRICS = ("stage_forward_ms", "stage_input_grad_ms", "stage_weight_grad_ms")


def test_stage_metrics_read_the_middle_stage_off_the_critical_path():
    argv, args = bp.parse_command(COST)
    assert bp.metrics.middle_stage(args) == 1
    sim = bp.run_argv(argv, actions=True)
    assert "1W0" not in [a["name"] for a in sim["critical_path"]]  # rank 0's W ends the step
    assert [bp.METRICS[k].convert(sim, args) for k in STAGE_METRICS] == [500.0, 750.0, 1250.0]
    assert all(bp.METRICS[k].needs_actions for k in STAGE_METRICS)
    assert not bp.METRICS["layer_forward_ms"].needs_actions  # KOR22's F and B lie on the critical path
    path_only = bp.run_argv(argv)  # what every other row keeps: F and I are on the path, W is not
    assert "actions" not in path_only
    assert bp.METRICS["stage_input_grad_ms"].convert(path_only, args) == 750.0
    with pytest.raises(ValueError, match="the critical path has 0 actions named 1W0"):
        bp.METRICS["stage_weight_grad_ms"].convert(path_only, args)
    assert bp.metrics.middle_stage(bp.parse_command(COST.replace("--stages 3", "--stages 8"))[1]) == 4
    with pytest.raises(ValueError, match="one chunk per rank"):
        bp.metrics.middle_stage(bp.parse_command(COST.replace("zb-h1", "zb-v"))[1])


def test_a_stage_time_row_through_main_and_its_breakdown(tmp_path):
    """Reported apart (in_published_md false), counted by issue 33's every-row goal; the switched run keeps its
    actions too (--slow 1=2 doubles stage 1's W)."""
    rows = tmp_path / "rows.toml"
    rows.write_text(f"""
[sources.ZB]
citation = "Z"
in_published_md = false

[[rows]]
id = "w"
source = "ZB"
table = "Table 9"
configuration = "stage 1 W"
metric = "stage_weight_grad_ms"
published = 1250
command = "{COST}"

[[mechanisms]]
short = "9. s"
name = "slow rank"
state = "what-if"

[[mechanisms.switch]]
label = "slow: rank 1 x2"
add_flags = ["--slow", "1=2"]
""")
    out = tmp_path / "p.md"
    assert bp.main(["--rows", str(rows), "--out", str(out), "--jobs", "2", "--no-diagnosis"]) == 0
    doc = out.read_text()
    assert "| Table 9 | stage 1 W | 1250 ms | 1250 ms | +0.0 % |" in doc
    assert "Other published results (not in published.md, outside the goal): 1 rows, median |error| 0.0 %" in doc
    assert "Issue 33's goal on every published row this bench reports: 1 of 1 simulated" in doc
    assert ("| 9. s | slow: rank 1 x2 | 1 | 0.0 % -> 100.0 % | 0.0 % -> 100.0 % | +0.0 % -> -50.0 % | "
            "1.000 -> 0.500 |") in doc


def test_the_zb24_rows_are_table_9_on_table_3s_models():
    table, settings = bp._sibling("zb_paper_table"), bp._sibling("zb_paper_settings")  # by path, as the bench
    first = {}
    for s in table.SETTINGS:  # each model's first m
        first.setdefault(s.model, s)
    rows = [r for r in DATA["rows"] if r.source == "ZB24"]
    assert not DATA["sources"]["ZB24"]["in_published_md"]
    assert [r.id for r in rows] == [f"zb24-{m.lower()}-{k}" for m in settings.MODELS for k in "fbw"]
    for r in rows:
        name = r.id.split("-")[1].upper()
        layers, heads, hidden, p, mbs, _ = settings.MODELS[name]
        s = first[name]
        k = r.id[-1]
        assert (r.metric, r.published) == ({"f": STAGE_METRICS[0], "b": STAGE_METRICS[1], "w": STAGE_METRICS[2]}[k],
                                           {"f": s.f, "b": s.b, "w": s.w}[k])
        argv, args = bp.parse_command(r.command)
        assert (args.name, args.hidden, args.layers, args.heads, args.seq, args.vocab) == (
            "zb-h1", hidden, layers, heads, 1024, 50257)
        assert tuple(args.layer_split) == settings.paper_split(layers, p) and args.stages == p
        assert args.batch == args.microbatch_size == mbs and (args.tp, args.dp, args.nodes) == (1, 1, max(1, p // 8))
        assert (args.hardware, args.attention, args.dtype, args.recompute) == ("dgx-a100", "eager", "float16", "none")
        assert f"stage {p // 2}:" in r.configuration and f"(p {p}, m {s.m})" in r.configuration


def test_a_zb24_row_reads_its_stage_costs_whatever_m():
    """The 1-microbatch command's stage p // 2 actions are that stage's per-microbatch costs at the paper's m (24)."""
    settings = bp._sibling("zb_paper_settings")
    layers, heads, hidden, p, mbs, ms = settings.MODELS["1.5B"]
    argv, args = bp.parse_command(next(r.command for r in DATA["rows"] if r.id == "zb24-1.5b-f"))
    sim = bp.run_argv(argv, actions=True)
    model = ModelConfig(kind="gpt", hidden=hidden, heads=heads, seq=1024, vocab=50257, layers=layers,
                        batch=ms[0] * mbs, dtype="float16")
    setup = SimSetup(hardware=load_hardware("dgx-a100"), model=model, layer_split=settings.paper_split(layers, p),
                     check_memory=False, job=Job(attention="eager"))
    st = setup.costs(schedules.build("zb-h1", p, ms[0])).table.stages[p // 2]
    got = [bp.METRICS[k].convert(sim, args) for k in STAGE_METRICS]
    assert got == pytest.approx([st.forward * 1e3, st.backward_input * 1e3, st.backward_weight * 1e3], rel=1e-12)
