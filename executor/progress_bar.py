"""Rank 0's progress over a schedule's steps: a tqdm bar on a terminal, one plain line per step otherwise.

A bar is unreadable in a log file or a captured pipe, so off a TTY (as `pipesim run`'s launcher tells
the ranks, their stderr being its pipe) each step prints one line
(`executor: 1f1b step 2/4  0.0123 s (rank 0)`); `--quiet` silences both.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from tqdm import tqdm

from executor.stderr_relay import PROGRESS_TTY


class Progress:
    """Callable `(step, seconds)` after every step; `close()` when the schedule is done."""

    def __init__(self, label: str, steps: int, stream: TextIO | None = None) -> None:
        self.label, self.steps = label, steps
        self.stream = stream if stream is not None else sys.stderr
        self.bar = None
        # under `pipesim run` stderr is a pipe to the launcher, which says whether it ends on a terminal
        if self.stream.isatty() or (stream is None and os.environ.get(PROGRESS_TTY) == "1"):
            self.bar = tqdm(total=steps, desc=f"executor: {label}", unit="step", file=self.stream, leave=True,
                            dynamic_ncols=True)

    def __call__(self, step: int, seconds: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{seconds:.4f} s/step", refresh=False)
            self.bar.update(1)
            return
        print(f"executor: {self.label} step {step + 1}/{self.steps}  {seconds:.4f} s (rank 0)", file=self.stream,
              flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
