"""The simulator's discrete-event clocks: callbacks at absolute times, run in (time, posting) order.

Two clocks with one interface (`now`, `at`, `after`, `next_time`, `run`). `SimpyClock` runs on
SimPy's public API and is the reference; `HeapClock`, a plain heap with the same semantics, is
what `simulate` uses by default because it is faster (bench/bench_simulator.py: SimPy's
per-event `Timeout` objects cost about a third more time at p=64, m=1024); tests check that both
give the same results bit for bit. SimPy schedules by delay (an event fires at `now + delay`),
and `now + (t - now)` can round an absolute time t off by one unit in the last place, so each
SimPy event carries its exact time as its value and `SimpyClock.now` is read from there: ranks
wake at their exact completion times (a compute's end, a message's arrival).
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from itertools import count

import simpy

INF = float("inf")


class HeapClock:
    """Simulated time in seconds and the events still to run, in a heap of (time, order, callback)."""

    __slots__ = ("now", "_pending", "_order")

    def __init__(self) -> None:
        self.now = 0.0  # seconds
        self._pending: list[tuple[float, int, Callable[[], None]]] = []
        self._order = count()  # ties run in the order they were posted, as SimPy's queue does

    def at(self, when: float, callback: Callable[[], None]) -> None:
        """Call `callback()` at time `when` (>= now)."""
        heappush(self._pending, (when, next(self._order), callback))

    def after(self, delay: float, callback: Callable[[], None]) -> None:
        """Call `callback()` `delay` seconds from now."""
        heappush(self._pending, (self.now + delay, next(self._order), callback))

    def next_time(self) -> float:
        """Time of the next event (infinity when none is left)."""
        pending = self._pending
        return pending[0][0] if pending else INF

    def run(self) -> None:
        """Run every event, earliest first, until none is left."""
        pending = self._pending
        while pending:
            when, _, callback = heappop(pending)
            self.now = when
            callback()


class SimpyClock:
    """The same clock on a `simpy.Environment` (public API only): the reference for HeapClock."""

    __slots__ = ("env", "now", "_run")

    def __init__(self) -> None:
        self.env = simpy.Environment()
        self.now = 0.0  # seconds: the exact time of the event being run

        def run(event: simpy.Event) -> None:
            self.now, callback = event.value
            callback()

        self._run = run

    def at(self, when: float, callback: Callable[[], None]) -> None:
        """Call `callback()` at time `when` (>= now)."""
        delay = when - self.env.now
        self.env.timeout(delay if delay > 0.0 else 0.0, (when, callback)).callbacks.append(self._run)

    def after(self, delay: float, callback: Callable[[], None]) -> None:
        """Call `callback()` `delay` seconds from now."""
        self.at(self.now + delay, callback)

    def next_time(self) -> float:
        """SimPy's time of the next event (infinity when none is left)."""
        return self.env.peek()

    def run(self) -> None:
        """Run every event, earliest first, until none is left."""
        self.env.run()


Clock = HeapClock | SimpyClock

__all__ = ["Clock", "HeapClock", "SimpyClock"]
