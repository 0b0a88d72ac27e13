"""`pipesim calibrate`: measure this machine in the conditions of a real run and write a hardware file.

Costs measured in an idle single process are not the costs inside a run, where ranks share the
cores, the memory system and gloo's threads. So the compute figures come from the executor's own
per-action timelines (2-rank gpipe, 1f1b and zb-h1 runs of the MLP and the GPT), fitted by
`pipesim.calibration.fit` under the same core-sharing rule the simulator uses; the co-run slowdown is
refined on the same runs' step times; one 4-rank run with more ranks than cores sets the time slice
(by its bubble) and the slowdown while ranks wait for a core (by its step time); the isend posting
time, the message latency and the delay of RECVs begun after their message was posted come from
the same timelines; the bandwidth from a gloo ping-pong in the same process group. The result loads
with `pipesim simulate --hardware`.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipesim.calibration.fit import ComputeFit, fit_compute, fit_link, typical_samples
from pipesim.calibration.launcher import CYCLES, ROUNDS, measure_rounds
from pipesim.calibration.measured import (
    action_samples,
    comm_action_seconds,
    in_run_latency,
    late_recv_delay,
    typical_metrics,
)
from pipesim.calibration.plan import calibration_plan
from pipesim.calibration.refine import refine_corun, refine_time_slice
from pipesim.calibration.runs import memory_bandwidth
from pipesim.calibration.speed_check import PROBE_TOLERANCE, machine_key
from pipesim.comm.collective_algos import collective_seconds
from pipesim.errors import PipesimError
from pipesim.hardware.machine import DeviceSpec, Hardware, HostProfile, LinkClass
from pipesim.timeline import Timeline


@dataclass(frozen=True)
class Calibration:
    """What `pipesim calibrate` measured and fitted, and the hardware it implies."""

    hardware: Hardware
    compute: ComputeFit
    send_seconds: float  # mean seconds a SEND holds its rank (posting the isend)
    comm_per_unit: float  # comm actions per charged compute overhead in the fit runs
    latency: float  # seconds, from the runs' messages (ping-pong fit where they have none)
    bandwidth: float  # bytes/s, ping-pong fit
    allreduce_busbw: list[tuple[int, float]]  # (bytes, bytes/s) measured
    memory_bandwidth: float  # bytes/s
    runs: list[str]  # ids of the fit runs
    # gloo's all_to_all on 2 ranks (a MoE layer's token exchange): (bytes, seconds measured, seconds the fitted link
    # gives it: collective_algos' all_to_all, as the simulator times the exchange)
    all_to_all: list[tuple[int, float, float]] = field(default_factory=list)

    def summary(self) -> str:
        c, hw = self.compute, self.hardware
        ar = ", ".join(f"{b / 2**20:.0f} MiB {bw / 1e9:.2f} GB/s" for b, bw in self.allreduce_busbw)
        return "\n".join([
            f"compute (fit on {c.samples} actions of the {len(self.runs)} runs, those with a core per rank; "
            f"mean |error| {c.mean_abs_error:.1%}): "
            f"F {c.rate[0] / 1e9:.2f}, I {c.rate[1] / 1e9:.2f}, W {c.rate[2] / 1e9:.2f} GFLOP/s"
            + (" + memory traffic at " + ", ".join(f"{k} {b / 1e9:.2f}" for k, b in zip("FIW", c.bandwidths(),
                                                                                     strict=True))
               + " GB/s (added, roofline = sum)" if c.bandwidth else "")
            + f"; per framework op {c.per_op * 1e6:.1f} us in F"
            + (f", {c.per_op_backward * 1e6:.1f} us in I and W" if c.per_op_backward is not None else "")
            + f"; split backward +{c.split_overhead * 1e6:.0f} us per I or W action, "
            f"+{c.split_group * 1e6:.0f} us more on W per parameter group of the stage, "
            f"+{c.split_graph * 1e6:.1f} us on I per backward op of the stage (its graph walk)",
            f"per-action overhead: {hw.per_action_overhead * 1e6:.0f} us (fitted on the actions); "
            "co-run slowdown per other runnable rank: "
            f"{c.corun:.3f} on the actions, {hw.host.node_corun_slowdown:.3f} on the step times; host cores "
            f"{hw.host.cores}, " + self._beyond_cores(),
            f"messages: a SEND holds its rank {hw.host.send_overhead * 1e6:.0f} us (mean isend posting); a RECV "
            f"begun after its SEND lasts {hw.host.late_recv_delay * 1e6:.0f} us (mean; gloo progress)",
            f"p2p (gloo loopback): latency {self.latency * 1e6:.0f} us (the runs' own messages), bandwidth "
            f"{self.bandwidth / 1e9:.2f} GB/s (ping-pong); "
            f"all_reduce busbw (2 ranks): {ar}"
            + ("; all_to_all (2 ranks), measured / on the fitted link: " + ", ".join(
                f"{b / 2**10:.0f} KiB {t * 1e6:.0f} / {p * 1e6:.0f} us" for b, t, p in self.all_to_all)
               if self.all_to_all else ""),
            f"memory copy bandwidth (1 thread): {self.memory_bandwidth / 1e9:.1f} GB/s",
        ])


    def _beyond_cores(self) -> str:
        hw = self.hardware.host
        if hw.time_slice:
            return (f"ranks beyond them take turns in {hw.time_slice * 1e3:.1f} ms time slices, running "
                    f"{hw.oversubscription_slowdown:.3f} slower while any waits (fitted on the crowded run's step "
                    "time and bubble)")
        return (f"turn-taking beyond them plus {hw.oversubscription_slowdown:.3f} per runnable rank beyond them")


def build_hardware(fit: ComputeFit, *, overhead: float, latency: float, bandwidth: float, membw: float,
                   cores: int, devices: int, source: str, dtype: str = "float32",
                   memory: int = 6 << 30) -> Hardware:
    """A one-node Hardware of `devices` CPU processes carrying the fitted figures."""
    rf, ri, rw = fit.rate
    kinds = {"F": 1.0, "I": ri / rf, "W": rw / rf}
    mem_kinds = None
    if fit.memory_kinds:
        bf, bi, bw = fit.memory_kinds
        mem_kinds = {"F": 1.0, "I": bi / bf, "W": bw / bf}
    device = DeviceSpec(name="cpu-process (calibrated)", flops={dtype: rf}, hbm_bandwidth=fit.bandwidth or membw,
                        memory=memory, compute_efficiency=1.0, kind_efficiency=kinds,
                        kind_memory_efficiency=mem_kinds)
    link = LinkClass(name="loopback", bandwidth=bandwidth, peak_bandwidth=bandwidth, latency=latency, shared=True)
    return Hardware(name="calibrated-cpu", device=device, devices_per_node=devices, num_nodes=1, intra=link,
                    inter=None, per_action_overhead=overhead, per_op_overhead=fit.per_op,
                    roofline="sum" if fit.bandwidth else "max", backward_op_overhead=fit.per_op_backward,
                    source=source,
                    host=HostProfile(cores=cores, node_corun_slowdown=fit.corun, oversubscription_slowdown=fit.oversub,
                                     split_backward_overhead=fit.split_overhead, split_group_overhead=fit.split_group,
                                     split_graph_overhead=fit.split_graph))


def calibrate(*, quick: bool = False, workdir: Path | None = None, devices: int = 4, cores: int | None = None,
              rounds: int | None = None, memory: bool = True, timelines: dict[str, list[Timeline]] | None = None,
              comm: dict | None = None) -> tuple[Calibration, dict[str, list[Timeline]]]:
    """Run the calibration plan (every run `rounds` times) and fit; or fit the given `timelines`, `comm`.

    Every round's timelines enter the fit: the median action of each (run, stage, kind) sets the
    rates, the typical round of each run its step time.
    """
    cores = cores or os.cpu_count() or 1
    if timelines is None:
        with tempfile.TemporaryDirectory(prefix="pipesim-calibrate-") as tmp:
            timelines, comm = measure_rounds(calibration_plan(quick), workdir or Path(tmp),
                                             rounds or (1 if quick else ROUNDS), cycles=1 if quick else CYCLES)
    every = [tl for tls in timelines.values() for tl in tls]
    fair = [tl for tl in every if tl.meta["p"] <= cores]  # every rank had a core
    groups: dict[tuple, list] = {}
    for key, tls in timelines.items():
        for tl in tls:
            if tl.meta["p"] > cores and fair:  # crowded runs set the time slice, below
                continue
            for (stage, kind), sample in action_samples(tl):
                groups.setdefault((key, stage, kind), []).append(sample)
    samples = typical_samples(groups)  # the median action of each (run, stage, kind)
    fit = None
    # first the model whose figures the data pins down: at the lecture's microbatch sizes a CPU core
    # streams weights far below its arithmetic peak, so one FLOP rate for all kinds and a memory rate
    # per kind (a forward reads weights, a weight gradient writes and accumulates them); then richer or
    # poorer ones when that one comes out non-physical (a non-positive rate), last one rate without
    # per-op terms and then without fixed costs (a plan as small as --quick may not tell them apart)
    options = [("kinds", True), ("kinds", False), ("shared", False), ("shared", True)] if memory and not quick else []
    candidates = [(m, sh, True, True) for m, sh in [*options, ("", False), ("", True)]]
    candidates += [("", True, False, True), ("", True, False, False)]
    for n, (mem, shared, per_op, fixed) in enumerate(candidates, start=1):
        try:
            fit = fit_compute(samples, cores=cores, memory=mem, shared=shared, per_op=per_op, fixed=fixed)
            break
        except PipesimError:
            if n == len(candidates):
                raise
    send, per_unit = comm_action_seconds(fair)
    pp = comm["pingpong"] if comm else [[4, 1e-4], [1 << 20, 1e-4 + (1 << 20) / 1e9]]
    latency, bandwidth = fit_link([(int(n), float(t)) for n, t in pp])
    latency = in_run_latency(fair, bandwidth, latency)
    ar = [(int(r["bytes"]), float(r["busbw"])) for r in (comm or {}).get("all_reduce", [])]
    if comm and "memory_bandwidth" in comm:
        membw = float(comm["memory_bandwidth"])
    else:
        membw = memory_bandwidth()
    busbw = "; ".join(f"all_reduce busbw {bw / 1e9:.2f} GB/s at {n / 2**20:.0f} MiB (2 ranks)" for n, bw in ar)
    ranks = sorted({tl.meta["p"] for tl in every})
    source = (f"pipesim calibrate on {platform.node()} ({cores} cores) at {time.strftime('%Y-%m-%d %H:%M')}: "
              f"compute from the executor's timelines of {len(timelines)} runs on "
              f"{'/'.join(map(str, ranks))} ranks ({len(every)} timelines), message latency from the same timelines, "
              "bandwidth from a gloo ping-pong" + (f"; {busbw}" if busbw else ""))
    hw = build_hardware(fit, overhead=fit.overhead, latency=latency, bandwidth=bandwidth, membw=membw, cores=cores,
                        devices=devices, source=source)
    probes = [float(tl.meta["probe"]) for tl in every if tl.meta.get("probe")]
    hw = hw.with_host(send_overhead=send, late_recv_delay=late_recv_delay(fair),
                      # the speed probe beside the runs: `pipesim simulate` on another machine says so (speed_check)
                      probe_seconds=statistics.median(probes) if probes else 0.0,
                      probe_tolerance=PROBE_TOLERANCE if probes else 0.0, probe_machine=machine_key())
    runs = [{**tls[0].meta, "id": key, "schedule": tls[0].meta["schedule"], "microbatches": tls[0].meta["m"],
             "virtual": tls[0].meta["v"] if tls[0].meta["v"] > 1 else None} for key, tls in timelines.items()]
    typical = {key: typical_metrics(tls) for key, tls in timelines.items()}  # (step seconds, bubble)
    spans = {key: step for key, (step, _) in typical.items()}
    hw = refine_corun(hw, runs, spans)
    hw = refine_time_slice(hw, runs, spans, {key: bubble for key, (_, bubble) in typical.items()})
    a2a = [(int(r["bytes"]), float(r["time"]), collective_seconds(hw, "all_to_all", [0, 1], int(r["bytes"])))
           for r in (comm or {}).get("all_to_all", [])]
    cal = Calibration(hw, fit, send, per_unit, latency, bandwidth, ar, membw, sorted(timelines), a2a)
    return cal, timelines


__all__ = ["Calibration", "build_hardware", "calibrate"]
