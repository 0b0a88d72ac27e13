"""`pipesim schedule`: grids, CSV and JSON for every registered schedule; one-line errors, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import schedules
from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.ir import torch_csv


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _first_built(name: str, sizes):
    """(p, m, schedule) of the first (p, m) the schedule's builder accepts."""
    for p, m in sizes:
        try:
            return p, m, schedules.build(name, p, m)
        except PipesimError:
            continue
    raise AssertionError(f"{name} builds at none of {sizes}")


@pytest.mark.parametrize("name", schedules.names())
def test_every_schedule_prints_in_every_format(capsys, name):
    p, m, sched = _first_built(name, ((3, 6), (4, 8)))  # dualpipe needs an even p
    code, out, _ = run_cli(capsys, "schedule", name, "--stages", str(p), "--microbatches", str(m), "--format", "csv")
    assert code == 0 and torch_csv.loads(out).programs == sched.programs
    code, out, _ = run_cli(capsys, "schedule", name, "-p", str(p), "-m", str(m), "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["programs"] == [sched.cells(r) for r in range(sched.num_ranks)]
    code, out, _ = run_cli(capsys, "schedule", name, "-p", str(p), "-m", str(m))
    lines = out.splitlines()
    assert code == 0 and lines[0].endswith("valid") and len(lines) == 2 + p
    assert lines[2].split()[3] == str(sched.programs[0][0])


def test_from_csv_prints_deadlock_grid(capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("0RECV_B0,0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n")
    code, out, err = run_cli(capsys, "schedule", "--from-csv", str(bad))
    assert code == 2
    assert err.splitlines()[-1] == (
        "pipesim: error: deadlock: rank 0 blocks on RECV_B(stage 0, mb 0) from rank 1, "
        "which blocks on RECV_F(stage 1, mb 0) from rank 0"
    )
    assert "[0RECV_B0]" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["schedule", "warp"], "unknown schedule 'warp'"),
        (["schedule", "1f1b", "--stages", "0"], "--stages/-p: must be >= 1"),
        (["schedule", "1f1b", "--microbatches", "x"], "'x' is not an integer"),
        (["schedule", "interleaved-1f1b", "-p", "4", "-m", "6"], "m=6 is not a multiple of p=4"),
        (["schedule", "--from-csv", "/nonexistent.csv"], "schedule CSV not found"),
        (["schedule"], "name a schedule"),
    ],
)
def test_user_errors_are_one_line_exit_2(argv, message):
    proc = subprocess.run([sys.executable, "-m", "pipesim", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


def test_plot_writes_self_contained_html(capsys, tmp_path):
    out = tmp_path / "zb.html"
    code, _, _ = run_cli(capsys, "schedule", "zb-h1", "-p", "3", "-m", "6", "--plot", str(out))
    html = out.read_text()
    assert code == 0 and "plotly" in html and '<script src="https://cdn.plot.ly' not in html
    assert "unit costs F=1, B=2" in html
