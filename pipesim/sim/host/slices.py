"""Ranks that outnumber a host's cores take turns in time slices, as the OS scheduler runs them.

The fluid model (`pipesim.sim.host.sharing.HostSharing`) slows every runnable rank alike once they
outnumber the cores. The executor's timelines show something else: most actions run at their
usual speed and some wait for a core for a slice or more (3 or 4 ranks on 2 cores: the median
action about as long as alone, a flat tail out to +5 ms), and a rank woken by its message queues
for a core before its next action. Here at most `cores` ranks of a node run, each at full speed
less the co-run slowdown; the others wait in FIFO order; a running rank that has used a
`time_slice` while others wait goes to the back of the queue. Same interface as HostSharing
(`start`, and `started`: when a rank's current work first had a core).
"""

from __future__ import annotations

from collections.abc import Callable

from pipesim.sim.clock import Clock
from pipesim.sim.host.sharing import speed


class HostTimeSlices:
    """Per-run state: each node's running ranks (with their slice ends) and its queue."""

    def __init__(self, clock: Clock, nodes: list[int], cores: int, corun: float, time_slice: float,
                 oversub: float = 0.0) -> None:
        self.clock = clock
        self.nodes = nodes  # node of each pipeline rank
        self.cores, self.corun, self.slice, self.oversub = cores, corun, time_slice, oversub  # slice: seconds
        self.work = [0.0] * len(nodes)  # seconds of work left alone, per rank
        self.running: dict[int, dict[int, float]] = {n: {} for n in set(nodes)}  # node -> rank -> slice end
        self.queue: dict[int, list[int]] = {n: [] for n in set(nodes)}  # node -> waiting ranks, FIFO
        self.since: dict[int, float] = {n: 0.0 for n in set(nodes)}  # node -> time of the last settlement
        self.done: list[Callable[[], None] | None] = [None] * len(nodes)
        self.started: list[float | None] = [None] * len(nodes)  # when the current work first got a core
        self.gen: dict[int, int] = {n: 0 for n in set(nodes)}  # bumps on every change: stale events ignored

    def start(self, rank: int, seconds: float, done: Callable[[], None]) -> None:
        """`rank` becomes runnable with `seconds` of work; `done()` when it is done."""
        node = self.nodes[rank]
        self._settle(node)
        self.work[rank], self.done[rank], self.started[rank] = seconds, done, None
        if len(self.running[node]) < self.cores:
            self._grant(node, rank)
        else:
            self.queue[node].append(rank)
        self._retime(node)

    def _grant(self, node: int, rank: int) -> None:
        now = self.clock.now
        self.running[node][rank] = now + self.slice
        if self.started[rank] is None:
            self.started[rank] = now

    def _rate(self, node: int) -> float:
        """Work-seconds per second of each running rank: the co-run slowdown, and `oversub` more while
        any rank waits for a core (switching, refilling caches, the waiting ranks' threads)."""
        rate = speed(len(self.running[node]), self.cores, self.corun)
        return rate / (1.0 + self.oversub) if self.queue[node] else rate

    def _settle(self, node: int) -> None:
        now = self.clock.now
        elapsed = now - self.since[node]
        if elapsed > 0 and self.running[node]:
            rate = self._rate(node)
            for rank in self.running[node]:
                self.work[rank] -= elapsed * rate
        self.since[node] = now

    def _retime(self, node: int) -> None:
        """One pending event per node: the next finish, or the next slice end while ranks wait."""
        running = self.running[node]
        self.gen[node] += 1
        if not running:
            return
        now, rate = self.clock.now, self._rate(node)
        when = min(now + max(0.0, self.work[r]) / rate for r in running)
        if self.queue[node]:
            when = min(when, min(running.values()))
        self.clock.after(max(0.0, when - now), lambda n=node, g=self.gen[node]: self._tick(n, g))

    def _tick(self, node: int, gen: int) -> None:
        if gen != self.gen[node]:
            return
        self._settle(node)
        now, running, queue = self.clock.now, self.running[node], self.queue[node]
        finished = [r for r in sorted(running) if self.work[r] <= 1e-12]
        for r in finished:
            del running[r]
        expired = [r for r in sorted(running, key=lambda r: (running[r], r)) if running[r] <= now] if queue else []
        for r in expired:  # hand the core over: to the back of the queue
            del running[r]
            queue.append(r)
        while queue and len(running) < self.cores:
            self._grant(node, queue.pop(0))
        for r in running:  # nobody waits: a slice ending now simply renews
            if running[r] <= now:
                running[r] = now + self.slice
        self._retime(node)
        for r in finished:
            done, self.done[r] = self.done[r], None
            done()


__all__ = ["HostTimeSlices"]
