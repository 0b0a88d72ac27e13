"""Failure handling: a failing rank names itself and the action it was in, then exits non-zero.

Never a hang: a rank whose peer died gets a connection error or, at worst, the process-group
timeout (`--pg-timeout`) in its blocked receive; torchrun then stops the remaining ranks, and
`pipesim run` names the rank that failed first (executor.failure_report).
"""

from __future__ import annotations

import os
import signal
import sys
import time

from executor import rank_status
from pipesim.ir.schedule import Action


def failure_message(rank: int, where: Action | str, exc: BaseException) -> str:
    """`rank 1 failed during F(stage 1, mb 3): RuntimeError: injected fault` (one line)."""
    place = where.describe() if isinstance(where, Action) else where
    text = str(exc).strip().splitlines()
    detail = text[0] if text else ""
    return f"rank {rank} failed during {place}: {type(exc).__name__}: {detail}"


def die(rank: int, where: Action | str, exc: BaseException) -> None:
    """Print the one-line failure and leave at once (no process-group teardown, which could block).

    Under `pipesim run` the rank also leaves the failure in its error file for the launcher's line.
    """
    status = rank_status.current()
    if status is not None:
        try:
            status.fail(where.describe() if isinstance(where, Action) else where, exc)
        except OSError:
            pass  # the launcher still has the exit status; the message below goes to its log
    sys.stdout.flush()
    sys.stderr.write(f"executor: {failure_message(rank, where, exc)}\n")
    sys.stderr.flush()
    os._exit(1)


def inject(mode: str, rank: int, action: Action) -> None:
    """The fault `--fail-mode` asks for, at `action` (tests)."""
    if mode == "kill":
        sys.stderr.write(f"executor: rank {rank} kills itself (SIGKILL) at {action.describe()}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        sys.stderr.write(f"executor: rank {rank} hangs at {action.describe()}\n")
        sys.stderr.flush()
        time.sleep(3600.0)
    raise RuntimeError(f"injected fault at {action}")
