"""`pipesim calibrate`: measure this machine in the conditions of a real run and write a hardware file.

Costs measured in an idle single process are not the costs inside a run, where ranks share the
cores, the memory system and gloo's threads. So the compute figures come from the executor's own
per-action timelines (2-rank gpipe, 1f1b and zb-h1 runs of the MLP and the GPT), fitted by
`pipesim.calibrate_fit` under the same core-sharing rule the simulator uses; the co-run slowdown is
refined on the same runs' step times; one 4-rank run with more ranks than cores sets the time slice
(by its bubble) and the slowdown while ranks wait for a core (by its step time); the isend posting
time, the message latency and the delay of RECVs begun after their message was posted come from
the same timelines; the bandwidth from a gloo ping-pong in the same process group. The result loads
with `pipesim simulate --hardware`.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from pipesim.calibrate_fit import ComputeFit, fit_compute, fit_link, typical_samples
from pipesim.errors import PipesimError
from pipesim.hardware import DeviceSpec, Hardware, LinkClass
from pipesim.measured import (
    action_samples,
    comm_action_seconds,
    late_recv_delay,
    message_delays,
    typical_metrics,
)
from pipesim.model_config import ModelConfig, split_layers
from pipesim.timeline import Timeline

LECTURE_MLP = {"kind": "mlp", "hidden": 1024, "layers": 8, "batch": 64}
QUICK_MLP = {"kind": "mlp", "hidden": 512, "layers": 4, "batch": 32}
SMALL_GPT = {"kind": "gpt", "hidden": 128, "layers": 8, "heads": 4, "seq": 32, "vocab": 256, "batch": 8}


def run_spec(run_id: str, schedule: str, m: int, model: dict, *, p: int = 2, v: int | None = None,
             steps: int = 8, warmup: int = 2) -> dict:
    """One entry of a measurement plan (see `pipesim.calibrate_runs`); p ranks."""
    return {"id": run_id, "schedule": schedule, "p": p, "microbatches": m, "virtual": v, "model": model,
            "steps": steps, "warmup": warmup}


def simulate_run(hw: Hardware, run: dict):
    """Simulate one planned run on `hw` exactly as `pipesim simulate --hardware` would; a SimResult."""
    import schedules
    from pipesim.sim_setup import SimSetup

    sched = schedules.build(run["schedule"], run["p"], run["microbatches"], run.get("virtual"))
    return SimSetup(hardware=hw, model=ModelConfig(**run["model"]), comm=True, check_memory=False).run(sched)


def _grid_best(hw: Hardware, field: str, top: float, runs: list[dict], measured: dict[str, float],
               steps: int) -> Hardware:
    """`hw` with `field` set to the grid value in [0, top] that best explains the runs' step times."""
    best = (float("inf"), hw)
    for i in range(steps + 1):
        cand = replace(hw, **{field: top * i / steps})
        err = sum(abs(simulate_run(cand, r).makespan / measured[r["id"]] - 1) for r in runs) / len(runs)
        if err < best[0]:
            best = (err, cand)
    return best[1]


def _fair(hw: Hardware, runs: list[dict]) -> list[dict]:
    """The runs in which every rank has a core (all runs when there are none such)."""
    cores = hw.host_cores or 10**9
    return [r for r in runs if r["p"] <= cores] or runs


def refine_corun(hw: Hardware, runs: list[dict], measured: dict[str, float], steps: int = 50) -> Hardware:
    """The co-run slowdown (per other runnable rank) that best explains the fit runs' step times, on a grid.

    Per action it is hard to see under the noise (a 20 % spread between repeats of one action); over
    whole steps, where ranks overlap for most of the time, it is the main term after the rates, and
    it also carries what two busy ranks cost each other between their actions (isend posting, gloo's
    threads, the executor's loop). The per-action overhead is not refined so: seen directly on the
    actions, it is better determined there, and on step times it trades off against this one (it
    reached 350 us in one campaign, doubling on interleaved schedules' twice as many actions).
    Runs with more ranks than cores are left to `refine_time_slice`.
    """
    return _grid_best(hw, "node_corun_slowdown", 0.5, _fair(hw, runs), measured, steps)


def refine_oversubscription(hw: Hardware, runs: list[dict], measured: dict[str, float],
                            steps: int = 50) -> Hardware:
    """The `oversubscription_slowdown` that best explains the step times of the fit runs with more ranks
    than cores (unchanged when there are none): turn-taking costs more than the cores' share (switches,
    caches, the waiting ranks' threads), and whole steps show it where single actions, preempted at
    random, do not. With time slices it applies while any rank waits (`pipesim.host_slices`)."""
    over = [r for r in runs if hw.host_cores is not None and r["p"] > hw.host_cores]
    return _grid_best(hw, "oversubscription_slowdown", 1.0, over, measured, steps) if over else hw


def refine_time_slice(hw: Hardware, runs: list[dict], measured: dict[str, float], bubbles: dict[str, float],
                      slices: int = 16) -> Hardware:
    """Time slices for the fit runs with more ranks than cores (unchanged when there are none): for each
    slice on a grid (0.5 to 8 ms), the slowdown while ranks wait that best explains their step times;
    of those pairs, the one whose bubble is closest to the measured one.

    The slice decides where turn-taking shows (a woken rank waiting for a core, a preempted action:
    waits against compute, so the bubble); the slowdown, how much work it costs (the step time). The
    late-RECV surcharge of crowded runs goes: the wake-ups queueing for a core are now simulated.
    """
    over = [r for r in runs if hw.host_cores is not None and r["p"] > hw.host_cores]
    if not over:
        return hw
    best = (float("inf"), hw)
    for i in range(1, slices + 1):
        cand = refine_oversubscription(replace(hw, time_slice=0.5e-3 * i, oversubscribed_recv_delay=0.0),
                                       runs, measured)
        err = 0.0
        for r in over:
            res = simulate_run(cand, r)
            err += abs(res.makespan / measured[r["id"]] - 1) + abs(res.bubble_fraction - bubbles[r["id"]])
        if err < best[0]:
            best = (err, cand)
    return best[1]


def in_run_latency(timelines: list[Timeline], bandwidth: float, fallback: float) -> float:
    """Seconds of a message's latency inside the runs: the mean delivery of the messages whose receiver
    was already waiting, less bytes / bandwidth; `fallback` (the ping-pong's) when there are none.

    A ping-pong is a few hundred messages at one moment; the runs' own messages are thousands, sent
    while the ranks compute, which is what the simulator has to reproduce. The mean, not the median:
    deliveries are heavy-tailed here (median about 0.1 ms, mean about 0.4 ms on 2 ranks) and a step
    pays the delays of its critical path, whose sum follows the mean (as for late RECVs).
    """
    import statistics

    waits = [d - nbytes / bandwidth for tl in timelines for d, nbytes, late in message_delays(tl) if not late]
    return max(0.0, statistics.fmean(waits)) if waits else fallback


def calibration_plan(quick: bool = False) -> list[dict]:
    """The runs the fit uses: 2 ranks (fused and split backward, two microbatch sizes, MLP widths, the GPT)
    and one run with more ranks than this machine's 2 cores."""
    if quick:
        return [run_spec("fit-1f1b-m2", "1f1b", 2, QUICK_MLP, steps=3, warmup=1),
                run_spec("fit-zb-h1-m4", "zb-h1", 4, QUICK_MLP, steps=3, warmup=1)]
    half = {**LECTURE_MLP, "hidden": 512}
    return [run_spec("fit-mlp-gpipe-m4", "gpipe", 4, LECTURE_MLP),
            run_spec("fit-mlp-1f1b-m8", "1f1b", 8, LECTURE_MLP),
            run_spec("fit-mlp-zb-h1-m8", "zb-h1", 8, LECTURE_MLP),
            run_spec("fit-mlp512-1f1b-m4", "1f1b", 4, half),
            run_spec("fit-mlp512-zb-h1-m4", "zb-h1", 4, half),
            run_spec("fit-gpt-1f1b-m4", "1f1b", 4, SMALL_GPT),
            run_spec("fit-gpt-zb-h1-m4", "zb-h1", 4, SMALL_GPT),
            run_spec("fit-mlp-p4-1f1b-m8", "1f1b", 8, LECTURE_MLP, p=4)]  # more ranks than cores


def stage_work(model: ModelConfig, num_stages: int, m: int) -> list[tuple[tuple[float, float, float], ...]]:
    """((F, I, W) FLOPs, (F, I, W) bytes moved, (F, I, W) framework ops) of one microbatch on each
    stage, as the cost model counts them."""
    from pipesim.model_costs import gpt_stage_work, mlp_stage_work

    b = model.batch // m
    out = []
    for s, layers in enumerate(split_layers(model.layers, num_stages)):
        if model.kind == "mlp":
            work = mlp_stage_work(model, b, layers, first=s == 0)
        else:
            work = gpt_stage_work(model, b, layers, first=s == 0, last=s == num_stages - 1)
        out.append(tuple(tuple(part[k] for k in "FIW") for part in (work.flops, work.moved, work.ops)))
    return out


def stage_flops(model: ModelConfig, num_stages: int, m: int) -> list[tuple[float, float, float]]:
    """(F, I, W) FLOPs of one microbatch on each stage, as the simulator's cost model counts them."""
    return [work[0] for work in stage_work(model, num_stages, m)]


def action_flops(kind: str, stage: int, flops: tuple[float, float, float]) -> tuple[tuple[float, float, float], int]:
    """(FLOPs attributed to the F, I, W rates, overheads charged) of one executed compute action.

    The executor's first stage has no input gradient: its I is empty and its W runs the whole
    backward (a plain one, charged like a B).
    """
    f, i, w = flops
    if kind == "F":
        return (f, 0.0, 0.0), 1
    if kind == "B":
        return (0.0, i, w), 2
    if kind == "I":
        return ((0.0, 0.0, 0.0), 1) if stage == 0 else ((0.0, i, 0.0), 1)
    return ((0.0, i, w), 2) if stage == 0 else ((0.0, 0.0, w), 1)


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
            f"{c.corun:.3f} on the actions, {hw.node_corun_slowdown:.3f} on the step times; host cores "
            f"{hw.host_cores}, " + self._beyond_cores(),
            f"messages: a SEND holds its rank {hw.send_overhead * 1e6:.0f} us (mean isend posting); a RECV begun "
            f"after its SEND lasts {hw.late_recv_delay * 1e6:.0f} us (mean; gloo progress)"
            + (f", +{hw.oversubscribed_recv_delay * 1e6:.0f} us with more ranks than cores"
               if hw.oversubscribed_recv_delay else ""),
            f"p2p (gloo loopback): latency {self.latency * 1e6:.0f} us (the runs' own messages), bandwidth "
            f"{self.bandwidth / 1e9:.2f} GB/s (ping-pong); "
            f"all_reduce busbw (2 ranks): {ar}",
            f"memory copy bandwidth (1 thread): {self.memory_bandwidth / 1e9:.1f} GB/s",
        ])


    def _beyond_cores(self) -> str:
        hw = self.hardware
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
                    inter=None, per_action_overhead=overhead, per_op_overhead=fit.per_op, host_cores=cores,
                    node_corun_slowdown=fit.corun, oversubscription_slowdown=fit.oversub,
                    roofline="sum" if fit.bandwidth else "max", split_backward_overhead=fit.split_overhead,
                    split_group_overhead=fit.split_group, backward_op_overhead=fit.per_op_backward,
                    split_graph_overhead=fit.split_graph, source=source)


def calibrate(*, quick: bool = False, workdir: Path | None = None, devices: int = 4, cores: int | None = None,
              rounds: int | None = None, memory: bool = True, timelines: dict[str, list[Timeline]] | None = None,
              comm: dict | None = None) -> tuple[Calibration, dict[str, list[Timeline]]]:
    """Run the calibration plan (every run `rounds` times) and fit; or fit the given `timelines`, `comm`.

    Every round's timelines enter the fit: the median action of each (run, stage, kind) sets the
    rates, the typical round of each run its step time.
    """
    cores = cores or os.cpu_count() or 1
    if timelines is None:
        from pipesim.calibrate_launch import CYCLES, ROUNDS, measure_rounds

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
        from pipesim.calibrate_runs import memory_bandwidth

        membw = memory_bandwidth()
    busbw = "; ".join(f"all_reduce busbw {bw / 1e9:.2f} GB/s at {n / 2**20:.0f} MiB (2 ranks)" for n, bw in ar)
    ranks = sorted({tl.meta["p"] for tl in every})
    source = (f"pipesim calibrate on {platform.node()} ({cores} cores) at {time.strftime('%Y-%m-%d %H:%M')}: "
              f"compute from the executor's timelines of {len(timelines)} runs on "
              f"{'/'.join(map(str, ranks))} ranks ({len(every)} timelines), message latency from the same timelines, "
              "bandwidth from a gloo ping-pong" + (f"; {busbw}" if busbw else ""))
    hw = build_hardware(fit, overhead=fit.overhead, latency=latency, bandwidth=bandwidth, membw=membw, cores=cores,
                        devices=devices, source=source)
    hw = replace(hw, send_overhead=send, late_recv_delay=late_recv_delay(fair))
    runs = [{**tls[0].meta, "id": key, "schedule": tls[0].meta["schedule"], "microbatches": tls[0].meta["m"],
             "virtual": tls[0].meta["v"] if tls[0].meta["v"] > 1 else None} for key, tls in timelines.items()]
    typical = {key: typical_metrics(tls) for key, tls in timelines.items()}  # (step seconds, bubble)
    spans = {key: step for key, (step, _) in typical.items()}
    hw = refine_corun(hw, runs, spans)
    hw = refine_time_slice(hw, runs, spans, {key: bubble for key, (_, bubble) in typical.items()})
    cal = Calibration(hw, fit, send, per_unit, latency, bandwidth, ar, membw, sorted(timelines))
    return cal, timelines


__all__ = ["Calibration", "build_hardware", "calibrate", "calibration_plan"]
