"""The simulator's time: a `simpy.Environment`, with callbacks at exact absolute times in (time, posting) order.

SimPy is the engine (public API only: `Environment.timeout`, `Event.callbacks`, `Environment.peek`,
`Environment.run`). The kernel's ranks are chains of callbacks on SimPy's events rather than
generator processes: the same semantics (a rank runs until it must wait, then sleeps until an
absolute time), and bench/bench_simulator.py's GPipe p=64, m=1024 case stays under half of torch's
dry run with room to spare (docs/simulator.md, "Speed"). SimPy schedules by delay, and `now + (t - now)`
can round an absolute time t off by one unit in the last place, so each event carries its exact
time as its value and `Clock.now` is read from there: ranks wake at their exact completion times (a
compute's end, a message's arrival), and two runs agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy


class Clock:
    """Simulated seconds on a `simpy.Environment`: `at` an absolute time or `after` a delay, `run` them all.

    `at(when, callback)` and `next_time()` are plain functions bound to this clock's environment."""

    __slots__ = ("env", "now", "at", "next_time")

    def __init__(self) -> None:
        env = self.env = simpy.Environment()
        self.now = 0.0  # seconds: the exact time of the event being run
        timeout = env.timeout

        def run(event: simpy.Event) -> None:
            self.now, callback = event.value
            callback()

        def at(when: float, callback: Callable[[], None]) -> None:
            """Call `callback()` at time `when` (>= now); events at one time run in the order they were posted."""
            delay = when - env.now
            timeout(delay if delay > 0.0 else 0.0, (when, callback)).callbacks.append(run)

        self.at = at
        self.next_time = env.peek  # time of the next event (infinity when none is left)

    def after(self, delay: float, callback: Callable[[], None]) -> None:
        """Call `callback()` `delay` seconds from now."""
        self.at(self.now + delay, callback)

    def run(self) -> None:
        """Run every event, earliest first, until none is left."""
        self.env.run()


__all__ = ["Clock"]
