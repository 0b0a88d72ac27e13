"""User-facing errors: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations

import json
from pathlib import Path


class PipesimError(Exception):
    """A mistake in the user's input (names, sizes, files); never a bug in pipesim."""


class ScheduleError(PipesimError):
    """A schedule that is malformed or would deadlock; `grid` marks the offending actions."""

    def __init__(self, message: str, grid: str = "") -> None:
        super().__init__(message)
        self.grid = grid


def refuse_special_file(path: str | Path, what: str) -> None:
    """A file the user names for reading that exists but is neither a regular file nor a folder (/dev/zero, a pipe)
    would be read forever or block: refused, as `what` (the flag and path, or the file's role)."""
    p = Path(path)
    if p.exists() and not p.is_file() and not p.is_dir():
        raise PipesimError(f"{what} is not a regular file")


def parse_json(text: str | bytes) -> object:
    """json.loads with Python parser's limits raised as the ValueError every reader refuses (with bad JSON and an
    over-long integer): a nesting deeper than its recursion goes."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("its JSON nests deeper than Python's parser goes") from None
