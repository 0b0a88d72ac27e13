"""Shared test helpers, and the profiler traces of torch.distributed.pipelining runs (made once a session)."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import schedules
from pipesim.ir import torch_csv
from tests.launch_shared import SharedLaunches

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PIPESIM_SPEED_CHECK", "0")  # no probe per simulate (test_speed_check.py injects one)

PROFILED_WORKER = Path(__file__).parent / "workers" / "profiled_pipeline.py"

# The suite's process holds what every module imported (torch, the simulator, the test modules) for the whole
# session: Python's full collections walked all of it, again and again (26 s of a 345 s run on the 2-core VM,
# measured with gc.callbacks). Fewer young collections (a test's short-lived objects die before one), and what is
# alive at the end of each test module frozen (below), so a full collection walks the current module's objects only.
# The collector's timing aside, nothing changes: reference counting frees what it freed, a collection still finds
# the cycles made since the last module; only cycles among objects that outlived their module are left unfreed.
gc.set_threshold(20000, 10, 10)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if nextitem is None or nextitem.module is not item.module:  # the module's fixtures are finalized by now
        gc.collect()
        gc.freeze()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ProfiledTraces:
    """Where each schedule's per-rank traces are (rank0.json, rank1.json), and the run they record: 2 gloo
    ranks, one Linear(hidden, hidden) + ReLU per stage, `batch` rows a step in `m` microbatches, `steps` steps."""

    one_f_one_b: Path  # torch's Schedule1F1B, with_stack (it names no range of its own)
    gpipe: Path  # torch's ScheduleGPipe
    zb_h1: Path  # pipesim's zb-h1 exported to CSV, run by torch's _PipelineScheduleRuntime (`PP:<action>`)
    p: int = 2
    m: int = 4
    steps: int = 5  # the calibration's typical step is the median after the warm-up one
    hidden: int = 256
    batch: int = 32

    @property
    def env(self) -> dict[str, str]:
        """The environment that sizes tests/workers/profiled_pipeline.py's model (and its factory) as traced."""
        return {"PROFILED_HIDDEN": str(self.hidden), "PROFILED_BATCH": str(self.batch)}


@pytest.fixture(scope="session")
def shared_launches(tmp_path_factory) -> SharedLaunches:
    """One torchrun launch per world size for the test modules' distributed cases (tests/launch_shared.py)."""
    return SharedLaunches(tmp_path_factory.mktemp("shared"))


@pytest.fixture(scope="session")
def profiled_traces(tmp_path_factory) -> ProfiledTraces:
    """One launch of tests/workers/profiled_pipeline.py profiles all three schedules one after the other
    (1f1b first, in fresh processes); read by tests/test_trace_import.py and tests/test_trace_import_calibrate.py."""
    root = tmp_path_factory.mktemp("profiled")
    traces = ProfiledTraces(root / "1f1b", root / "gpipe", root / "zb-h1")
    csv = root / "zb-h1.csv"
    torch_csv.dump(schedules.build("zb-h1", traces.p, traces.m).compute_only(), csv)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **traces.env}
    proc = subprocess.run([sys.executable, str(PROFILED_WORKER), str(root), str(traces.m), str(traces.steps),
                           "1f1b", "gpipe", str(csv)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for folder in (traces.one_f_one_b, traces.gpipe, traces.zb_h1):
        assert sorted(f.name for f in folder.glob("rank*.json")) == ["rank0.json", "rank1.json"], folder
    return traces
