"""`pipesim plan --jitter`: the shown rows re-ranked by their expected step under a stated jitter, each draw the
simulation `pipesim simulate --jitter` runs (pipesim.plan.jitter)."""

from __future__ import annotations

import json
import shlex
import statistics

from pipesim.cli import main

SMALL = ["--model", "gpt", "--hidden", "512", "--layers", "8", "--heads", "8", "--seq", "512", "--vocab", "8000",
         "--batch", "16", "--dtype", "bfloat16", "--hardware", "dgx-h100", "--gpus", "4",
         "--schedules", "1f1b,interleaved-1f1b,zb-h1,dualpipev"]


def _simulate_step(capsys, argv: list[str], seed: int) -> float:
    assert main(argv + ["--jitter", "0.2", "--jitter-seed", str(seed), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["what_if"]["step_time"]


def test_rows_rank_by_the_mean_of_the_draws_simulate_runs(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", *SMALL, "--top", "6", "--jitter", "0.2", "--samples", "8",
                 "--json", str(out)]) == 0
    capsys.readouterr()
    data = json.loads(out.read_text())
    rows = data["rows"]
    expected = [r["expected_step_time"] for r in rows]
    assert expected == sorted(expected) and all(r["expected_step_std"] > 0 for r in rows)
    assert [r["step_time"] for r in rows] != sorted(r["step_time"] for r in rows)  # the jitter changed the order
    argv = shlex.split(data["winner"]["simulate_command"])[1:]  # the winner is the expected step's
    draws = [_simulate_step(capsys, argv, seed) for seed in range(8)]  # --jitter-seed 0: seeds 0 .. 7
    assert rows[0]["expected_step_time"] == statistics.fmean(draws)
    assert rows[0]["expected_step_std"] == statistics.pstdev(draws)
    assert "expected under jitter" in rows[1]["why"]


def test_jitter_flags_are_refused_in_one_line(capsys):
    for extra, message in ((["--jitter", "0"], "--jitter must be a sigma > 0"),
                           (["--jitter", "-0.1"], "--jitter must be a sigma > 0"),
                           (["--samples", "4"], "--samples needs --jitter SIGMA"),
                           (["--jitter-seed", "2"], "--jitter-seed needs --jitter SIGMA")):
        assert main(["plan", *SMALL, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
