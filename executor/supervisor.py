"""The one place that starts torchrun for pipesim: own session, signals forwarded, no orphan, one line.

`pipesim run`, `calibrate`, `validate` and `bench` (collectives, executor, late-recv) all launch ranks through
`supervise` (`run_reported` when the caller just wants an exit code):

- torchrun starts in a session (process group) of its own, its ranks in theirs (torchrun does that),
  so a terminal's Ctrl-C reaches pipesim alone, and pipesim decides what happens;
- SIGINT, SIGTERM or SIGHUP (a closed terminal or ssh session) to pipesim is forwarded to torchrun's group and to
  every rank; after `GRACE` seconds (or a second signal) whatever is left gets SIGKILL; the caller reports
  `interrupted (SIGTERM); 2 ranks stopped` and exits 128 + the signal; should pipesim itself be killed (SIGKILL, which
  it cannot catch), torchrun gets SIGTERM from the kernel (Linux's PR_SET_PDEATHSIG) and stops its ranks;
- torchrun's stderr (its banner, its "Root Cause" traceback, the ranks' warnings) goes to a log file;
  only the ranks' own one-liners (`executor: ...`, `pipesim: ...`) reach the terminal, unless `verbose`
  (executor.stderr_relay);
- with status files, a run in which no rank moves for --pg-timeout + STALL_SLACK seconds is stopped
  (a hang between peers ends sooner, at the waiting rank's process-group timeout);
- when the launch fails, the ranks' published status (executor.rank_status), the order in which they
  were seen to die (a pidfd per rank) and torchrun's exit codes make one line naming the rank that
  failed first (executor.failure_report).

(A little over 300 lines: the launch, the watch over the ranks and the signal handling share one
state machine; splitting it would spread one protocol over files.)
"""

from __future__ import annotations

import ctypes
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from executor import rank_status
from executor.failure_report import LaunchOutcome, failure_line, signal_name
from executor.stderr_relay import PROGRESS_TTY, Relay

GRACE = 5.0  # seconds from the forwarded signal to SIGKILL
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what pipesim forwards to torchrun and the ranks
PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None  # loaded before any fork


def _dies_with(parent: int):
    """torchrun's pre-exec step: SIGTERM to it when `parent` (pipesim) dies, even by SIGKILL; it then stops the
    ranks. A parent already gone before the request took effect ends the child at once."""
    def arm() -> None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)
    return arm
STALL_SLACK = 5.0  # seconds past --pg-timeout without any rank moving before the launcher stops the run
POLL = 0.05  # seconds between looks at torchrun and its ranks


@dataclass
class Outcome:
    """How a supervised launch ended: exit code, the one line to print (None on success), the signal."""

    code: int
    line: str | None = None
    signum: int | None = None  # SIGINT/SIGTERM that interrupted it


class LaunchInterrupted(Exception):  # noqa: N818 - a signal, not an error of the run
    """Raised by library callers (calibration) when the user interrupted a launch; the command prints it."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.line)
        self.outcome = outcome


@dataclass
class _Rank:
    pid: int
    rank: int
    fd: int | None  # pidfd: readable once the process has exited
    died_at: float | None = None  # monotonic seconds

    def alive(self) -> bool:
        if self.died_at is not None:
            return False
        if self.fd is not None:
            dead = bool(select.select([self.fd], [], [], 0)[0])
        else:
            dead = _state(self.pid) in (None, "Z", "X")
        if dead:
            self.died_at = time.monotonic()
        return not dead


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:][:1]


def _children(pid: int) -> list[int]:
    """Live children of `pid` (all its threads'), from /proc."""
    kids = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                kids += [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
    except OSError:
        pass
    return kids


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


@dataclass
class _Watch:
    """torchrun and the ranks it started, each seen dying at some moment."""

    proc: subprocess.Popen
    ranks: dict[int, _Rank] = field(default_factory=dict)  # by pid

    def discover(self) -> None:
        for pid in _children(self.proc.pid):
            if pid in self.ranks:
                continue
            rank = _rank_of(pid)
            if rank is None:
                continue  # not a rank yet (between fork and exec), or not one at all
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):
                fd = None
            self.ranks[pid] = _Rank(pid, rank, fd)

    def look(self, wait: float) -> None:
        """Record deaths; sleeps up to `wait` seconds, waking at the first death."""
        fds = [r.fd for r in self.ranks.values() if r.fd is not None and r.died_at is None]
        if fds and wait > 0:
            try:
                select.select(fds, [], [], wait)
            except InterruptedError:
                pass
        elif wait > 0:
            time.sleep(wait)
        for r in self.ranks.values():
            r.alive()

    def alive(self) -> list[_Rank]:
        return [r for r in self.ranks.values() if r.alive()]

    def signal_all(self, signum: int) -> None:
        """torchrun's process group (while it is not reaped: its pid is still its own) and each live rank."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signum)  # torchrun leads its own group
            except OSError:
                pass
        for r in self.alive():
            try:
                if r.fd is not None:
                    signal.pidfd_send_signal(r.fd, signum)  # never a recycled pid
                else:
                    os.kill(r.pid, signum)
            except OSError:
                pass

    def close(self) -> None:
        for r in self.ranks.values():
            if r.fd is not None:
                os.close(r.fd)
                r.fd = None


_TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def torchrun_exit_codes(log_text: str) -> dict[int, int]:
    """rank -> exit code from torchrun's failure summary (negative: killed by that signal)."""
    return {int(rank): int(code) for rank, code in _TORCHRUN_FAILURE.findall(log_text)}


def supervise(cmd: list[str], env: dict[str, str], log_path: Path, *, status_dir: Path | None = None,
              verbose: bool = False, echo: bool = True, stdout_to_log: bool = False,
              pg_timeout: float | None = None, timeout: float | None = None) -> Outcome:
    """Run torchrun (`cmd`) to its end, or to a signal; see the module docstring. Appends to `log_path`."""
    env = dict(env)
    if status_dir is not None:
        env[rank_status.ENV] = str(status_dir)
    if echo and sys.stderr.isatty():
        env.setdefault(PROGRESS_TTY, "1")
        env.setdefault("COLUMNS", str(shutil.get_terminal_size().columns))
    received: list[int] = []
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {}
    if main_thread:
        for signum in FORWARDED:
            previous[signum] = signal.signal(signum, lambda s, _f: received.append(s))
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log if stdout_to_log else None,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    preexec_fn=_dies_with(os.getpid()) if _LIBC is not None else None)
            relay = Relay(proc.stderr, log, echo=echo, verbose=verbose)
            relay.start()
            watch = _Watch(proc)
            try:
                outcome = _follow(watch, received, timeout, _Stall(status_dir, pg_timeout))
            finally:
                if watch.alive() or proc.poll() is None:  # an error of ours, or ranks orphaned: none left behind
                    watch.signal_all(signal.SIGKILL)
                proc.wait()
                relay.join(timeout=5.0)
                watch.close()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    stalled = outcome is not None and outcome.line == "stalled"
    if outcome is not None and not stalled:
        return outcome
    if proc.returncode == 0 and not stalled:
        return Outcome(0)
    reports = rank_status.read_reports(status_dir) if status_dir is not None else {}
    codes = torchrun_exit_codes(log_path.read_text(errors="replace"))
    died = {r.rank: r.died_at for r in watch.ranks.values() if r.died_at is not None}
    if status_dir is None:  # a worker that publishes nothing: name what torchrun saw fail
        reports = {rank: rank_status.RankReport(rank, doing="its run") for rank in codes}
    outcome = LaunchOutcome(reports, died, codes, proc.returncode, pg_timeout, stalled=stalled)
    return Outcome(proc.returncode if proc.returncode > 0 else 1, failure_line(outcome, str(log_path)))


class _Stall:
    """The launcher's own hang check: no rank has moved (its status counter) for `limit` seconds while
    training. A hang between peers ends sooner, at the process-group timeout of the rank waiting on it;
    this catches what no receive waits on (a world of one, every rank stuck in compute)."""

    def __init__(self, folder: Path | None, pg_timeout: float | None) -> None:
        self.folder = folder
        self.limit = None if folder is None or pg_timeout is None else pg_timeout + STALL_SLACK  # seconds
        self.seen: dict[int, tuple[int, float]] = {}  # rank -> (seq, monotonic seconds it last changed)
        self.next_look = 0.0

    def stalled(self, ranks: int) -> bool:
        now = time.monotonic()
        if self.limit is None or now < self.next_look:
            return False
        self.next_look = now + 1.0
        reports = rank_status.read_reports(self.folder)
        for rank, rep in reports.items():
            if self.seen.get(rank, (None,))[0] != rep.seq:
                self.seen[rank] = (rep.seq, now)
        training = [r for r in reports.values() if r.state != rank_status.DONE and r.label != "start-up"]
        return (bool(training) and len(reports) >= ranks > 0
                and all(now - self.seen[r][1] > self.limit for r in reports))


def _follow(watch: _Watch, received: list[int], timeout: float | None, stall: _Stall) -> Outcome | None:
    """Wait for torchrun's end (None), or handle a signal, the timeout or a stall (their Outcome)."""
    start = time.monotonic()
    while True:
        watch.discover()
        watch.look(POLL)
        if received:
            return _stop(watch, received)
        if watch.proc.poll() is not None:
            return None
        if timeout is not None and time.monotonic() - start > timeout:
            watch.signal_all(signal.SIGKILL)
            return Outcome(124, f"the ranks did not finish within {timeout:g} s; stopped them")
        if stall.stalled(len(watch.ranks)):
            watch.signal_all(signal.SIGKILL)
            return Outcome(1, "stalled")  # supervise names the hung rank


def _stop(watch: _Watch, received: list[int]) -> Outcome:
    """Forward the first signal; after GRACE seconds (or a second signal) SIGKILL what is left."""
    signum = received[0]
    watch.discover()
    before = len(watch.alive())
    watch.signal_all(signum)
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline and len(received) == 1:
        watch.discover()
        watch.look(POLL)
        if watch.proc.poll() is not None and not watch.alive():
            break
    if watch.proc.poll() is None or watch.alive():
        watch.signal_all(signal.SIGKILL)
        end = time.monotonic() + GRACE
        while time.monotonic() < end and watch.alive():
            watch.look(POLL)
    left = len(watch.alive())
    stopped = before - left
    line = f"interrupted ({signal_name(signum)}); {stopped} rank{'s' if stopped != 1 else ''} stopped"
    if left:
        line += f", {left} still running (pids {' '.join(str(r.pid) for r in watch.alive())})"
    return Outcome(128 + signum, line, signum)


def interruptible(command):
    """Wrap a command's `run(args)`: a LaunchInterrupted deep inside (calibration) ends it with its one line
    and exit code 128 + the signal, as `pipesim run` does."""

    def run(args):
        try:
            return command(args)
        except LaunchInterrupted as stop:
            sys.stdout.flush()
            print(f"pipesim: {stop.outcome.line}", file=sys.stderr, flush=True)
            return stop.outcome.code

    run.__doc__ = command.__doc__
    return run


def run_reported(cmd: list[str], env: dict[str, str], *, prefix: str = "pipesim-launch-", stdout_to_log: bool = False,
                 timeout: float | None = None, publish_status: bool = False, verbose: bool = False,
                 pg_timeout: float | None = None) -> int:
    """`supervise` a torchrun command whose caller just wants an exit code: a failure or a signal ends in one
    `pipesim:` line on stderr; torchrun's output goes to a log in a temporary folder, kept only after a failure.
    `publish_status`: the ranks publish their actions there (executor.rank_status), for the failure line."""
    rundir = Path(tempfile.mkdtemp(prefix=prefix))
    outcome = supervise(cmd, env, rundir / "torchrun.log", status_dir=rundir if publish_status else None,
                        verbose=verbose, stdout_to_log=stdout_to_log, pg_timeout=pg_timeout, timeout=timeout)
    if outcome.line is None or outcome.signum is not None:  # a success, or the user stopped it: no log to keep
        shutil.rmtree(rundir, ignore_errors=True)
    if outcome.line is not None:
        sys.stdout.flush()
        print(f"pipesim: {outcome.line}", file=sys.stderr, flush=True)
    return outcome.code
