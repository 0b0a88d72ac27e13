"""The compute-time rule, written once: the hardware model evaluates it, the calibration fit inverts it.

An action's seconds = its FLOPs at a rate per kind of work (F, I, W) and its memory traffic at a rate
per kind, overlapped (`roofline = "max"`, GPUs) or added (`"sum"`, CPU cores), plus a fixed cost per
action and per framework op (the ops of I and W work at their own price when one is set), plus, for
a split-backward I or W, the runtime's bookkeeping (`SplitCosts`). `Hardware.compute_time` and
`pipesim.calibration.fit.ComputeFit.predict` both call `action_seconds` (and `SplitCosts.add_to`), so
a fitted figure means exactly what the simulator does with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

KINDS = ("F", "I", "W")  # the kinds of work, in the order of every per-kind tuple below


@dataclass(frozen=True)
class SplitCosts:
    """Bookkeeping of a split backward (I + W) that a fused B does not pay; seconds."""

    per_action: float = 0.0  # seconds added to each split I and W action
    per_group: float = 0.0  # seconds per parameter group of the stage, on each split W (autograd once per group)
    per_graph_op: float = 0.0  # seconds per backward op of the stage, on each split I (it walks the graph)

    def add_to(self, seconds: float, split: float = 1, groups: float = 0.0, graph: float = 0.0) -> float:
        """`seconds` plus the bookkeeping of `split` split actions with `groups` groups and `graph` graph ops.

        Added term by term in this order (the simulator's numbers depend on it, bit for bit).
        """
        seconds = seconds + split * self.per_action
        seconds = seconds + groups * self.per_group
        return seconds + graph * self.per_graph_op


@dataclass(frozen=True)
class CostEquation:
    """The figures of the rule; every tuple is per kind of work, in `KINDS` order."""

    flop_rates: tuple[float, float, float]  # FLOP/s achieved by F, I, W work
    memory_rates: tuple[float, float, float] | None = None  # bytes/s of F, I, W traffic (None: not charged)
    roofline: str = "max"  # "max": arithmetic and memory traffic overlap; "sum": they add up
    per_action: float = 0.0  # seconds per action (dispatch)
    per_op: float = 0.0  # seconds per framework op of F work (of all work when backward_per_op is None)
    backward_per_op: float | None = None  # seconds per framework op of I and W work (autograd's engine)
    split: SplitCosts = field(default_factory=SplitCosts)


def action_seconds(eq: CostEquation, flops: Sequence[float], moved: Sequence[float] = (0.0, 0.0, 0.0), *,
                   actions: float = 1, ops: float = 0.0, backward_ops: float = 0.0) -> float:
    """Seconds of `actions` actions' work: `flops` and `moved` bytes per kind, `ops` framework ops of which
    `backward_ops` are of I and W work. Split bookkeeping is not included (`eq.split.add_to`)."""
    compute = sum(f / r for f, r in zip(flops, eq.flop_rates) if f)  # seconds
    memory = sum(b / w for b, w in zip(moved, eq.memory_rates) if b) if eq.memory_rates else 0.0  # seconds
    back = eq.per_op if eq.backward_per_op is None else eq.backward_per_op
    fixed = actions * eq.per_action + (ops - backward_ops) * eq.per_op + backward_ops * back  # seconds
    if eq.roofline == "sum":
        return compute + memory + fixed
    return max(compute, memory) + fixed


__all__ = ["KINDS", "CostEquation", "SplitCosts", "action_seconds"]
