"""The one line a failed launch ends with: which rank failed first, doing what, and how.

Pure: it reads what the supervisor gathered (each rank's published status and error file, when
each rank was seen to die, the exit codes torchrun reported) and names the root cause:

1. a rank that raised an error of its own (not a peer's loss or a timeout): the earliest;
2. a timeout (or the launcher's stall check): the rank that was not waiting on anyone, i.e. it hung;
3. a rank that died without a word (killed by a signal, or an exit of its own): the first seen dead;
4. otherwise the first rank that stopped waiting on a peer.

The other ranks follow, each with what it was doing when it stopped.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

from executor.rank_status import DONE, RankReport

_PEER_LOSS = re.compile(r"connection (closed|reset|refused)|broken pipe|by peer|pair closure|ECONNRESET|aborted|"
                        r"socket closed|end of file", re.IGNORECASE)  # gloo's and NCCL's words for a lost peer
_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)
MAX_OTHERS = 3  # ranks named after the first; the rest are counted


@dataclass
class LaunchOutcome:
    """Everything known after a failed launch."""

    reports: dict[int, RankReport]  # by global rank, from the status files
    died_at: dict[int, float] = field(default_factory=dict)  # rank -> monotonic seconds it was seen dead
    exit_codes: dict[int, int] = field(default_factory=dict)  # rank -> torchrun's exitcode (-N: signal N)
    torchrun_code: int = 1
    pg_timeout: float | None = None  # seconds
    stalled: bool = False  # the launcher stopped the run: no rank had moved for --pg-timeout plus a slack


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _is_timeout(rep: RankReport) -> bool:
    return rep.error is not None and bool(_TIMEOUT.search(rep.error.get("message", "")))


def _is_peer_loss(rep: RankReport) -> bool:
    """An error that only says a peer went away or did not answer: a consequence, not a cause."""
    if rep.error is None:
        return False
    text = f"{rep.error.get('type', '')}: {rep.error.get('message', '')}"
    return bool(_PEER_LOSS.search(text)) or bool(_TIMEOUT.search(text))


def _place(rep: RankReport) -> str:
    """`F(stage 1, mb 3) of step 4 of 1f1b` (steps 1-based, as the progress lines count them)."""
    where = rep.error["where"] if rep.error and rep.error.get("where") else rep.doing
    text = where
    if rep.step >= 0:
        text += f" of step {rep.step + 1}"
    if rep.label and rep.label != "start-up":
        text += f" of {rep.label}"
    return text


def _how(rep: RankReport, outcome: LaunchOutcome, *, hung: bool) -> str:
    if hung:
        limit = f" in --pg-timeout {outcome.pg_timeout:g} s" if outcome.pg_timeout is not None else ""
        return f"hung (no progress{limit})"
    if rep.error is not None and not _is_peer_loss(rep):
        detail = rep.error.get("message", "")
        return f"raised {rep.error.get('type', 'an error')}" + (f" ({detail})" if detail else "")
    code = outcome.exit_codes.get(rep.rank)
    if code is not None and code < 0:
        return f"was killed ({signal_name(-code)})"
    if code is not None and code > 0:
        return f"exited with code {code}"
    return "died (killed, or exited without a word)"


def _other(rep: RankReport, first: RankReport) -> str:
    """What another rank was doing when it stopped; its step and schedule only where they differ."""
    where = rep.error["where"] if rep.error and rep.error.get("where") else rep.doing
    if (rep.step, rep.label) != (first.step, first.label):
        where = _place(rep)
    if _is_timeout(rep):
        return f"rank {rep.rank} timed out waiting on {where}"
    if rep.waiting:
        return f"rank {rep.rank} stopped waiting on {where}"
    return f"rank {rep.rank} stopped during {where}"


def first_failure(outcome: LaunchOutcome) -> tuple[int, bool] | None:
    """(rank, hung) of the root cause, or None when no rank left a trace."""
    reps = outcome.reports
    failed = [r for r in reps.values() if r.state != DONE]
    raised = [r for r in failed if r.error is not None and not _is_peer_loss(r)]
    if raised:
        return min(raised, key=lambda r: (r.error.get("time", 0.0), r.rank)).rank, False
    if outcome.stalled or any(_is_timeout(r) for r in failed):
        stuck = [r for r in failed if r.error is None and not r.waiting]
        if stuck:
            return min(stuck, key=lambda r: r.rank).rank, True
        if outcome.stalled and failed:
            return min(failed, key=lambda r: r.rank).rank, True
    silent = [r for r in failed if r.error is None]
    if silent:
        never = float("inf")  # not seen dying: after every rank that was
        first = min(silent, key=lambda r: (outcome.died_at.get(r.rank, never),
                                           outcome.exit_codes.get(r.rank) == -signal.SIGTERM, r.rank))
        return first.rank, False
    errored = [r for r in failed if r.error is not None]
    if errored:
        return min(errored, key=lambda r: (r.error.get("time", 0.0), r.rank)).rank, False
    return None


def failure_line(outcome: LaunchOutcome, log: str | None) -> str:
    """`rank 1 was killed (SIGKILL) during F(stage 1, mb 3) of step 4 of 1f1b; rank 0 stopped waiting on ...`."""
    found = first_failure(outcome)
    tail = f"; torchrun's output: {log}" if log else ""
    if found is None:
        return f"the ranks failed (torchrun exited with code {outcome.torchrun_code}){tail}"
    rank, hung = found
    rep = outcome.reports[rank]
    parts = [f"rank {rank} {_how(rep, outcome, hung=hung)} during {_place(rep)}"]
    others = [r for r in sorted(outcome.reports.values(), key=lambda r: r.rank)
              if r.rank != rank and r.state != DONE]
    parts += [_other(r, rep) for r in others[:MAX_OTHERS]]
    if len(others) > MAX_OTHERS:
        parts.append(f"{len(others) - MAX_OTHERS} more ranks stopped")
    return "; ".join(parts) + tail
