"""Links for the simulator: P2P transfers that hold contended link resources for their duration.

Picture a row of turnstiles, one per resource (a device's tx port, the peer's rx port, a shared
bus), each with a single FIFO queue. A transfer is served in the order it was posted: it starts
once every resource it needs is free of all earlier-posted transfers, holds them all while its
bytes move (latency + bytes / bandwidth), then lets them go. Because service is strictly in posting
order, the start time is known the moment a transfer is posted, so a transfer costs one table
update and at most one SimPy wake-up instead of a process; there is no hold-and-wait, hence no
deadlock, and SimPy's insertion-ordered event queue makes ties deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import heappush

import simpy
from simpy.core import NORMAL

from pipesim.ir import Action


@dataclass(slots=True)
class Transfer:
    """One P2P message: posted by a SEND on `src`, consumed by the matching RECV on `dst`."""

    send: Action
    src: int  # pipeline rank that sends
    dst: int  # pipeline rank that receives
    nbytes: int  # bytes
    link: str  # link class name ("" when communication is not modeled)
    resources: tuple[str, ...]  # contended resources held while the bytes move
    post: float  # seconds: when the SEND was posted
    send_index: int = -1  # position of the SEND in the sender's program
    start: float = -1.0  # seconds: when every resource was free and the bytes started moving
    end: float = -1.0  # seconds: when the bytes arrived
    blocker: Transfer | None = None  # the earlier transfer whose release let this one start


class Environment(simpy.Environment):
    """SimPy's environment plus re-armable alarms at absolute times (touches SimPy's event queue directly).

    Waking at an absolute time keeps times exact (no `now + (t - now)` rounding); re-arming one
    event per sleeper saves an allocation per wake-up, which matters at ~200k wake-ups per step.
    """

    def alarm(self) -> simpy.Event:
        """An event that can be armed again and again; it always succeeds."""
        event = simpy.Event(self)
        event._ok, event._value = True, None  # what Event.succeed would set
        return event

    def arm(self, alarm: simpy.Event, callbacks: list, when: float) -> None:
        """Fire `alarm` at time `when` (>= now), calling `callbacks`; it must not be pending already."""
        alarm.callbacks = callbacks  # step() reads this list and then clears the attribute
        heappush(self._queue, (when, NORMAL, next(self._eid), alarm))


class LinkPool:
    """FIFO reservation tables for the machine's contended resources."""

    def __init__(self) -> None:
        self._free: dict[str, float] = {}  # resource -> seconds when its last reservation ends
        self._holder: dict[str, Transfer] = {}  # resource -> the transfer holding that reservation

    def reserve(self, tr: Transfer, duration: float) -> None:
        """Fill in `tr.start`, `tr.end` and `tr.blocker` for a transfer posted at `tr.post`."""
        start, blocker = tr.post, None
        free, holder = self._free, self._holder
        for name in tr.resources:
            busy_until = free.get(name, 0.0)
            if busy_until > start:
                start, blocker = busy_until, holder[name]
        tr.start, tr.end, tr.blocker = start, start + duration, blocker
        for name in tr.resources:
            free[name] = tr.end
            holder[name] = tr
