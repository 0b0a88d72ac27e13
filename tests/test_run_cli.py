"""`pipesim run`: config errors exit 2 before launching; a real run writes the result JSON and the trace."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from executor.__main__ import _Parser
from executor.config import add_run_args, config_from_args
from executor.launch import torchrun_command
from pipesim import torch_csv
from pipesim.cli import main
from pipesim.lowering import add_p2p
from pipesim.model_config import ModelConfig
from pipesim.timeline import Timeline
from tests.executor_helpers import assert_matches_reference


@pytest.mark.parametrize(("argv", "message"), [
    (["interleaved-1f1b", "--nproc", "2", "--microbatches", "3"], "interleaved"),
    (["1f1b", "--nproc", "3", "--dp", "2"], "WORLD_SIZE(3) is not divisible by dp(2) * tp(1)"),
    (["1f1b", "--nproc", "4", "--stages", "4", "--dp", "2"], "dp(2) * pp(4) * tp(1) != WORLD_SIZE(4)"),
    (["1f1b", "--nproc", "4", "--layers", "3"], "--layers 3 is fewer than the 4 stages"),
    (["1f1b", "--nproc", "2", "--batch", "6", "--microbatches", "4"], "--batch 6 does not split into"),
    (["1f1b", "--nproc", "4", "--tp", "2", "--layers", "6"], "layers per stage [3, 3] must all be even"),
    (["1f1b", "--nproc", "2", "--layer-split", "3,3", "--layers", "8"], "layer split [3, 3] must have 2"),
])
def test_config_errors_exit_2_without_launching(argv, message, capsys):
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipesim: error: ")
    assert message in err


def test_launch_command_round_trips_the_config():
    parser = _Parser()
    add_run_args(parser)
    args = parser.parse_args(["zb-h1", "--microbatches", "8", "--dp", "2", "--model", "gpt", "--layers", "6",
                              "--layer-split", "4,2", "--steps", "5", "--lr", "0.1", "--json", "r.json"])
    cfg = config_from_args(args)
    cmd = torchrun_command(cfg, 4)
    assert cmd[:7] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "-m"]
    assert cmd[7] == "executor"
    assert config_from_args(parser.parse_args(cmd[8:])) == cfg


# V placement (rank 0 holds stages 0 and 3), split backward: exercises stage-to-stage hand-off on one rank
V_CSV = ("0F0,3F0,3I0,0I0,0F1,3F1,3I1,3W0,0I1,3W1,0W0,0W1\n"
         "1F0,2F0,2I0,1I0,2W0,1F1,2F1,2I1,1I1,1W0,1W1,2W1\n")


@pytest.mark.dist
def test_pipesim_run_from_csv_writes_result_and_measured_trace(tmp_path):
    result, trace, csv = tmp_path / "result.json", tmp_path / "measured.json", tmp_path / "v.csv"
    csv.write_text(V_CSV)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "pipesim", "run", "--from-csv", str(csv), "--nproc", "2",
                           "--microbatches", "2", "--model", "mlp", "--hidden", "16", "--layers", "4", "--batch", "8",
                           "--steps", "3", "--pg-timeout", "20", "--json", str(result), "--trace", str(trace),
                           "--save-dir", str(tmp_path / "runs")], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "v.csv step 3/3" in proc.stderr  # progress from rank 0
    assert_matches_reference(tmp_path / "runs", "v.csv", ModelConfig(kind="mlp", hidden=16, layers=4, batch=8), 3)
    data = json.loads(result.read_text())
    assert len(data["losses"]) == 3 and len(data["step_times"]) == 3
    assert data["step_time"] == statistics.median(data["step_times"][1:])
    timeline = Timeline.read(trace)
    assert timeline.source == "measured" and timeline.num_ranks == 2
    lowered = add_p2p(torch_csv.load(csv))
    for step in range(3):
        for rank, program in enumerate(lowered.programs):  # one event per action, in program order
            events = [e for e in timeline.events if e.rank == rank and e.step == step]
            assert [f"{e.stage}{e.kind}{e.microbatch}" for e in sorted(events, key=lambda e: e.start)] == [
                str(a) for a in program]
            assert all(e.end >= e.start >= 0 for e in events)
