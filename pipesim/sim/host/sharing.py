"""Ranks that share a host's CPU cores: processor sharing, re-timed whenever a rank starts or stops.

Picture a kitchen with `cores` stoves and one cook per rank. A cook with a dish on the go is
runnable (computing, or posting a message); one waiting for a delivery is not. While no more cooks
are runnable than there are stoves, each cooks at full speed, less a little for the shared fridge
and sink (memory bandwidth, caches): `node_corun_slowdown` per other runnable cook. With more
runnable cooks than stoves they take turns, each at cores / runnable speed, and every hand-over
refills the caches: `oversubscription_slowdown` more per runnable cook beyond the stoves.

The speed changes the moment a cook starts or finishes, so an action's length is not known when
it starts: each runnable rank carries its remaining work (seconds it would take alone) and every
change of the runnable set settles the work done at the old speed and re-times the finishes at the
new one (a fluid model, as the OS scheduler's fair share is). Calibration measures the same
thing from the executor's timelines (`runnable_profile`), so the fitted figures mean what the
simulator does with them. Applies only to hardware with a host profile (`Hardware.host`).

A host plug-in's interface (this class and `pipesim.sim.host.slices.HostTimeSlices`): `start(rank,
seconds, done)` makes a rank runnable with that much work and calls `done()` when it is done;
`started[rank]` is when its current work first had a core.
"""

from __future__ import annotations

from collections.abc import Callable

from pipesim.sim.clock import Clock


def speed(runnable: int, cores: int, corun: float, oversub: float = 0.0) -> float:
    """Work-seconds done per second by each of `runnable` ranks sharing `cores` cores (1.0 alone)."""
    if runnable <= 1:
        return 1.0
    share = cores / runnable if runnable > cores else 1.0
    return share / ((1.0 + corun * (min(runnable, cores) - 1)) * (1.0 + oversub * max(0, runnable - cores)))


class HostSharing:
    """Per-run state for the simulator: the runnable ranks of each node and their remaining work."""

    def __init__(self, clock: Clock, nodes: list[int], cores: int, corun: float, oversub: float = 0.0) -> None:
        self.clock = clock
        self.nodes = nodes  # node of each pipeline rank
        self.cores, self.corun, self.oversub = cores, corun, oversub
        self.work: dict[int, dict[int, float]] = {n: {} for n in set(nodes)}  # node -> rank -> seconds left alone
        self.since: dict[int, float] = {n: 0.0 for n in set(nodes)}  # node -> time of the last settlement
        self.done: list[Callable[[], None] | None] = [None] * len(nodes)  # what to call when the work is done
        self.gen = [0] * len(nodes)  # bumps on every re-timing: stale finish events are ignored
        self.started = [0.0] * len(nodes)  # when each rank's current work began (at once: no queue here)

    def start(self, rank: int, seconds: float, done: Callable[[], None]) -> None:
        """`rank` becomes runnable with `seconds` of work (as long as it takes alone); `done()` at its end."""
        node = self.nodes[rank]
        self._settle(node)
        self.work[node][rank] = seconds
        self.done[rank] = done
        self.started[rank] = self.clock.now
        self._retime(node)

    def _settle(self, node: int) -> None:
        """Take off every runnable rank's remaining work what it did since the last change."""
        now, work = self.clock.now, self.work[node]
        elapsed = now - self.since[node]
        if elapsed > 0 and work:
            rate = speed(len(work), self.cores, self.corun, self.oversub)
            for rank in work:
                work[rank] -= elapsed * rate
        self.since[node] = now

    def _retime(self, node: int) -> None:
        """Schedule each runnable rank's finish at the current speed (earlier schedules go stale)."""
        work, clock = self.work[node], self.clock
        if not work:
            return
        rate = speed(len(work), self.cores, self.corun, self.oversub)
        for rank in sorted(work):  # sorted: the same event order every run
            self.gen[rank] += 1
            clock.after(max(0.0, work[rank]) / rate, lambda r=rank, g=self.gen[rank]: self._finish(r, g))

    def _finish(self, rank: int, gen: int) -> None:
        if gen != self.gen[rank]:
            return  # re-timed since this was scheduled
        node = self.nodes[rank]
        self._settle(node)
        del self.work[node][rank]
        done, self.done[rank] = self.done[rank], None
        self._retime(node)
        done()


def runnable_profile(intervals: list[tuple[float, float]], busy: list[list[tuple[float, float]]],
                     max_count: int) -> list[float]:
    """Seconds of each interval spent with 1, 2, ... `max_count` runnable ranks (the interval's own included).

    `intervals`: one rank's [start, end) spans; `busy`: the other ranks' runnable spans. Returns, per
    interval, a list whose entry k-1 is the time with k runnable (counts above `max_count` clipped).
    """
    out = []
    for t0, t1 in intervals:
        near = [[(a, b) for a, b in spans if a < t1 and b > t0] for spans in busy]  # overlapping spans only
        cuts = {t0, t1}
        for spans in near:
            for a, b in spans:
                cuts.update(x for x in (a, b) if t0 < x < t1)
        edges = sorted(cuts)
        prof = [0.0] * max_count
        for a, b in zip(edges, edges[1:]):
            mid = (a + b) / 2
            k = 1 + sum(1 for spans in near if any(s <= mid < e for s, e in spans))
            prof[min(k, max_count) - 1] += b - a
        out.append(prof)
    return out


__all__ = ["HostSharing", "runnable_profile", "speed"]
