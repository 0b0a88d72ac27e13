"""The one-figure diagnosis of `pipesim bench published` (bench/published_diagnosis.py): it finds a planted figure
back, reports it, and checks other sources of the anchor's device family out of sample."""

from __future__ import annotations

import re

import pytest

from pipesim.device.profile import device_profile
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from tests.published_bench import LAYER, bp


def test_the_diagnosis_solves_a_planted_figure_and_reports_it(tmp_path):
    """A row whose 'published' value is the simulator's own prediction at matmul_efficiency 0.7: the diagnosis finds
    0.7 back (to the bisection's step), and the report's section carries it with that row at ~0 % error."""
    dg = bp.diagnosis
    planted = dg.variant(bp, "dgx-a100", "matmul_efficiency", 0.7, tmp_path)
    hw = load_hardware(str(planted))
    assert hw.device.kernels.matmul_efficiency == 0.7 and "not a measurement" in hw.device.kernels.source
    argv, args = bp.parse_command(LAYER)
    forward = bp.metrics.action_ms(bp.run_argv(dg._on(argv, planted)), 1, "F")
    shipped = bp.metrics.action_ms(bp.run_argv(argv), 1, "F")
    assert forward > shipped  # a lower efficiency is a slower forward: the bisection's direction
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
published = {forward!r}
command = "{LAYER}"

[[diagnosis]]
anchor = "fwd"
field = "matmul_efficiency"
range = [0.3, 0.869]
""")
    data = bp.load(rows)
    row = data["rows"][0]
    solved = dg.solve(bp, row, "matmul_efficiency", 0.3, 0.869, tmp_path)
    assert abs(solved - 0.7) <= (0.869 - 0.3) / 2**dg.STEPS
    out = tmp_path / "p.md"
    assert bp.main(["--rows", str(rows), "--out", str(out), "--jobs", "1", "--no-breakdown"]) == 0
    doc = out.read_text()
    shipped = device_profile("A100").matmul_efficiency
    assert f"| `matmul_efficiency` | A100 | {shipped:.3f} | fwd | 0.700 | 1 | 0.0 % | 0.0 % |" in doc
    assert "- `matmul_efficiency` = 0.700 (A100): KOR22: layer forward -0.0 %." in doc or \
        "- `matmul_efficiency` = 0.700 (A100): KOR22: layer forward +0.0 %." in doc
    assert "What one kernel figure" not in bp.report.render(data, [], [], [])  # only main adds it
    rows.write_text(rows.read_text().replace('anchor = "fwd"', 'anchor = "nope"'))
    with pytest.raises(PipesimError, match="diagnosis names an unknown row 'nope'"):
        bp.main(["--rows", str(rows), "--out", str(out), "--jobs", "1"])


def test_the_diagnosis_checks_other_sources_of_the_same_family_out_of_sample(tmp_path):
    """Solved on a planted A100 row, the value reproduces another source's A100 row planted at the same figure
    (0 % error) and leaves out rows on another device family (H100)."""
    dg = bp.diagnosis
    planted = dg.variant(bp, "dgx-a100", "matmul_efficiency", 0.7, tmp_path)
    argv, _ = bp.parse_command(LAYER)
    on = [str(planted) if a == "dgx-a100" else a for a in argv]
    fwd, bwd = (bp.metrics.action_ms(bp.run_argv(on), 1, k) for k in ("F", "B"))
    h100 = LAYER.replace("dgx-a100", "dgx-h100")
    rows = _two_sources(tmp_path, (("fwd", "KOR22", "layer forward", "layer_forward_ms", fwd, LAYER),
                                   ("bwd", "OTHER", "a100 backward", "layer_backward_ms", bwd, LAYER),
                                   ("h", "OTHER", "h100 backward", "layer_backward_ms", 1.0, h100)), "fwd", 0.869)
    out = tmp_path / "p.md"
    assert bp.main(["--rows", str(rows), "--out", str(out), "--jobs", "1", "--no-breakdown"]) == 0
    doc = out.read_text()
    line = next(x for x in doc.splitlines()
                if x.startswith("- `matmul_efficiency` = 0.700 (A100): OTHER a100 backward"))
    assert re.fullmatch(r"- `matmul_efficiency` = 0\.700 \(A100\): OTHER a100 backward [+-]0\.0 %\.", line), line
    assert "h100 backward" not in line


def test_an_anchor_on_a_family_without_goal_rows_is_judged_on_that_familys_other_rows(tmp_path):
    """Anchored on an H100 row (published.md has none), the figure is solved there and judged on the other sources'
    H100 rows (planted at the same figure: 0 %), never on the A100 goal rows; the table says whose rows they are."""
    dg = bp.diagnosis
    h100 = LAYER.replace("dgx-a100", "dgx-h100")
    planted = dg.variant(bp, "dgx-h100", "matmul_efficiency", 0.6, tmp_path)
    argv, _ = bp.parse_command(h100)
    on = [str(planted) if a == "dgx-h100" else a for a in argv]
    fwd, bwd = (bp.metrics.action_ms(bp.run_argv(on), 1, k) for k in ("F", "B"))
    rows = _two_sources(tmp_path, (("a", "KOR22", "a100 forward", "layer_forward_ms", 1.0, LAYER),
                                   ("hf", "OTHER", "h100 forward", "layer_forward_ms", fwd, h100),
                                   ("hb", "OTHER", "h100 backward", "layer_backward_ms", bwd, h100)), "hf", 0.9)
    out = tmp_path / "p.md"
    assert bp.main(["--rows", str(rows), "--out", str(out), "--jobs", "1", "--no-breakdown"]) == 0
    doc = out.read_text()
    shipped = device_profile("H100").matmul_efficiency
    assert f"| `matmul_efficiency` | H100 | {shipped:.3f} | hf | 0.600 | 2 (other sources') | 0.0 % | 0.0 % |" in doc
    line = next(x for x in doc.splitlines() if x.startswith("- `matmul_efficiency` = 0.600 (H100): "))
    assert re.fullmatch(r"- `matmul_efficiency` = 0\.600 \(H100\): OTHER: h100 forward [+-]0\.0 %, "
                        r"h100 backward [+-]0\.0 %\.", line), line


def _two_sources(tmp_path, rows: tuple, anchor: str, hi: float):
    """A rows file of a published.md source (KOR22) and another (OTHER), `rows` as (id, source, configuration,
    metric, published, command), and one matmul_efficiency diagnosis on `anchor` over [0.3, hi]."""
    path = tmp_path / "rows.toml"
    path.write_text("""
[sources.KOR22]
citation = "K"

[sources.OTHER]
citation = "O"
in_published_md = false
""" + "".join(f"""
[[rows]]
id = "{i}"
source = "{src}"
table = "T"
configuration = "{conf}"
metric = "{metric}"
published = {pub!r}
command = "{cmd}"
""" for i, src, conf, metric, pub, cmd in rows) + f"""
[[diagnosis]]
anchor = "{anchor}"
field = "matmul_efficiency"
range = [0.3, {hi}]
""")
    return path
