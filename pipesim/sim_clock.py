"""The simulator's discrete-event clock on SimPy's public API: callbacks at absolute times.

SimPy schedules by delay (an event fires at `now + delay`), and `now + (t - now)` can round off an
absolute time t by one unit in the last place. pipesim's ranks must wake at exact completion times
(a compute's end, a message's arrival) and its numbers are compared bit for bit, so each event
carries its exact time as its value: SimPy orders the events (earliest first, ties in the order
they were posted), and `Clock.now` is the exact time of the event being run.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy


class Clock:
    """Simulated time in seconds on a SimPy environment."""

    __slots__ = ("env", "now", "_run")

    def __init__(self) -> None:
        self.env = simpy.Environment()
        self.now = 0.0  # seconds: the exact time of the event being run

        def run(event: simpy.Event) -> None:
            self.now, callback = event.value
            callback()

        self._run = [run]

    def at(self, when: float, callback: Callable[[], None]) -> None:
        """Call `callback()` at time `when` (>= now)."""
        delay = when - self.env.now
        event = self.env.timeout(delay if delay > 0.0 else 0.0, (when, callback))
        event.callbacks = self._run[:]

    def after(self, delay: float, callback: Callable[[], None]) -> None:
        """Call `callback()` `delay` seconds from now."""
        self.at(self.now + delay, callback)

    def next_time(self) -> float:
        """SimPy's time of the next event (infinity when none is left)."""
        return self.env.peek()

    def run(self) -> None:
        """Run every event, earliest first, until none is left."""
        self.env.run()


__all__ = ["Clock"]
