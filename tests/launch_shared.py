"""One torchrun launch per world size for the distributed cases of several test modules.

Starting torchrun and importing torch in every rank costs ~8 s for 2 ranks and ~12 s for 4 on the 2-core
VM (measured 2026-12-03, a rank that only joins a gloo group); paid once per world size here, not once per
test module. A module registers its cases at import (`register_run`: `pipesim run` flags, `register_call`: a
function every rank calls); pytest imports every collected module before any test runs, so the first test
that asks for a case (`SharedLaunches.case`, the session fixture `shared_launches` in tests/conftest.py)
launches every case registered for that world size, in registration order, one gloo process group for all
(tests/workers/shared_ranks.py). Running one file alone launches that file's cases only.

Each case writes into its own folder and each rank marks it done or failed there. A failing case ends the
launch: the cases before it keep their results, the failing one shows its ranks' errors and its part of
the launch's stderr, and the ones after it say which case stopped the launch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from executor.launch import rank_environment
from executor.run_config import configs_to_json
from pipesim.commands.run_args import add_run_args, configs_from_args
from pipesim.errors import PipesimError

ROOT = Path(__file__).parent.parent
WORKER = "tests.workers.shared_ranks"  # run with `-m` from ROOT
PG_TIMEOUT = 20.0  # seconds: the process group's timeout, as the modules' own launches set it (--pg-timeout 20)
LAUNCH_TIMEOUT = 270.0  # seconds for one launch, all its cases: under pytest-timeout's 300 s, so the ranks are stopped
TAIL = 3000  # characters of stderr shown with a failure
BEGIN, END = "shared-launch: begin ", "shared-launch: end "  # rank 0's stderr lines around each case


@dataclass(frozen=True)
class Case:
    """One module's distributed work: `pipesim run` flags (a `--then` chain) or a function every rank calls."""

    name: str
    world: int  # ranks
    flags: Callable[[Path], list[str]] | None = None  # the case's folder -> `pipesim run` flags without --nproc
    call: str | None = None  # "module:function", called on every rank as function(folder, *args)
    args: tuple = ()  # JSON values


REGISTERED: dict[str, Case] = {}


def register_run(name: str, world: int, flags: Callable[[Path], list[str]]) -> str:
    """A chain of `pipesim run` configurations (flags given the case's folder), run as `python -m executor` runs it,
    in the launch's gloo group (its timeout is PG_TIMEOUT, whatever --pg-timeout says)."""
    return _register(Case(name, world, flags=flags))


def register_call(name: str, world: int, call: str, *args) -> str:
    """`call(folder, *args)` on every rank, inside the launch's process group (the default group)."""
    return _register(Case(name, world, call=call, args=args))


def _register(case: Case) -> str:
    if REGISTERED.get(case.name, case) != case:
        raise ValueError(f"two shared-launch cases are named {case.name}")
    REGISTERED[case.name] = case
    return case.name


@dataclass(frozen=True)
class CaseRun:
    """What one case left: its folder, its part of the launch's stderr, and whether every rank finished it."""

    name: str
    folder: Path
    stderr: str  # rank 0's lines between the case's markers, and whatever other ranks wrote meanwhile
    finished: bool
    problem: str  # why not finished (empty when finished)

    def check(self) -> Path:
        """The case's folder; fails the test, naming the case, unless every rank finished it."""
        if not self.finished:
            pytest.fail(f"shared launch, case {self.name}: {self.problem}", pytrace=False)
        return self.folder


@dataclass
class SharedLaunches:
    """The session's launches: each registered case runs once, in the first launch of its world size that a test
    asks for after the case was registered."""

    root: Path
    runs: dict[str, CaseRun] = field(default_factory=dict)

    def case(self, name: str) -> CaseRun:
        if name not in self.runs:
            world = REGISTERED[name].world
            pending = [c for c in REGISTERED.values() if c.world == world and c.name not in self.runs]
            self.runs.update(launch(pending, self.root / f"launch{len(self.runs)}-{world}ranks"))
        return self.runs[name]


def launch(cases: list[Case], root: Path) -> dict[str, CaseRun]:
    """One torchrun launch running `cases` (all of one world size) in order; a CaseRun per case."""
    world = cases[0].world
    specs, refused = [], {}
    for case in cases:
        folder = root / case.name
        folder.mkdir(parents=True)
        spec = {"name": case.name, "folder": str(folder), "call": case.call, "args": list(case.args)}
        if case.flags is not None:  # parsed here, as `pipesim run` parses them
            try:
                spec["configs"] = configs_to_json(configs_from_args(_run_parser().parse_args(case.flags(folder))))
            except PipesimError as exc:
                refused[case.name] = CaseRun(case.name, folder, "", False, f"its pipesim run flags are refused: {exc}")
                continue
        specs.append(spec)
    launched = [c for c in cases if c.name not in refused]
    if not launched:
        return refused
    spec_path = root / "cases.json"
    spec_path.write_text(json.dumps({"pg_timeout": PG_TIMEOUT, "cases": specs}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", "-m", WORKER,
           str(spec_path)]
    code, stderr = _run(cmd)
    return {**refused, **outcomes(launched, root, code, stderr)}


class _FlagParser(argparse.ArgumentParser):
    """`pipesim run`'s flags (add_run_args); a mistake is a PipesimError, not an exit of pytest's process."""

    def error(self, message: str):
        raise PipesimError(message)


def _run_parser() -> argparse.ArgumentParser:
    parser = _FlagParser(prog="pipesim run", add_help=False)
    add_run_args(parser)
    return parser


def _run(cmd: list[str]) -> tuple[int | None, str]:
    """torchrun's exit code (None: stopped at LAUNCH_TIMEOUT) and stderr; its ranks leave with it."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=rank_environment(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=LAUNCH_TIMEOUT)
        return proc.returncode, stderr
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # torchrun stops its ranks (they run in sessions of their own)
        try:
            _, stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
        return None, stderr


def outcomes(cases: list[Case], root: Path, code: int | None, stderr: str) -> dict[str, CaseRun]:
    """Each case's CaseRun from its folder's marks, torchrun's exit code (None: stopped) and its stderr."""
    world = cases[0].world
    runs = {c.name: _outcome(c, root / c.name, world, code, stderr, cases) for c in cases}
    if code != 0 and all(r.finished for r in runs.values()):  # e.g. a crash in the group's teardown: not hidden
        why = f"every case finished, but the {world}-rank launch ended with {_how(code)}\n{stderr[-TAIL:]}"
        runs = {n: CaseRun(n, r.folder, r.stderr, False, why) for n, r in runs.items()}
    return runs


def _outcome(case: Case, folder: Path, world: int, code: int | None, stderr: str, cases: list[Case]) -> CaseRun:
    part = _section(stderr, case.name)
    done = [(folder / f"done.rank{r}").exists() for r in range(world)]
    if all(done):
        return CaseRun(case.name, folder, part, True, "")
    if BEGIN + case.name + "\n" not in stderr:
        started = [c.name for c in cases if BEGIN + c.name + "\n" in stderr]
        stopper = f"case {started[-1]}" if started else f"its start-up\n{stderr[-TAIL:]}"
        return CaseRun(case.name, folder, part, False,
                       f"not run: the {world}-rank launch ended ({_how(code)}) in {stopper}")
    errors = [f"rank {r}: {p.read_text().strip()}" for r in range(world) if (p := folder / f"failed.rank{r}").exists()]
    unfinished = [r for r in range(world) if not done[r]]
    return CaseRun(case.name, folder, part, False, "\n".join(
        [f"ranks {unfinished} did not finish it (the launch ended with {_how(code)})", *errors,
         "--- the launch's stderr from the case's start ---", part[-TAIL:]]))


def _how(code: int | None) -> str:
    return f"no exit: stopped after {LAUNCH_TIMEOUT:g} s" if code is None else f"exit code {code}"


def _section(stderr: str, name: str) -> str:
    """The lines between rank 0's markers of case `name` (to the end when it has no end marker)."""
    start = stderr.find(BEGIN + name + "\n")
    if start < 0:
        return ""
    start += len(BEGIN + name + "\n")
    end = stderr.find(END + name + "\n", start)
    return stderr[start:] if end < 0 else stderr[start:end]
