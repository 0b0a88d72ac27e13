"""`pipesim sweep` and `pipesim.sim.sweep`: rows equal to the closed forms, skipped combinations, JSON, plot."""

from __future__ import annotations

import json

import pytest

from pipesim.cli import main
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig
from pipesim.sim.sim_setup import SimSetup
from pipesim.sim.sweep import SCHEMA, format_table, run_sweep, to_dict

UNIT = SimSetup(cost={"F": 1.0, "I": 1.0, "W": 1.0}, comm=False)


def test_rows_match_closed_forms_and_skip_what_a_schedule_does_not_admit():
    skipped: list[dict] = []
    rows = run_sweep(["gpipe", "1f1b", "zb-h1", "interleaved-1f1b"], [2, 4], [4, 6], [2], UNIT, skipped=skipped)
    got = {(r["schedule"], r["stages"], r["microbatches"], r["virtual"]): r for r in rows}
    for p in (2, 4):
        for m in (4, 6):
            assert got[("gpipe", p, m, 1)]["makespan"] == 3 * (m + p - 1)
            assert got[("1f1b", p, m, 1)]["makespan"] == 3 * (m + p - 1)
            assert got[("1f1b", p, m, 1)]["peak_inflight"] == min(p, m)
            assert got[("gpipe", p, m, 1)]["peak_inflight"] == m
            assert got[("zb-h1", p, m, 1)]["makespan"] == 3 * m + p - 1
            assert got[("1f1b", p, m, 1)]["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1), abs=1e-15)
    # --cost is a rank's share: each of the v chunks takes 1/v, so (m + (p-1)/v)(t_F + t_B)
    assert got[("interleaved-1f1b", 2, 4, 2)]["makespan"] == (4 + (2 - 1) / 2) * 3
    assert [(s["schedule"], s["stages"], s["microbatches"]) for s in skipped] == [("interleaved-1f1b", 4, 6)]
    assert skipped[0]["reason"]
    assert len(rows) == 3 * 4 + 3


def test_model_rows_report_memory_and_links():
    setup = SimSetup(hardware=load_hardware("dgx-h100"), model=ModelConfig(kind="mlp", batch=32))
    rows = run_sweep(["gpipe", "1f1b"], [4], [8], None, setup)
    gpipe, one = rows
    assert gpipe["peak_activation_bytes"] == 2 * one["peak_activation_bytes"]  # m=8 vs min(p, m)=4 in flight
    assert set(one["link_utilization"]) == {"nvswitch"} and 0 < one["link_utilization"]["nvswitch"] < 1
    doc = to_dict(rows, setup)
    assert doc["schema"] == SCHEMA and doc["hardware"] == "dgx-h100" and doc["rows"] == rows
    table = format_table(rows)
    assert table.splitlines()[2].split()[:4] == ["gpipe", "4", "8", "1"]


def test_cli_json_table_and_plot(capsys, tmp_path):
    code = main(["sweep", "--schedules", "gpipe,1f1b", "--stages", "2,4", "--microbatches", "4,8", "--cost", "F=1,B=2",
                 "--json"])
    out, _ = capsys.readouterr()
    d = json.loads(out)
    assert code == 0 and d["schema"] == SCHEMA and len(d["rows"]) == 8
    assert [r["makespan"] for r in d["rows"] if r["schedule"] == "gpipe"] == [15.0, 27.0, 21.0, 33.0]
    html = tmp_path / "sweep.html"
    code = main(["sweep", "--schedules", "1f1b,zb-h1", "--stages", "2", "--microbatches", "4,8", "--cost",
                 "F=1,I=1,W=1", "--plot", str(html)])
    out, _ = capsys.readouterr()
    assert code == 0 and "zb-h1" in out and html.stat().st_size > 1000


def test_cli_unknown_schedule_exit_2(capsys):
    code = main(["sweep", "--schedules", "gpipe,bogus", "--cost", "F=1,B=2"])
    _, err = capsys.readouterr()
    assert code == 2 and "unknown schedule 'bogus'" in err
