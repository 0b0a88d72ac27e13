"""`pipesim calibrate --from-trace`: the cost model fitted to imported profiler timelines, not to executor runs.

A real run's traces (`pipesim.trace_import`) carry every action's start and end but no FLOPs or bytes;
the model the run trained supplies them: pipesim's own (`--model mlp|gpt` and its sizes:
`pipesim.cost.stage_work.stage_work`) or the user's (`--model MODULE:FACTORY`, counted per layer by
`executor.user_model`, summed per stage by `pipesim.cost.user_model_costs`). Then the fit is the one the
executor's timelines feed (`pipesim.calibration.calibrate`): the median action of each (trace, stage,
kind) into `fit_compute`, the candidates in the same order; isend posting, late-RECV delay and the
message latency read off the same timelines; the traced runtime's time between actions (its own
bookkeeping, which pipesim's executor barely has) added to the per-action overhead; that share and the
co-run slowdown refined on the traces' step times by simulating each traced run
(`pipesim.calibration.refine`'s rule, on this model's costs).

What a trace cannot give: messages of one size do not separate latency from bandwidth, so the
latency carries the whole delivery time and the bandwidth is the one of `--hardware`'s link (the
default `local-cpu` preset's loopback); the host's cores are this machine's unless `cores` is given.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import schedules as registry
from pipesim.calibration.calibrate import build_hardware
from pipesim.calibration.fit import ComputeFit, fit_compute, typical_samples
from pipesim.calibration.measured import (
    action_samples,
    comm_action_seconds,
    in_run_latency,
    late_recv_delay,
    measured_steps,
    typical_metrics,
)
from pipesim.cost.model_costs import model_costs
from pipesim.cost.stage_work import stage_work
from pipesim.cost.user_model_costs import UserModel
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.model.config import ModelConfig
from pipesim.sim.sim_setup import SimSetup
from pipesim.timeline import Timeline

CORUN_MAX, CORUN_STEPS = 0.5, 50  # the grid of refine_corun


@dataclass(frozen=True)
class TraceCalibration:
    """The hardware fitted to traced runs, and how well it predicts each of them."""

    hardware: Hardware
    compute: ComputeFit
    measured: list[float]  # seconds: each timeline's typical step (interquartile mean of its measured steps)
    predicted: list[float]  # seconds: the simulated step of each traced run on `hardware`

    def errors(self) -> list[float]:
        return [p / m - 1 for p, m in zip(self.predicted, self.measured, strict=True)]

    def summary(self) -> str:
        c = self.compute
        runs = "; ".join(f"measured {m * 1e3:.3f} ms, predicted {p * 1e3:.3f} ms ({e:+.1%})"
                         for m, p, e in zip(self.measured, self.predicted, self.errors(), strict=True))
        return (f"compute (fit on {c.samples} actions; mean |error| {c.mean_abs_error:.1%}): F {c.rate[0] / 1e9:.2f}, "
                f"I {c.rate[1] / 1e9:.2f}, W {c.rate[2] / 1e9:.2f} GFLOP/s; per-action overhead "
                f"{self.hardware.per_action_overhead * 1e6:.0f} us; co-run slowdown "
                f"{self.hardware.host.node_corun_slowdown:.3f}\nthe traced runs: {runs}")


def with_message_bytes(tl: Timeline, boundary: list[int]) -> Timeline:
    """The timeline with each SEND/RECV's bytes (`boundary[s]`: bytes out of stage s), which traces lack."""
    def nbytes(e) -> int:
        if e.stream not in ("send", "recv"):
            return e.bytes
        low = e.stage if e.kind in ("SEND_F", "RECV_B") else e.stage - 1
        return boundary[low] if 0 <= low < len(boundary) else 0

    return Timeline(tl.source, tl.schedule, tl.num_ranks, [replace(e, bytes=nbytes(e)) for e in tl.events],
                    dict(tl.meta))


def _fit(samples, cores: int) -> ComputeFit:
    """`pipesim.calibration.calibrate`'s candidates, richest first, until one is physical."""
    options = [("kinds", True), ("kinds", False), ("shared", False), ("shared", True)]
    candidates = [(m, sh, True, True) for m, sh in [*options, ("", False), ("", True)]]
    candidates += [("", True, False, True), ("", True, False, False)]
    for n, (mem, shared, per_op, fixed) in enumerate(candidates, start=1):
        try:
            return fit_compute(samples, cores=cores, memory=mem, shared=shared, per_op=per_op, fixed=fixed)
        except PipesimError:
            if n == len(candidates):
                raise
    raise AssertionError("unreachable")


def calibrate_from_timelines(timelines: list[Timeline], *, model: ModelConfig | None = None,
                             user_model: UserModel | None = None, base: Hardware, cores: int | None = None,
                             devices: int = 4) -> TraceCalibration:
    """Fit a hardware file to imported timelines of runs of `model` (pipesim's) or `user_model` (counted)."""
    if (model is None) == (user_model is None):
        raise PipesimError("calibrating from traces needs the model the run trained: --model mlp|gpt with its "
                           "sizes, or --model MODULE:FACTORY")
    cores = cores or os.cpu_count() or 1
    filled, groups, simulate_runs = [], {}, []
    for k, tl in enumerate(timelines):
        if tl.schedule not in registry.names():
            raise PipesimError(f"{tl.meta.get('imported_from', ['the trace'])[0]}: the schedule was not recognized "
                               f"({tl.schedule}); name it with --schedule")
        stages, m = tl.meta["p"] * tl.meta["v"], tl.meta["m"]
        if user_model is not None:
            work = user_model.stage_work(stages)
            boundary = [s["boundary"] for s in user_model.stage_sums(stages)]
        else:
            work, boundary = stage_work(model, stages, m), _boundaries(model, stages, m, base)
        tl = with_message_bytes(tl, boundary)
        filled.append(tl)
        for (stage, kind), sample in action_samples(tl, work):
            groups.setdefault((k, stage, kind), []).append(sample)
        sched = registry.build(tl.schedule, tl.meta["p"], m, tl.meta["v"] if tl.meta["v"] > 1 else None)
        simulate_runs.append(_simulator(sched, model, user_model))
    fit = _fit(typical_samples(groups), cores)
    send, _ = comm_action_seconds(filled)
    bandwidth = base.intra.bandwidth  # bytes/s: not separable from the latency with messages of one size
    latency = in_run_latency(filled, bandwidth, base.intra.latency)
    source = (f"pipesim calibrate --from-trace on {len(timelines)} imported timeline(s) "
              f"({', '.join(tl.schedule for tl in timelines)}); link bandwidth from {base.name}")
    between = between_actions(filled)  # seconds per action, outside the actions' own ranges
    hw = build_hardware(fit, overhead=fit.overhead + between, latency=latency, bandwidth=bandwidth,
                        membw=fit.bandwidth or base.device.hbm_bandwidth, cores=cores, devices=devices, source=source)
    hw = hw.with_host(send_overhead=send, late_recv_delay=late_recv_delay(filled))
    measured = [typical_metrics([tl])[0] for tl in filled]
    # the gap between actions is the least certain term (a traced SEND may hold waits a gap also shows): its share
    # of the per-action overhead on a grid (0 to 2x), then the co-run slowdown, each by the traced step times
    hw = _grid(hw, simulate_runs, measured,
               [{"per_action_overhead": fit.overhead + between * i / 10} for i in range(21)])
    hw = _grid(hw, simulate_runs, measured, [{"node_corun_slowdown": CORUN_MAX * i / CORUN_STEPS}
                                             for i in range(CORUN_STEPS + 1)])
    return TraceCalibration(hw, fit, measured, [run(hw) for run in simulate_runs])


def between_actions(timelines: list[Timeline]) -> float:
    """Mean seconds per compute action that a rank spends outside every recorded action (compute, SEND, RECV)
    between its first and last action of a measured step: the traced runtime's own work between actions
    (torch's schedule bookkeeping, the profiler's stack capture), which the simulator charges per action."""
    gap, actions = 0.0, 0
    for tl in timelines:
        for step in measured_steps(tl):
            for rank in range(tl.num_ranks):
                mine = sorted((e for e in tl.events if e.step == step and e.rank == rank
                               and e.stream in ("compute", "send", "recv")), key=lambda e: e.start)
                if not mine:
                    continue
                covered, reach = 0.0, mine[0].start
                for e in mine:  # the union of the intervals
                    if e.end > reach:
                        covered += e.end - max(e.start, reach)
                        reach = e.end
                gap += reach - mine[0].start - covered
                actions += sum(1 for e in mine if e.stream == "compute")
    return gap / actions if actions else 0.0


def _boundaries(model: ModelConfig, stages: int, m: int, hw: Hardware) -> list[int]:
    """Bytes out of each stage of pipesim's model (the cost model's boundary)."""
    table = model_costs(model, stages, m, hw).table
    return [st.boundary_bytes for st in table.stages]


def _simulator(sched, model: ModelConfig | None, user_model: UserModel | None) -> Callable[[Hardware], float]:
    """hw -> the simulated pipeline span of the traced run (what `typical_metrics` measures)."""
    def run(hw: Hardware) -> float:
        setup = SimSetup(hardware=hw, model=model, user_model=user_model, comm=True, check_memory=False)
        return setup.run(sched).makespan

    return run


def _grid(hw: Hardware, runs: list[Callable[[Hardware], float]], measured: list[float],
          values: list[dict]) -> Hardware:
    """`hw` with the host or hardware figures of `values` that best explain the traced step times
    (`pipesim.calibration.refine`'s rule: the mean relative error of the simulated steps)."""
    best = (float("inf"), hw)
    for value in values:
        host = {k: v for k, v in value.items() if k != "per_action_overhead"}
        cand = hw.with_host(**host) if host else hw
        if "per_action_overhead" in value:
            cand = replace(cand, per_action_overhead=value["per_action_overhead"])
        err = sum(abs(run(cand) / m - 1) for run, m in zip(runs, measured, strict=True)) / len(runs)
        if err < best[0]:
            best = (err, cand)
    return best[1]


__all__ = ["TraceCalibration", "calibrate_from_timelines", "with_message_bytes"]
