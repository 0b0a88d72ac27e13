"""Links for the simulator: P2P transfers that hold contended link resources for their duration.

Picture a row of turnstiles, one per resource (a device's tx port, the peer's rx port, a shared
bus), each with a single FIFO queue. A transfer is served in the order it was posted: it starts
once every resource it needs is free of all earlier-posted transfers, holds them all while its
bytes move (latency + bytes / bandwidth), then lets them go. Because service is strictly in posting
order, the start time is known the moment a transfer is posted, so a transfer costs one table
update and at most one wake-up instead of a process; there is no hold-and-wait, hence no
deadlock, and the clock's insertion-ordered event queue makes ties deterministic.

When a posted message completes its RECV is the P2P plug-in's business: `PlainP2P` (the bytes have
arrived) or `GlooP2P` (CPU processes talking gloo: posting a SEND holds its rank, and a RECV that
reaches a message posted while it computed waits for the sender's progress thread). Both have one
interface: `send_hold` (seconds a SEND holds its rank) and `recv_done(now, post, arrive)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.ir.schedule import Action


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


class PlainP2P:
    """A RECV completes when its bytes have arrived; posting a SEND costs its rank nothing (GPUs, NCCL)."""

    send_hold = 0.0  # seconds a SEND holds its rank

    @staticmethod
    def recv_done(now: float, post: float, arrive: float) -> float:
        """When a RECV begun at `now` ends, for a message posted at `post` whose bytes arrive at `arrive`."""
        return arrive


@dataclass(frozen=True)
class GlooP2P:
    """gloo between CPU processes: posting an isend holds the rank `send_hold`; a RECV that finds its message
    posted before it began lasts at least `late_recv`, the receiver asking and the sender's progress thread
    (sharing a core with the sender's compute) answering late."""

    send_hold: float  # seconds a SEND holds its rank
    late_recv: float  # seconds a RECV of an already posted message lasts at least

    def recv_done(self, now: float, post: float, arrive: float) -> float:
        """When a RECV begun at `now` ends, for a message posted at `post` whose bytes arrive at `arrive`."""
        if self.late_recv and post < now and now + self.late_recv > arrive:  # posted while we computed: late
            return now + self.late_recv
        return arrive
