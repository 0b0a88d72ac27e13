"""What each rank is doing, published for the launcher: a small memory-mapped file per rank.

`pipesim run` (executor.supervisor) creates a run directory and names it in PIPESIM_STATUS_DIR; each
rank then keeps `rank{R}.status` up to date (step, current action, waiting or computing) and, when
it fails, writes `rank{R}.error` (the exception, one line) before it leaves. The status is a write
into a shared file mapping, no system call, so the hot loop pays about a microsecond per action
(measured on the 2-core VM); the page cache keeps it readable after the rank is killed. Without the
variable (a launcher of your own) nothing is published. No torch here: the launcher reads it too.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "PIPESIM_STATUS_DIR"
# layout: seq (int64, bumped at every update), step (int32, 0-based; -1 before the first),
# state (int32), label (64 bytes: the schedule), doing (128 bytes: the action or phase), UTF-8, NUL-padded
_HEAD = struct.Struct("<qii")
LABEL_AT, LABEL_LEN = _HEAD.size, 64
DOING_AT, DOING_LEN = LABEL_AT + LABEL_LEN, 128
SIZE = DOING_AT + DOING_LEN  # bytes
SETUP, BUSY, DONE, WAITING = 0, 1, 2, 3  # states; WAITING: blocked on peers (P2P, a collective)
STATE_NAMES = {SETUP: "setup", BUSY: "busy", DONE: "done", WAITING: "waiting"}


def _fixed(text: str, length: int) -> bytes:
    raw = text.encode()[:length]
    return raw + b"\0" * (length - len(raw))


def status_path(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.status"


def error_path(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.error"


class RankStatus:
    """This rank's status file; `doing(step, text)` is the hot-loop update (text from `encode`)."""

    def __init__(self, folder: Path, rank: int) -> None:
        self.folder, self.rank = folder, rank
        self.seq = 0
        fd = os.open(status_path(folder, rank), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, SIZE)
            self.map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self.set_label("start-up")
        self.phase(-1, "start-up", SETUP)

    @staticmethod
    def encode(text: str) -> bytes:
        """The fixed-size bytes `doing` writes (build them once, outside the hot loop)."""
        return _fixed(text, DOING_LEN)

    def set_label(self, label: str) -> None:
        self.map[LABEL_AT:LABEL_AT + LABEL_LEN] = _fixed(label, LABEL_LEN)

    def doing(self, step: int, text: bytes, state: int = BUSY) -> None:
        self.map[DOING_AT:SIZE] = text
        self.seq += 1
        _HEAD.pack_into(self.map, 0, self.seq, step, state)

    def phase(self, step: int, text: str, state: int = BUSY) -> None:
        self.doing(step, self.encode(text), state)

    def fail(self, where: str, exc: BaseException) -> None:
        """The error file: written once, just before the rank leaves (executor.faults.die)."""
        lines = str(exc).strip().splitlines()
        data = {"time": time.time(), "where": where, "type": type(exc).__name__, "message": lines[0] if lines else ""}
        tmp = error_path(self.folder, self.rank).with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, error_path(self.folder, self.rank))


_current: RankStatus | None = None


def open_from_env(rank: int) -> RankStatus | None:
    """This rank's status when the launcher asked for one (PIPESIM_STATUS_DIR), else None."""
    global _current
    folder = os.environ.get(ENV)
    if folder and _current is None:
        try:
            _current = RankStatus(Path(folder), rank)
        except OSError:
            _current = None  # a status is a courtesy to the launcher, never a reason to fail the run
    return _current


def current() -> RankStatus | None:
    return _current


@dataclass
class RankReport:
    """What the launcher reads back about one rank after the run."""

    rank: int
    seq: int = 0
    step: int = -1  # 0-based; -1: before the first step
    state: int = SETUP
    label: str = ""
    doing: str = "start-up"
    error: dict | None = None  # {"time", "where", "type", "message"} when the rank raised

    @property
    def waiting(self) -> bool:
        return self.state == WAITING


def read_reports(folder: Path) -> dict[int, RankReport]:
    """Every rank that opened a status file in `folder`, by global rank."""
    reports = {}
    for path in folder.glob("rank*.status"):
        try:
            rank = int(path.stem[4:])
            raw = path.read_bytes()
        except (ValueError, OSError):
            continue
        rep = RankReport(rank)
        if len(raw) >= SIZE:
            rep.seq, rep.step, rep.state = _HEAD.unpack_from(raw, 0)
            rep.label = raw[LABEL_AT:LABEL_AT + LABEL_LEN].rstrip(b"\0").decode(errors="replace")
            rep.doing = raw[DOING_AT:SIZE].rstrip(b"\0").decode(errors="replace")
        err = error_path(folder, rank)
        if err.is_file():
            try:
                rep.error = json.loads(err.read_text())
            except (OSError, ValueError):
                rep.error = None
        reports[rank] = rep
    return reports
