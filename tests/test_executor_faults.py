"""Failures end the whole run, non-zero, naming the rank and the action; never a hang."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.executor_helpers import torchrun

SMALL = ["1f1b", "--microbatches", "4", "--model", "mlp", "--hidden", "16", "--layers", "2", "--batch", "8",
         "--steps", "2", "--quiet"]


def _alive_with(marker: str) -> list[int]:
    """PIDs whose command line mentions `marker` (our ranks carry it in --save-dir)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


@pytest.mark.dist
def test_raising_rank_names_itself_and_its_action(tmp_path):
    proc = torchrun(2, [*SMALL, "--fail-rank", "1", "--fail-at", "1F2", "--save-dir", str(tmp_path)], timeout=90)
    assert proc.returncode != 0
    assert "executor: rank 1 failed during F(stage 1, mb 2): RuntimeError: injected fault at 1F2" in proc.stderr
    assert not _alive_with(str(tmp_path))


@pytest.mark.dist
def test_killed_rank_takes_every_rank_down(tmp_path):
    proc = torchrun(2, [*SMALL, "--fail-rank", "1", "--fail-at", "1B1", "--fail-mode", "kill",
                        "--save-dir", str(tmp_path)], timeout=90)
    assert proc.returncode != 0
    assert "rank 1 kills itself (SIGKILL) at B(stage 1, mb 1)" in proc.stderr
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s*\n\s*exitcode\s*:\s*-9", proc.stderr), proc.stderr
    assert not _alive_with(str(tmp_path))


@pytest.mark.dist
def test_hung_peer_hits_the_process_group_timeout(tmp_path):
    proc = torchrun(2, [*SMALL, "--fail-rank", "1", "--fail-at", "1F0", "--fail-mode", "hang", "--pg-timeout", "3",
                        "--save-dir", str(tmp_path)], timeout=90)
    assert proc.returncode != 0
    # rank 0 ran F0 and F1 (1F1B warmup on 2 ranks is 1 forward, then 1F1B) and waits for 1's gradient of mb 0
    line = next(x for x in proc.stderr.splitlines() if x.startswith("executor: rank 0 failed"))
    assert line.startswith("executor: rank 0 failed during RECV_B(stage 0, mb 0): RuntimeError:"), line
    assert "Timed out" in line
    assert not _alive_with(str(tmp_path))


@pytest.mark.parametrize(("fields", "message"), [
    ({"dp": 2, "tp": 2, "stages": 2}, "dp(2) * pp(2) * tp(2) != WORLD_SIZE(6)"),
    ({"dp": 4}, "WORLD_SIZE(6) is not divisible by dp(4) * tp(1)"),
    ({"model": {"layers": 4}}, "--layers 4 is fewer than the 6 stages; each stage needs a layer"),
    ({"steps": 2, "stage": 2}, "unknown run configuration field(s): stage"),
    (None, "usage: python -m executor --config JSON|FILE (the run configurations `pipesim run --print-config` "
           "writes); got 1f1b --microbatches 4"),
])
def test_config_errors_exit_2_before_any_process_group(fields, message):
    # no MASTER_ADDR/PORT: creating a process group would fail loudly, so exit 2 proves none was made
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASTER_")}
    env.update(RANK="0", WORLD_SIZE="6", LOCAL_RANK="0")
    config = {"names": ["1f1b"], "microbatches": 4, "model": {"batch": 8}}
    for key, value in (fields or {}).items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    argv = ["--config", json.dumps([config])] if fields else ["1f1b", "--microbatches", "4"]
    proc = subprocess.run([sys.executable, "-m", "executor", *argv], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == f"executor: error: {message}\n"
