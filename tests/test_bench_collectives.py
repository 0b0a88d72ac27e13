"""`pipesim bench collectives` under a real torchrun (gloo, 2 ranks): every op, exact nccl-tests arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from executor.collectives_bench import busbw_factor
from executor.collectives_config import OPS, parse_size
from pipesim.errors import PipesimError

FACTORS_N2 = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "scatter": 0.5, "gather": 0.5,
              "all_to_all": 0.5, "broadcast": 1.0, "reduce": 1.0, "send_recv": 1.0}  # 2(n-1)/n, (n-1)/n, 1 at n = 2


def _pipesim(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "pipesim", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


def test_parse_size_uses_binary_suffixes() -> None:
    assert [parse_size(s) for s in ("1024", "1K", "64k", "1M", "16MB", "1KiB", "1G")] == \
        [1024, 1024, 65536, 2**20, 16 * 2**20, 1024, 2**30]
    for bad in ("", "K", "1Q", "0", "1.3"):
        with pytest.raises(PipesimError):
            parse_size(bad)


def test_busbw_factors_follow_nccl_tests() -> None:
    assert {op: busbw_factor(op, 2) for op in OPS} == FACTORS_N2
    assert busbw_factor("all_reduce", 4) == 1.5 and busbw_factor("gather", 4) == 0.75


@pytest.mark.dist
def test_tiny_run_reports_every_op_with_exact_arithmetic(tmp_path) -> None:
    out, plot = tmp_path / "c.json", tmp_path / "c.html"
    proc = _pipesim("bench", "collectives", "--nproc", "2", "--sizes", "1024,65536", "--iters", "2",
                    "--warmup", "1", "--backend", "gloo", "--timeout", "20", "--json", str(out), "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["backend"] == "gloo" and report["world_size"] == 2
    rows = report["results"]
    assert [(r["op"], r["bytes"]) for r in rows] == [(op, s) for op in OPS for s in (1024, 65536)]
    for r in rows:
        assert r["verified"] is True  # e.g. all_reduce of rank+1 gave 1+2 = 3 everywhere
        assert r["time"] > 0 and r["iters"] == 2
        assert r["algbw"] == r["bytes"] / r["time"]
        assert r["busbw_factor"] == FACTORS_N2[r["op"]]
        assert r["busbw"] == r["algbw"] * r["busbw_factor"]
    table = proc.stdout.splitlines()
    assert table[1].split() == ["op", "bytes", "time", "(us)", "algbw", "(GB/s)", "busbw", "(GB/s)"]
    assert len([line for line in table if line.split()[:1] and line.split()[0] in OPS]) == 2 * len(OPS)
    html = plot.read_text()
    assert "plotly" in html.lower() and all(f'"name":"{op}"' in html for op in OPS)


@pytest.mark.dist
def test_lecture_mode_prints_the_lecture_bandwidths(tmp_path) -> None:
    out = tmp_path / "lecture.json"
    proc = _pipesim("bench", "collectives", "--nproc", "2", "--lecture", "--elements", "4096", "--backend", "gloo",
                    "--timeout", "20", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lec = json.loads(out.read_text())["lecture"]
    assert lec["all_reduce"]["sent_bytes"] == 4096 * 4 * 2 * 1  # 4N * 2(n-1)
    assert lec["reduce_scatter"]["sent_bytes"] == 2 * 4096 * 4 * 1  # 4nN * (n-1)
    for op in ("all_reduce", "reduce_scatter"):
        sent, durations, bws = lec[op]["sent_bytes"], lec[op]["duration"], lec[op]["bandwidth"]
        assert len(durations) == 2 and bws == [sent / (2 * d) for d in durations]
    assert proc.stdout.count("[all_reduce] rank") == 2 and proc.stdout.count("[reduce_scatter] rank") == 2


def test_bad_flags_fail_with_one_line_before_torchrun() -> None:
    proc = _pipesim("bench", "collectives", "--ops", "all_reduce,allreduce", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "pipesim: error: unknown collective 'allreduce'; choose from " + ", ".join(OPS)]


def test_config_crosses_to_the_worker_as_json_of_its_fields() -> None:
    from executor.collectives_config import CollectivesConfig

    cfg = CollectivesConfig(sizes=(1024, 2**20), ops=("gather",), iters=3, warmup=0, backend="gloo", json="-",
                            plot="c.html", lecture=True, elements=4096, timeout=7.5)
    assert CollectivesConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(PipesimError, match=r"unknown benchmark configuration field\(s\): size$"):
        CollectivesConfig.from_json('{"size": [1]}')
    with pytest.raises(PipesimError, match=r"^--warmup must be >= 0, got -1$"):
        CollectivesConfig(warmup=-1).check()
