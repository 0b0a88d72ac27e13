"""A simulated candidate's figures (step time, tokens/s, MFU, peak memory, bubble, exposed comm) and why
each one lost to the winner: the largest of the differences its step time splits into.

step_time = compute + exposed comm + bubble + tail, each averaged over pipeline ranks: compute is the
busy time (with the TP collectives inside actions and any recomputation), exposed comm the time held by
pipeline messages in flight (pipesim.sim.blame.exposed_comm: a RECV's wait once its message was posted, a
blocking SEND), bubble the rest of the makespan (a RECV waiting for its sender to compute: fill, drain, an
unbalanced split), tail the data-parallel synchronisation and optimizer after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.cost.fp8_costs import mfu_peak
from pipesim.model.flops import model_flops, utilization
from pipesim.plan.evaluate import Costed
from pipesim.plan.space import Candidate, PlanRequest
from pipesim.sim.blame import exposed_comm
from pipesim.sim.result import SimResult

PARTS = ("compute", "exposed_comm", "bubble", "tail")


@dataclass(frozen=True)
class PlanRow:
    """One simulated candidate (seconds, bytes, fractions)."""

    candidate: Candidate
    step_time: float  # seconds
    tokens_per_s: float
    mfu: float  # model FLOPs (no recomputation, causal attention) over GPUs x dense peak (mfu_peak) x step time
    tflops_per_gpu: float  # model TFLOP/s per GPU
    peak_memory: int  # bytes on the fullest GPU
    bubble_fraction: float  # idle over makespan, averaged over ranks
    parts: dict[str, float]  # seconds: compute, exposed_comm, bubble, tail (sum = step_time)
    refused_recompute: bool = False  # a lighter recomputation of this layout did not fit memory
    # under `plan --jitter` (pipesim.plan.jitter): the mean step over the draws and its spread, seconds
    expected_step_time: float | None = None
    expected_step_std: float | None = None

    def sort_key(self) -> tuple:
        return (self.step_time, self.peak_memory, self.candidate)

    def to_dict(self) -> dict:
        c = self.candidate
        return {"schedule": c.schedule, "pp": c.p, "virtual": c.v, "tp": c.tp, "dp": c.dp, "cp": c.cp,
                "ep": c.ep, "etp": c.etp or c.tp,
                "microbatch_size": c.mbs, "microbatches": c.m, "recompute": c.recompute, "zero": c.zero,
                "sequence_parallel": c.sp, "step_time": self.step_time, "tokens_per_s": self.tokens_per_s,
                "mfu": self.mfu, "tflops_per_gpu": self.tflops_per_gpu, "peak_memory": self.peak_memory,
                "bubble_fraction": self.bubble_fraction, "parts": dict(self.parts),
                **({"expected_step_time": self.expected_step_time, "expected_step_std": self.expected_step_std}
                   if self.expected_step_time is not None else {})}


def step_model_flops(req: PlanRequest) -> float:
    """FLOPs of one step as MFU counts them (pipesim.model.flops.model_flops: no recomputation, causal half)."""
    return float(model_flops(req.model, req.model.batch))


def make_row(req: PlanRequest, costed: Costed, result: SimResult, flops: float) -> PlanRow:
    """The figures of one simulated candidate."""
    n = result.schedule.num_ranks
    busy = sum(result.busy(r) for r in range(n)) / n
    wait = sum(exposed_comm(result)) / n
    step = result.step_time
    parts = {"compute": busy, "exposed_comm": wait, "bubble": result.makespan - busy - wait,
             "tail": step - result.makespan}
    mfu, tflops = utilization(flops, step, req.gpus, mfu_peak(req.hardware, req.model, req.job.fp8))
    m = req.model
    return PlanRow(costed.candidate, step, m.batch * m.seq / step, mfu, tflops, costed.peak_memory,
                   result.bubble_fraction, parts)


def why_lost(row: PlanRow, best: PlanRow) -> str:
    """The largest difference to the winner, in words ('' for the winner itself)."""
    if row is best:
        return "fastest"
    if row.expected_step_time is not None and best.expected_step_time is not None:
        return (f"+{(row.expected_step_time - best.expected_step_time) * 1e3:.2f} ms expected under jitter "
                f"(ideal {(row.step_time - best.step_time) * 1e3:+.2f} ms)")
    return f"+{(row.step_time - best.step_time) * 1e3:.2f} ms: {_largest_difference(row, best)}"


def _largest_difference(row: PlanRow, best: PlanRow) -> str:
    """The part of the step (compute, exposed comm, bubble, tail) that grew the most, and why."""
    diffs = {k: row.parts[k] - best.parts[k] for k in PARTS}
    part = max(PARTS, key=lambda k: (diffs[k], -PARTS.index(k)))
    ms = diffs[part] * 1e3
    c, w = row.candidate, best.candidate
    if part == "compute" and c.recompute != w.recompute and row.refused_recompute:
        return f"memory-forced {c.recompute} recompute: +{ms:.2f} ms compute"
    if part == "compute" and c.recompute != w.recompute:
        return f"{c.recompute} recompute vs {w.recompute}: +{ms:.2f} ms compute"
    if part == "compute" and c.tp != w.tp:
        return f"tp {c.tp} vs {w.tp}: +{ms:.2f} ms compute (collectives, smaller matmuls)"
    if part == "compute" and c.cp != w.cp:
        return f"cp {c.cp} vs {w.cp}: +{ms:.2f} ms compute (ring attention hops, shorter matmuls)"
    if part == "bubble":
        return f"bubble {row.bubble_fraction * 100:.1f}% vs {best.bubble_fraction * 100:.1f}%: +{ms:.2f} ms"
    if part == "exposed_comm":
        return f"exposed communication +{ms:.2f} ms"
    if part == "tail":
        return f"data-parallel sync / optimizer +{ms:.2f} ms"
    return f"compute +{ms:.2f} ms"


__all__ = ["PARTS", "PlanRow", "make_row", "step_model_flops", "why_lost"]
