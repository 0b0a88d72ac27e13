"""`pipesim run --slow` and `pipesim sweep --jitter`: the stretch itself (an injected clock, no timing), the config's
checks, one real launch, and the sweep's ranking under jitter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor.run_config import RunConfig, configs_from_json, configs_to_json
from executor.runtime import _stretched
from pipesim.cli import main
from tests.launch_shared import register_run


def test_stretched_sleeps_extra_times_the_action():
    now = [0]
    slept = []

    def op() -> None:
        now[0] += 4_000_000  # ns: the action takes 4 ms on the injected clock

    _stretched(op, 0.5, None, clock=lambda: now[0], pause=slept.append)
    assert slept == [0.002]


def test_slow_crosses_to_the_workers_and_is_checked():
    cfg = RunConfig(names=("1f1b",), slow_ranks=(1,), slow_factors=(1.5,))
    assert configs_from_json(configs_to_json([cfg])) == [cfg]


@pytest.mark.parametrize(("slow", "message"), [("2=1.5", "rank 2 does not exist (ranks 0-1)"),
                                               ("1=0.5", "the factor must be >= 1"),
                                               ("1=0", "the factor must be a finite number > 0"),
                                               ("x", "expected RANK=FACTOR")])
def test_run_slow_refused_before_launching(slow, message, capsys):
    assert main(["run", "1f1b", "--nproc", "2", "--microbatches", "4", "--batch", "8", "--slow", slow]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def _slowed_flags(d: Path) -> list[str]:
    return ["1f1b", "-m", "4", "--model", "mlp", "--hidden", "64", "--layers", "2", "--batch", "8", "--steps", "2",
            "--quiet", "--slow", "1=2", "--json", str(d / "r.json")]


# `pipesim run`'s flags, trained as `python -m executor` trains them, in the session's shared 2-rank launch
# (tests/launch_shared.py): no torchrun start-up of its own
SLOWED = register_run("whatif_slowed", 2, _slowed_flags)


@pytest.mark.dist
def test_a_slowed_run_says_so_in_its_result(shared_launches):
    d = shared_launches.case(SLOWED).check()
    assert json.loads((d / "r.json").read_text())["slow"] == [{"rank": 1, "factor": 2.0}]


def test_sweep_ranks_by_expected_makespan_under_jitter(capsys):
    argv = ["sweep", "--schedules", "1f1b,zb-h1", "--stages", "4", "-m", "8", "--cost", "F=1,B=2", "--jitter", "0.2",
            "--samples", "4", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == doc  # seeded: the same draws
    for row in doc["rows"]:
        w = row["what_if"]
        assert w["samples"] == 4 and w["makespan"] > 0 and w["loss_fraction"] == pytest.approx(
            w["makespan"] / row["makespan"] - 1)
    assert main(["sweep", "--schedules", "1f1b", "--stages", "4", "-m", "8", "--cost", "F=1,B=2", "--slow", "3=1.5",
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["makespan"] == 33.0 and row["what_if"]["makespan"] == pytest.approx(45.0)  # closed form, as simulate


def test_sweep_refuses_a_rank_beyond_its_smallest_pipeline(capsys):
    assert main(["sweep", "--schedules", "1f1b", "--stages", "2,4", "--cost", "F=1,B=2", "--slow", "3=2"]) == 2
    assert "pipeline rank 3 does not exist" in capsys.readouterr().err
