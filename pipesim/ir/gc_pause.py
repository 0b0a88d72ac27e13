"""Pausing Python's cyclic GC while the IR's builders and the simulator allocate.

A schedule of p=64, m=1024 is 131k action tuples and its run about 1M small acyclic objects; the
cyclic GC, triggered every 700 allocations, would rescan everything alive (torch's modules
included) again and again: with torch imported, GPipe p=64, m=1024's generation took 0.17 s with
the GC running and 0.02 s paused (2-core development VM, 2026-12-05, bench/bench_simulator.py's case).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC for the block (nested pauses keep it paused; it resumes as it was)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


__all__ = ["no_gc"]
