"""torchrun's stderr on its way out: all of it to a log file, the ranks' own lines to the terminal.

torchrun and the ranks share one stderr (the supervisor's pipe). Its banner, its failure summary
and Python tracebacks belong in the log; the ranks' one-liners (`executor: ...`, `pipesim: ...`)
and rank 0's progress bar belong on the terminal. Rank 0 learns through PROGRESS_TTY that its
piped stderr ends on a terminal, and draws a bar whose \r redraws pass through here.
"""

from __future__ import annotations

import os
import sys
import threading

FORWARDED = (b"executor:", b"pipesim:")  # rank lines shown on the terminal; the rest goes to the log
PROGRESS_TTY = "PIPESIM_PROGRESS_TTY"  # tells rank 0 that its (piped) stderr ends on a terminal


class LineFilter:
    """Which bytes of the ranks' stderr reach the terminal: lines that start with one of FORWARDED.

    Pieces end at \n or \r (a progress bar redraws its line after \r); a piece split across reads
    is decided as soon as its start is long enough to tell.
    """

    def __init__(self) -> None:
        self.pending = b""
        self.showing: bool | None = None  # the decision for a piece already partly passed (None: at a start)
        self.last = False  # whether the previous piece was shown (a bare \r or \n goes with it)

    def feed(self, chunk: bytes) -> bytes:
        self.pending += chunk
        shown = b""
        while self.pending:
            ends = [i for i in (self.pending.find(b"\n"), self.pending.find(b"\r")) if i >= 0]
            cut = min(ends) if ends else -1
            piece = self.pending if cut < 0 else self.pending[:cut + 1]
            show = self.showing
            if show is None:
                head = piece.lstrip(b"\r")
                if cut >= 0 and not head.strip(b"\r\n"):
                    show = self.last
                elif cut >= 0 or len(head) >= max(map(len, FORWARDED)):
                    show = head.startswith(FORWARDED)
                else:
                    break  # too short to decide yet
            if show:
                shown += piece
            self.last = show
            self.showing = None if cut >= 0 else show
            self.pending = self.pending[len(piece):]
        return shown


class Relay(threading.Thread):
    """torchrun's stderr: all of it to the log, the ranks' one-liners (or, verbose, all) to our stderr."""

    def __init__(self, pipe, log, *, echo: bool, verbose: bool) -> None:
        super().__init__(name="torchrun-stderr", daemon=True)
        self.pipe, self.log, self.echo, self.verbose = pipe, log, echo, verbose
        self.out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        self.filter = LineFilter()

    def _show(self, data: bytes) -> None:
        if self.out is None:
            sys.stderr.write(data.decode(errors="replace"))
            sys.stderr.flush()
        else:
            self.out.write(data)
            self.out.flush()

    def run(self) -> None:
        fd = self.pipe.fileno()
        while chunk := os.read(fd, 65536):
            self.log.write(chunk)
            self.log.flush()
            if self.echo:
                shown = chunk if self.verbose else self.filter.feed(chunk)
                if shown:
                    self._show(shown)
