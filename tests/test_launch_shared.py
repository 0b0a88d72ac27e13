"""tests/launch_shared.py's bookkeeping, without a launch: which case a failure is charged to, and what the
cases after it say. (The launches themselves run in the modules that register cases.)"""

from __future__ import annotations

import pytest

from tests import launch_shared
from tests.launch_shared import BEGIN, END, Case, outcomes

CASES = [Case("first", 2, call="m:f"), Case("second", 2, call="m:f"), Case("third", 2, call="m:f")]


def _marks(root, name: str, done: tuple[int, ...] = (0, 1), failed: dict[int, str] | None = None) -> None:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for r in done:
        (folder / f"done.rank{r}").write_text("")
    for r, text in (failed or {}).items():
        (folder / f"failed.rank{r}").write_text(text)


def test_finished_cases_pass_and_carry_their_own_stderr(tmp_path):
    for c in CASES:
        _marks(tmp_path, c.name)
    stderr = "".join(f"{BEGIN}{c.name}\nline of {c.name}\n{END}{c.name}\n" for c in CASES)
    runs = outcomes(CASES, tmp_path, 0, stderr)
    assert [(n, r.finished, r.stderr) for n, r in runs.items()] == [
        ("first", True, "line of first\n"), ("second", True, "line of second\n"), ("third", True, "line of third\n")]
    assert runs["second"].check() == tmp_path / "second"


def test_a_failing_case_shows_its_ranks_errors_and_the_later_ones_name_it(tmp_path):
    _marks(tmp_path, "first")
    _marks(tmp_path, "second", done=(0,), failed={1: "AssertionError: rank 1's own check"})
    _marks(tmp_path, "third", done=())
    stderr = f"{BEGIN}first\n{END}first\n{BEGIN}second\nexecutor: rank 1 failed during F(stage 1, mb 0)\n"
    runs = outcomes(CASES, tmp_path, 1, stderr)
    assert runs["first"].finished
    second = runs["second"]
    assert not second.finished
    assert second.problem.startswith("ranks [1] did not finish it (the launch ended with exit code 1)\n"
                                     "rank 1: AssertionError: rank 1's own check\n")
    assert second.problem.endswith("executor: rank 1 failed during F(stage 1, mb 0)\n")
    assert runs["third"].problem == "not run: the 2-rank launch ended (exit code 1) in case second"
    with pytest.raises(pytest.fail.Exception, match="shared launch, case third: not run"):
        runs["third"].check()


def test_a_launch_that_fails_after_every_case_finished_fails_them_all(tmp_path):
    for c in CASES:
        _marks(tmp_path, c.name)
    marks = "".join(f"{BEGIN}{c.name}\n{END}{c.name}\n" for c in CASES)
    stderr = marks + "terminate called without an active exception\n"  # gloo at a rank's exit, after the work
    runs = outcomes(CASES, tmp_path, -6, stderr)
    for run in runs.values():
        assert not run.finished
        assert run.problem.startswith("every case finished, but the 2-rank launch ended with exit code -6\n")
        assert "terminate called" in run.problem


def test_a_launch_stopped_at_its_timeout_says_so(tmp_path):
    for c in CASES:
        _marks(tmp_path, c.name, done=())
    runs = outcomes(CASES, tmp_path, None, "torchrun's banner\n")
    assert runs["first"].problem == (f"not run: the 2-rank launch ended (no exit: stopped after "
                                     f"{launch_shared.LAUNCH_TIMEOUT:g} s) in its start-up\ntorchrun's banner\n")


def test_two_cases_of_one_name_are_refused(monkeypatch):
    monkeypatch.setattr(launch_shared, "REGISTERED", {})  # the session's own cases stay as they are
    assert launch_shared.register_call("same", 2, "m:f", 1) == "same"
    assert launch_shared.register_call("same", 2, "m:f", 1) == "same"  # a module imported twice: the same case
    with pytest.raises(ValueError, match="two shared-launch cases are named same"):
        launch_shared.register_call("same", 4, "m:f", 1)


def test_flags_pipesim_run_refuses_fail_their_case_before_any_launch(tmp_path):
    bad = Case("bad", 2, flags=lambda folder: ["1f1b", "--microbatches", "x"])
    runs = launch_shared.launch([bad], tmp_path)  # nothing left to launch: no torchrun starts
    assert runs["bad"].problem == "its pipesim run flags are refused: argument --microbatches/-m: 'x' is not an integer"
