"""User-facing errors: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations


class PipesimError(Exception):
    """A mistake in the user's input (names, sizes, files); never a bug in pipesim."""


class ScheduleError(PipesimError):
    """A schedule that is malformed or would deadlock; `grid` marks the offending actions."""

    def __init__(self, message: str, grid: str = "") -> None:
        super().__init__(message)
        self.grid = grid
