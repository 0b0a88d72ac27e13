"""Shared test helpers."""

from __future__ import annotations

import os
import socket

os.environ.setdefault("OMP_NUM_THREADS", "1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
