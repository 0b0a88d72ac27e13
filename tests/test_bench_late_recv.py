"""`pipesim bench late-recv`: a real 2-rank torchrun job times late RECVs for every sender case."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _pipesim(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "pipesim", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


@pytest.mark.dist
def test_every_case_timed_and_ratios_against_the_waiting_sender(tmp_path) -> None:
    out = tmp_path / "late.json"
    proc = _pipesim("bench", "late-recv", "--", "--iters", "3", "--sender-ms", "1", "--receiver-ms", "0.5",
                    "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    cases = json.loads(out.read_text())["cases"]
    assert list(cases) == ["waits", "small-ops", "big-ops", "sleeps"]
    for name, c in cases.items():
        assert len(c["seconds"]) == 3 and all(0 < t < 60 for t in c["seconds"])
        assert c["mean"] == pytest.approx(sum(c["seconds"]) / 3, rel=1e-12)
        assert c["mean_vs_waits"] == pytest.approx(c["mean"] / cases["waits"]["mean"], rel=1e-12)
        assert f"sender {name:9s}: median" in proc.stdout
    assert cases["waits"]["mean_vs_waits"] == 1.0


def test_bad_flags_exit_2_without_launching() -> None:
    proc = _pipesim("bench", "late-recv", "--", "--iters", "0", timeout=60)
    assert proc.returncode == 2 and "must be positive" in proc.stderr and "Traceback" not in proc.stderr
