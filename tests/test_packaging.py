"""The wheel ships all three packages (hatchling's default would drop two) and the presets."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_contains_all_packages(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("pipesim-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for package in ("pipesim", "schedules", "executor"):
        assert f"{package}/__init__.py" in names
    for module in ("pipesim/ir/schedule.py", "pipesim/cli.py", "schedules/one_f_one_b.py"):
        assert module in names
    assert any(n.startswith("pipesim/presets/") and n.endswith(".toml") for n in names)
    assert not any(n.startswith("tests/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "pipesim = pipesim.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
