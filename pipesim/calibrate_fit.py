"""Fitting the cost model to measured per-action times: least squares, no per-configuration factors.

Every compute action measured inside a run is one equation,

    seconds = (n * overhead + f_F / R_F + f_I / R_I + f_W / R_W + bytes / BW) * corun(others)

(plus a fixed cost per split I or W action: the runtime's bookkeeping for splitting the backward;
bytes / BW only when fitting memory traffic too: on a CPU it does not overlap the arithmetic, so
small microbatches, which move as many weight bytes for fewer FLOPs, run at lower FLOP/s), where
n is 1 (2 for a fused B, which the simulator costs as I + W), f_* are the FLOPs of the
action's work (a B carries both f_I and f_W; the executor's first stage has no input gradient, so
its I is empty and its W carries the whole backward), R_* are the
achieved FLOP/s per kind, and corun(others) = 1 + beta * others is the slowdown when `others`
other ranks on the node were computing when the action started (memory bandwidth and caches are
shared even when every rank has a core). For a fixed beta the equation is linear in
(overhead, 1/R_F, 1/R_I, 1/R_W); beta is found by a scan. Errors are relative (each equation
divided by its measured seconds), so short actions count as much as long ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesim.errors import PipesimError


@dataclass(frozen=True)
class Sample:
    """One measured compute action."""

    flops: tuple[float, float, float]  # FLOPs attributed to (F, I, W) rates
    seconds: float  # measured duration
    others: int = 0  # other ranks on the node computing when it started (at most cores - 1 counted)
    overheads: int = 1  # per-action overheads the simulator charges (2 for a fused B = I + W)
    moved: float = 0.0  # bytes of memory traffic the cost model counts for this action
    split: int = 0  # 1 for a split-backward I or W action (pays the split bookkeeping), else 0


@dataclass(frozen=True)
class ComputeFit:
    """Achieved rates per kind, per-action overhead and co-run slowdown, with the fit's residuals."""

    rate: tuple[float, float, float]  # FLOP/s of F, I, W work
    overhead: float  # seconds per compute action
    corun: float  # beta: fractional slowdown per other computing rank
    mean_abs_error: float  # mean |predicted / measured - 1| over the samples
    samples: int
    bandwidth: float | None = None  # bytes/s of memory traffic, added to the arithmetic (None: not fitted)
    split_overhead: float = 0.0  # seconds added to each split I or W action

    def predict(self, flops: tuple[float, float, float], others: int = 0, overheads: int = 1,
                moved: float = 0.0, split: int = 0) -> float:
        work = sum(f / r for f, r in zip(flops, self.rate, strict=True) if f) + split * self.split_overhead
        if self.bandwidth:
            work += moved / self.bandwidth
        return (overheads * self.overhead + work) * (1.0 + self.corun * others)


def _solve(samples: list[Sample], beta: float, memory: bool, shared: bool = False) -> tuple[np.ndarray, float]:
    """Least squares (overhead, 1/R_F, 1/R_I, 1/R_W, 1/BW, split) for a given beta; returns them, relative SSE."""
    t = np.array([s.seconds for s in samples])
    g = np.array([1.0 + beta * s.others for s in samples])
    if shared:  # one rate for F, I and W: all FLOPs in the F column
        rows = [[float(s.overheads), sum(s.flops), 0.0, 0.0, s.moved if memory else 0.0, float(s.split)]
                for s in samples]
    else:
        rows = [[float(s.overheads), *s.flops, s.moved if memory else 0.0, float(s.split)] for s in samples]
    a = np.array(rows) * g[:, None]
    w = 1.0 / t
    used = a.any(axis=0)  # a kind never measured (e.g. no I/W runs) keeps an undetermined rate
    x = np.zeros(6)
    sol, *_ = np.linalg.lstsq(a[:, used] * w[:, None], t * w, rcond=None)
    x[used] = sol
    resid = (a @ x) * w - 1.0
    return x, float(resid @ resid)


def fit_compute(samples: list[Sample], *, corun_max: float = 1.0, corun_step: float = 0.005,
                fit_corun: bool = True, memory: bool = False, shared: bool = False) -> ComputeFit:
    """Fit rates, overhead, (optionally) beta and memory bandwidth; PipesimError when the data cannot tell.

    `shared`: one FLOP rate for all kinds (for data too small or noisy to tell the kinds apart).
    """
    if len(samples) < 4:
        raise PipesimError(f"need at least 4 measured compute actions to fit, got {len(samples)}")
    betas = np.arange(0.0, corun_max + corun_step / 2, corun_step) if fit_corun else np.array([0.0])
    best = min(((float(b), *_solve(samples, float(b), memory, shared)) for b in betas), key=lambda r: (r[2], r[0]))
    beta, x, _ = best
    if shared:
        x[2] = x[3] = x[1]
    inv = x[1:4]
    if memory and x[4] <= 0:
        raise PipesimError("calibration fit gave a non-positive memory bandwidth: the measured actions do not "
                           "separate arithmetic from memory traffic (add microbatch sizes)")
    if (inv[[any(s.flops[k] for s in samples) for k in range(3)]] <= 0).any():
        raise PipesimError("calibration fit gave a non-positive compute rate: the measured actions "
                           "do not vary enough in size (add configurations)")
    rate = tuple(float(1.0 / v) if v > 0 else 0.0 for v in inv)
    bandwidth = float(1.0 / x[4]) if memory else None
    fit = ComputeFit(rate=rate, overhead=max(0.0, float(x[0])), corun=beta, mean_abs_error=0.0,
                     samples=len(samples), bandwidth=bandwidth, split_overhead=max(0.0, float(x[5])))
    rel = [abs(fit.predict(s.flops, s.others, s.overheads, s.moved, s.split) / s.seconds - 1.0) for s in samples]
    return ComputeFit(fit.rate, fit.overhead, beta, float(np.mean(rel)), len(samples), bandwidth, fit.split_overhead)


def fit_link(sizes_seconds: list[tuple[int, float]]) -> tuple[float, float]:
    """(latency seconds, bandwidth bytes/s) from one-way message times: t = latency + bytes / bandwidth.

    The smallest message (or the next one, if that was faster) gives the latency, the slope to the
    largest the bandwidth: points that noise in the middle sizes cannot tip into a negative bandwidth.
    """
    if len(sizes_seconds) < 2:
        raise PipesimError("need at least two message sizes to fit latency and bandwidth")
    pts = sorted(sizes_seconds)
    (n0, t0), (n1, t1) = pts[0], pts[-1]
    if len(pts) > 2 and pts[1][1] < t0:  # one disturbed tiny message must not set the latency
        n0, t0 = pts[1]
    if n1 <= n0 or t1 <= t0:
        raise PipesimError("message times do not grow with size; cannot fit a bandwidth")
    bandwidth = (n1 - n0) / (t1 - t0)
    return max(0.0, t0 - n0 / bandwidth), bandwidth


__all__ = ["ComputeFit", "Sample", "fit_compute", "fit_link"]
