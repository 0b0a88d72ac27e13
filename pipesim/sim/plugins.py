"""The simulator's plug-ins, chosen from the machine before the kernel runs: compute, host and P2P.

The kernel knows programs, dependencies, links and time; what varies between machines comes in
through three small objects, each with one interface:
- compute (`pipesim.sim.program.TableCompute`): how long each compute action takes (the cost table,
  plus a calibrated host's split-backward bookkeeping);
- host (`pipesim.sim.host`): how ranks on one node share its CPU cores (`start(rank, seconds, done)`,
  `started[rank]`), the other replicas' copies of each pipeline rank included; None on GPUs, where a compute
  holds its device alone. It lives on the run's clock,
  so the plug-ins carry a factory and the kernel calls it with its clock;
- P2P (`pipesim.sim.links.PlainP2P`, `GlooP2P`): how long posting a SEND holds its rank and when a RECV
  completes.
Only hardware with a `[host]` profile (a calibrated CPU machine) gets the CPU ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipesim.cost.table import CostTable
from pipesim.hardware.machine import Hardware
from pipesim.sim.clock import Clock
from pipesim.sim.host.copies import HostCopies, expand
from pipesim.sim.host.sharing import HostSharing
from pipesim.sim.host.slices import HostTimeSlices
from pipesim.sim.links import GlooP2P, PlainP2P
from pipesim.sim.program import TableCompute

HostModel = HostSharing | HostTimeSlices | HostCopies
# (the run's clock, the devices of each pipeline rank's copies, its own first: one per replica) -> model
HostFactory = Callable[[Clock, list[list[int]]], HostModel]


@dataclass(frozen=True)
class Plugins:
    """What the kernel asks the machine: compute seconds, core sharing (or None) and P2P completion."""

    compute: TableCompute
    p2p: PlainP2P | GlooP2P
    host: HostFactory | None = None  # None: each rank holds its own device (GPUs, or no hardware)


def plugins_for(table: CostTable, hw: Hardware | None, comm: bool) -> Plugins:
    """The plug-ins for `hw`: the CPU ones with a host profile (gloo's posting and late RECVs only with links)."""
    host = hw.host if hw is not None else None
    if host is None:
        return Plugins(TableCompute(table), PlainP2P())
    p2p = GlooP2P(host.send_overhead, host.late_recv_delay) if comm else PlainP2P()
    def factory(clock: Clock, devices: list[list[int]]) -> HostModel:
        nodes, ids = expand([[hw.node_of(d) for d in copies] for copies in devices])
        inner: HostSharing | HostTimeSlices
        if host.time_slice:
            inner = HostTimeSlices(clock, nodes, host.cores, host.node_corun_slowdown, host.time_slice,
                                   host.oversubscription_slowdown)
        else:
            inner = HostSharing(clock, nodes, host.cores, host.node_corun_slowdown, host.oversubscription_slowdown)
        # every replica's processes share the cores (pipesim.sim.host.copies); one copy each: the model itself
        return HostCopies(inner, ids) if len(nodes) > len(devices) else inner

    return Plugins(TableCompute(table, host.split_costs), p2p, factory)


__all__ = ["HostFactory", "HostModel", "Plugins", "plugins_for"]
