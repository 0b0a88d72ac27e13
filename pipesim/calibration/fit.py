"""Fitting the cost model to measured per-action times: least squares, no per-configuration factors.

Every compute action measured inside a run is one equation,

    n * overhead + f_F / R_F + f_I / R_I + f_W / R_W + b_F / BW_F + b_I / BW_I + b_W / BW_W + split * S
        + split * groups * G + ops * O = sum_k t_k * speed(k)

The right side is the action's work: the seconds it would have taken alone. t_k is how long it ran
while k ranks on its node were runnable (its own included; read off the timeline by
`pipesim.sim.host.sharing.runnable_profile`) and speed(k) is the processor-sharing rate the simulator
uses (`pipesim.sim.host.sharing.speed`: 1 alone, 1 / (1 + beta (k-1)) while every runnable rank has a
core, less again by turn-taking and gamma per runnable rank beyond the cores). On the left, n is 1
(2 for a fused B, which the simulator costs as I + W), f_* the FLOPs of the action's work (a B
carries both f_I and f_W; the executor's first stage has no input gradient, so its I is empty and
its W carries the whole backward), R_* the achieved FLOP/s per kind, b_* / BW_* the memory traffic
per kind (on a CPU it does not overlap the arithmetic, so small microbatches, which move as many
weight bytes for fewer FLOPs, run at lower FLOP/s; a forward reads the weights, a weight gradient
writes and accumulates them, at other rates; `memory="shared"` fits one BW for all kinds) and S
the runtime's bookkeeping for a split I or W (plus, on W, G per parameter group of the stage: the weight
gradient runs autograd once per group), and O the cost of each framework op the action runs
(eager dispatch: it makes a narrow model's many small ops dear). For fixed (beta, gamma) the
equation is linear in (overhead, 1/R_*, 1/BW_*, S, O, G); beta and gamma are found by a scan.
Errors are relative (each equation divided by its work), so short actions count as much as long
ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from pipesim.cost.cost_equation import CostEquation, SplitCosts, action_seconds
from pipesim.errors import PipesimError
from pipesim.sim.host.sharing import speed


@dataclass(frozen=True)
class Sample:
    """One measured compute action."""

    flops: tuple[float, float, float]  # FLOPs attributed to (F, I, W) rates
    seconds: float  # measured duration
    profile: tuple[float, ...] = ()  # seconds of it with 1, 2, ... ranks runnable on its node (empty: alone)
    overheads: int = 1  # per-action overheads the simulator charges (2 for a fused B = I + W)
    moved: tuple[float, float, float] = (0.0, 0.0, 0.0)  # bytes of memory traffic counted for (F, I, W) work
    split: int = 0  # 1 for a split-backward I or W action (pays the split bookkeeping), else 0
    ops: float = 0.0  # framework ops the cost model counts for this action
    groups: float = 0.0  # split W: the stage's ops with weights (parameter groups); else 0
    backward_ops: float = 0.0  # of `ops`, those of I and W work (autograd's engine runs them)
    graph: float = 0.0  # split I: the stage's backward ops (the autograd graph it walks); else 0

    def work(self, cores: int, corun: float, oversub: float = 0.0) -> float:
        """Seconds the action would have taken alone, under the processor-sharing model."""
        if not self.profile:
            return self.seconds
        return sum(t * speed(k, cores, corun, oversub) for k, t in enumerate(self.profile, start=1) if t)


@dataclass(frozen=True)
class ComputeFit:
    """Achieved rates per kind, per-action overhead and the sharing figures, with the fit's residuals."""

    rate: tuple[float, float, float]  # FLOP/s of F, I, W work
    overhead: float  # seconds per compute action
    corun: float  # beta: fractional slowdown per other runnable rank while each has a core
    mean_abs_error: float  # mean |predicted / measured work - 1| over the samples
    samples: int
    bandwidth: float | None = None  # bytes/s of F's memory traffic, added to the arithmetic (None: not fitted)
    split_overhead: float = 0.0  # seconds added to each split I or W action
    oversub: float = 0.0  # gamma: fractional slowdown per runnable rank beyond the cores
    memory_kinds: tuple[float, float, float] | None = None  # bytes/s of (F, I, W) traffic (None: all `bandwidth`)
    per_op: float = 0.0  # seconds per framework op (of F work; of all work when per_op_backward is None)
    split_group: float = 0.0  # seconds per parameter group of the stage, on each split W action
    per_op_backward: float | None = None  # seconds per framework op of I and W work
    split_graph: float = 0.0  # seconds per backward op of the stage, on each split I action

    def bandwidths(self) -> tuple[float, float, float] | None:
        """Bytes/s of the memory traffic of F, I and W work (None: memory not fitted)."""
        if not self.bandwidth:
            return None
        return self.memory_kinds or (self.bandwidth,) * 3

    def predict(self, flops: tuple[float, float, float], overheads: int = 1,
                moved: tuple[float, float, float] = (0.0, 0.0, 0.0), split: int = 0, ops: float = 0.0,
                groups: float = 0.0, backward_ops: float = 0.0, graph: float = 0.0) -> float:
        """Seconds of an action's work alone (the simulator's duration before sharing): the simulator's own
        rule (`pipesim.cost.cost_equation`) on the fitted figures."""
        eq = self.equation()
        seconds = action_seconds(eq, flops, moved, actions=overheads, ops=ops, backward_ops=backward_ops)
        return eq.split.add_to(seconds, split, groups, graph)

    def equation(self) -> CostEquation:
        """The fitted figures as the cost equation the hardware evaluates (memory traffic added: a CPU core)."""
        return CostEquation(self.rate, self.bandwidths(), "sum", self.overhead, self.per_op, self.per_op_backward,
                            SplitCosts(self.split_overhead, self.split_group, self.split_graph))


def typical_samples(groups: dict[object, list[Sample]]) -> list[Sample]:
    """One sample per group (e.g. per run, stage and kind): the one of median duration (the lower for an even count).

    Measured actions are heavy-tailed (a rank descheduled for a time slice, a neighbour on the
    host), and a least-squares fit over every action follows those outliers; the median action of
    each kind of work, with its own runnable profile, does not.
    """
    out = []
    for key in sorted(groups, key=str):
        ranked = sorted(groups[key], key=lambda s: s.seconds)
        out.append(ranked[(len(ranked) - 1) // 2])
    return out


def _rows(samples: list[Sample], memory: str, shared: bool) -> np.ndarray:
    """Columns: overheads, FLOPs of F, I, W, bytes of F, I, W, split, F's ops, split groups, I and W's
    ops, split I's graph."""
    rows = []
    for s in samples:
        flops = [sum(s.flops), 0.0, 0.0] if shared else list(s.flops)  # shared: all FLOPs in the F column
        if memory == "kinds":
            moved = list(s.moved)
        elif memory == "shared":
            moved = [sum(s.moved), 0.0, 0.0]
        else:
            moved = [0.0, 0.0, 0.0]
        rows.append([float(s.overheads), *flops, *moved, float(s.split), float(s.ops - s.backward_ops),
                     float(s.groups), float(s.backward_ops), float(s.graph)])
    return np.array(rows)


def _solve(a: np.ndarray, work: np.ndarray) -> tuple[np.ndarray, float]:
    """Least squares of a @ x = work with x >= 0, each row relative to its work; returns x and the relative SSE.

    Every unknown is a time per unit (an inverse rate, an overhead), so none may be negative: a term
    the data cannot see (collinear with others, as the per-op and per-action costs are in a small
    plan) is dropped and the rest refitted, the most negative first (an active-set NNLS).
    """
    w = 1.0 / work
    used = a.any(axis=0)  # a kind never measured (e.g. no I/W runs) keeps an undetermined rate
    x = np.zeros(a.shape[1])
    while used.any():
        sol, *_ = np.linalg.lstsq(a[:, used] * w[:, None], np.ones_like(work), rcond=None)
        x[:] = 0.0
        x[used] = sol
        if (sol >= 0).all():
            break
        used[np.flatnonzero(used)[int(np.argmin(sol))]] = False
    resid = (a @ x) * w - 1.0
    return x, float(resid @ resid)


def _grid(top: float, step: float, on: bool) -> np.ndarray:
    return np.arange(0.0, top + step / 2, step) if on else np.array([0.0])


def fit_compute(samples: list[Sample], *, cores: int = 1, corun_max: float = 0.5, corun_step: float = 0.005,
                oversub_max: float = 1.0, oversub_step: float = 0.02, fit_corun: bool = True,
                memory: str | bool = False, shared: bool = False, per_op: bool = True,
                fixed: bool = True) -> ComputeFit:
    """Fit rates, overhead, the sharing figures (beta; gamma where runs had more runnable ranks than
    cores) and optionally memory bandwidth; PipesimError when the data cannot tell.

    `memory`: False (no memory term), "shared" (True: one bandwidth) or "kinds" (one per kind).
    `shared`: one FLOP rate for all kinds (for data too small or noisy to tell the kinds apart).
    `per_op`: fit the per-op and per-parameter-group costs (off: plans too small to tell them from FLOPs).
    `fixed`: fit the per-action and split costs (off: FLOP rates alone, which any positive data determine).
    """
    memory = "shared" if memory is True else (memory or "")
    if len(samples) < 4:
        raise PipesimError(f"need at least 4 measured compute actions to fit, got {len(samples)}")
    a = _rows(samples, memory, shared)
    if not per_op:
        a[:, 8:] = 0.0
    if not fixed:
        a[:, [0, 7]] = 0.0
    width = max(1, *(len(s.profile) for s in samples))
    prof = np.zeros((len(samples), width))  # seconds with 1..width runnable ranks, per sample
    for i, s in enumerate(samples):
        p = s.profile or (s.seconds,)  # no profile: ran alone
        prof[i, :len(p)] = p
    crowded = width > cores and bool(prof[:, cores:].any())
    best = None
    for beta in _grid(corun_max, corun_step, fit_corun):
        for gamma in _grid(oversub_max, oversub_step, fit_corun and crowded):
            rates = np.array([speed(k, cores, float(beta), float(gamma)) for k in range(1, width + 1)])
            x, sse = _solve(a, prof @ rates)
            if best is None or sse < best[0]:
                best = (sse, float(beta), float(gamma), x)
    _, beta, gamma, x = best
    if shared:
        x[2] = x[3] = x[1]
    inv = x[1:4]
    if memory == "kinds":  # the bandwidth of every kind that moved bytes
        mem_cols = [4 + k for k in range(3) if any(s.moved[k] for s in samples)]
    else:
        mem_cols = [4] if memory else []
    if any(x[c] <= 0 for c in mem_cols):
        raise PipesimError("calibration fit gave a non-positive memory bandwidth: the measured actions do not "
                           "separate arithmetic from memory traffic (add microbatch sizes)")
    if (inv[[any(s.flops[k] for s in samples) for k in range(3)]] <= 0).any():
        raise PipesimError("calibration fit gave a non-positive compute rate: the measured actions "
                           "do not vary enough in size (add configurations)")
    rate = tuple(float(1.0 / v) if v > 0 else 0.0 for v in inv)
    bandwidth = float(1.0 / x[4]) if memory else None
    kinds = None
    if memory == "kinds":  # a kind without traffic in the data keeps F's bandwidth
        kinds = tuple(float(1.0 / x[4 + k]) if x[4 + k] > 0 else bandwidth for k in range(3))
    fit = ComputeFit(rate=rate, overhead=float(x[0]), corun=beta, mean_abs_error=0.0, samples=len(samples),
                     bandwidth=bandwidth, split_overhead=float(x[7]), oversub=gamma, memory_kinds=kinds,
                     per_op=float(x[8]), split_group=float(x[9]), per_op_backward=float(x[10]),
                     split_graph=float(x[11]))  # all >= 0: _solve keeps them so
    rel = [abs(fit.predict(s.flops, s.overheads, s.moved, s.split, s.ops, s.groups, s.backward_ops, s.graph)
               / s.work(cores, beta, gamma) - 1) for s in samples]
    return replace(fit, mean_abs_error=float(np.mean(rel)))


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


__all__ = ["ComputeFit", "Sample", "fit_compute", "fit_link", "typical_samples"]
