"""`pipesim calibrate --quick --rescale PRESET`: a hardware file's model kept, its speed fitted to this machine.

A full calibration needs minutes of runs to pin down a dozen figures; a first run (`make demo`) has seconds.
What differs most between two machines of one kind is their speed, so the quick path keeps the given file's
model (rates per kind, overheads, co-run slowdown, time slices) and fits one factor s: every time figure
times s (compute and memory rates and link bandwidth divided by s; overheads, latencies and time slices
multiplied by s). The simulator's step is then exactly s times the base file's (every duration scales), so
the fit is a closed form: s = the median over the quick runs of measured step / predicted step. Its stated
precision is how far the runs' own ratios lie from s (the largest |ratio / s - 1|): how well one factor
explains the machine, on the runs it was fitted to.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, replace

from pipesim.calibration.measured import typical_metrics
from pipesim.calibration.plan import LECTURE_MLP, run_spec, simulate_run
from pipesim.calibration.speed_check import machine_key
from pipesim.hardware.machine import Hardware, LinkClass
from pipesim.timeline import Timeline

RESCALE_TOLERANCE_FLOOR = 0.15  # the speed probe's own spread on the 2-core box: 6.5-8.6 ms in 6 runs (whatif.md)


def rescale_plan() -> list[dict]:
    """Short 2-rank runs of the lecture MLP (the demo's model) that the factor is fitted to; the demo's own
    configuration (1f1b, m 8, hidden 1024) is left out, so the demo checks the file on a run it was not fitted to."""
    half = {**LECTURE_MLP, "hidden": 512}
    return [run_spec("rescale-mlp-zb-h1-m8", "zb-h1", 8, LECTURE_MLP, steps=6, warmup=2),
            run_spec("rescale-mlp-gpipe-m4", "gpipe", 4, LECTURE_MLP, steps=6, warmup=2),
            run_spec("rescale-mlp512-1f1b-m4", "1f1b", 4, half, steps=6, warmup=2)]


def scaled(hw: Hardware, s: float) -> Hardware:
    """`hw` running s times slower (s < 1: faster): every duration it implies times s."""
    dev = hw.device
    device = replace(dev, flops={k: v / s for k, v in dev.flops.items()}, hbm_bandwidth=dev.hbm_bandwidth / s)

    def link(x: LinkClass | None) -> LinkClass | None:
        if x is None:
            return None
        coll = {k: v / s for k, v in x.collective_bandwidth.items()} if x.collective_bandwidth else None
        return replace(x, bandwidth=x.bandwidth / s, peak_bandwidth=x.peak_bandwidth / s, latency=x.latency * s,
                       collective_bandwidth=coll)

    host = hw.host
    if host is not None:
        host = replace(host, time_slice=host.time_slice * s, send_overhead=host.send_overhead * s,
                       late_recv_delay=host.late_recv_delay * s,
                       split_backward_overhead=host.split_backward_overhead * s,
                       split_group_overhead=host.split_group_overhead * s,
                       split_graph_overhead=host.split_graph_overhead * s,
                       probe_seconds=host.probe_seconds * s)
    back = hw.backward_op_overhead * s if hw.backward_op_overhead is not None else None
    return replace(hw, device=device, intra=link(hw.intra), inter=link(hw.inter), scale_out=link(hw.scale_out),
                   per_action_overhead=hw.per_action_overhead * s, per_op_overhead=hw.per_op_overhead * s,
                   backward_op_overhead=back, host=host)


@dataclass(frozen=True)
class Rescale:
    """One quick fit: the factor, its stated precision, and the rescaled hardware."""

    hardware: Hardware
    factor: float  # this machine's durations / the base file's
    precision: float  # largest |run's ratio / factor - 1| over the fitted runs
    ratios: dict[str, float]  # run id -> measured step / base prediction
    probe: float  # seconds: median speed probe beside the runs (0.0 when none was recorded)

    def summary(self) -> str:
        runs = ", ".join(f"{k} {v:.3f}" for k, v in self.ratios.items())
        return (f"quick calibration: this machine runs {self.factor:.3f}x the time of {self.base_name} "
                f"(measured / predicted step: {runs}); one factor explains these runs to within "
                f"{self.precision:.1%}" + (f"; speed probe {self.probe * 1e3:.2f} ms" if self.probe else ""))

    @property
    def base_name(self) -> str:
        return self.hardware.name.removesuffix(" (rescaled)")


def rescale(base: Hardware, timelines: dict[str, list[Timeline]], runs: list[dict]) -> Rescale:
    """Fit the factor of `base` to the measured `timelines` of `runs` (closed form, see the module docstring)."""
    ratios = {r["id"]: typical_metrics(timelines[r["id"]])[0] / simulate_run(base, r).makespan for r in runs}
    s = statistics.median(ratios.values())
    precision = max(abs(x / s - 1) for x in ratios.values())
    probes = [float(tl.meta["probe"]) for tls in timelines.values() for tl in tls if tl.meta.get("probe")]
    probe = statistics.median(probes) if probes else 0.0
    hw = scaled(base, s)
    source = (f"{base.name} rescaled by pipesim calibrate --quick --rescale on {platform.node()} at "
              f"{time.strftime('%Y-%m-%d %H:%M')}: every duration x{s:.4f} (the median measured/predicted step of "
              f"{len(runs)} short 2-rank runs), which explains them to within {precision:.1%}; the rest of the model "
              f"is {base.name}'s ({base.source})")
    host = hw.host
    if host is not None:
        host = replace(host, probe_seconds=probe or host.probe_seconds,
                       probe_tolerance=max(precision, RESCALE_TOLERANCE_FLOOR), probe_machine=machine_key())
    hw = replace(hw, name=f"{base.name} (rescaled)", source=source, host=host)
    return Rescale(hw, s, precision, ratios, probe)


__all__ = ["RESCALE_TOLERANCE_FLOOR", "Rescale", "rescale", "rescale_plan", "scaled"]
