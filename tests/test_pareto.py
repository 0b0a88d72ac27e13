"""The sweep's Pareto view: bubble against peak activation memory, the non-dominated schedules joined."""

from __future__ import annotations

import json

from pipesim.cli import main
from pipesim.plots.pareto import pareto_figure, pareto_front


def row(name, bubble, peak, p=4, m=8, v=1):
    return {"schedule": name, "stages": p, "microbatches": m, "virtual": v, "bubble_fraction": bubble,
            "peak_activation_bytes": peak, "makespan": 1.0}


def test_pareto_front_keeps_the_non_dominated_by_memory():
    rows = [row("gpipe", 0.3, 800), row("1f1b", 0.3, 400), row("zb-h1", 0.1, 400), row("zb-h2", 0.0, 800),
            row("v-half", 0.4, 200), row("worse", 0.5, 900)]
    assert [r["schedule"] for r in pareto_front(rows)] == ["v-half", "zb-h1", "zb-h2"]


def test_pareto_figure_one_front_and_one_marker_set_per_configuration():
    rows = [row("1f1b", 0.3, 2**20), row("zb-h1", 0.1, 2**20), row("1f1b", 0.2, 2**21, m=16)]
    fig = pareto_figure(rows)
    assert [t.name for t in fig.data] == ["Pareto front, p=4, m=8", "p=4, m=8", "Pareto front, p=4, m=16", "p=4, m=16"]
    assert list(fig.data[0].x) == [1.0] and list(fig.data[0].y) == [0.1]  # MiB; 1f1b at p=4 m=8 is dominated
    assert list(fig.data[1].text) == ["1f1b", "zb-h1"]
    assert fig.layout.xaxis.title.text == "peak activation memory, largest rank (MiB)"


def test_sweep_writes_the_pareto_view(tmp_path, capsys):
    out, js = tmp_path / "pareto.html", tmp_path / "sweep.json"
    code = main(["sweep", "--schedules", "1f1b,zb-h1,zb-h2,v-half,dualpipev", "--stages", "4", "--microbatches", "8",
                 "--cost", "F=1,I=1,W=1", "--activation-bytes", "1000", "--comm", "none", "--pareto", str(out),
                 "--json", str(js)])
    capsys.readouterr()
    assert code == 0 and "Pareto front, p=4, m=8" in out.read_text()
    rows = json.loads(js.read_text())["rows"]
    # --cost gives every chunk the same 1000 B, so the V schedules' chunks are no lighter: zb-h1 (27 s, 4 stashed)
    # dominates 1f1b (33 s), v-half (27 s, 6 chunks), zb-h2 and dualpipev (27 s with 8 and 9)
    assert [r["schedule"] for r in pareto_front(rows)] == ["zb-h1"]
