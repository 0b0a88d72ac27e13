"""Per-action durations and sizes: the one interface between cost models and consumers.

A CostTable holds, per stage, the seconds of F, I and W for one microbatch (B = I + W) and the
bytes that cross the stage boundary. Hand-written (`--cost F=1,B=2`) or derived from a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action, Kind


@dataclass(frozen=True)
class StageCosts:
    """What one microbatch costs on one stage."""

    forward: float  # seconds
    backward_input: float  # seconds (I)
    backward_weight: float  # seconds (W)
    boundary_bytes: int = 0  # bytes sent to stage + 1 per microbatch (the gradient back is the same size)
    activation_bytes: int = 0  # bytes stashed per in-flight microbatch until its backward
    param_bytes: int = 0  # bytes of this stage's parameters (gradients are the same size)
    flops_forward: float = 0.0  # FLOPs of F per microbatch (0 when costs are given directly)
    weight_ops: float = 0.0  # ops with weights (parameter groups a split backward handles one by one)
    backward_ops: float = 0.0  # framework ops of the stage's backward (I + W): the graph a split I walks
    recompute_bytes: int = 0  # bytes a recomputed layer re-creates, live during that layer's backward only
    host_seconds: tuple[float, float, float] = (0.0, 0.0, 0.0)  # seconds the host takes to launch F, I, W where it
    # cannot run ahead of the GPU (pipesim.cost.host_issue): each action lasts at least as long
    split_rerun: float = 0.0  # seconds a split W adds on a calibrated CPU host: the executor's checkpoint re-runs
    # full recomputation's forward in W too (pipesim.cost.stage_work.Work.split_rerun); a fused B and I pay none

    @property
    def backward(self) -> float:
        return self.backward_input + self.backward_weight

    @property
    def microbatch_seconds(self) -> float:
        """Seconds of one microbatch's F and B here, each at least its host's launch seconds (collectives aside)."""
        if not any(self.host_seconds):
            return self.forward + self.backward_input + self.backward_weight
        return max(self.forward, self.host(Kind.F)) + max(self.backward, self.host(Kind.B))

    def host(self, kind: Kind) -> float:
        """Seconds the host takes to launch a compute action of this stage (B: I and W), 0 where it runs ahead."""
        f, i, w = self.host_seconds
        return {Kind.F: f, Kind.I: i, Kind.W: w, Kind.B: i + w}.get(kind, 0.0)


@dataclass(frozen=True)
class CostTable:
    """Costs of every stage; `duration(action)` is what simulators and critical paths call."""

    stages: tuple[StageCosts, ...]
    # an overlapped forward + backward (OVERLAP_F_B) takes `overlap_given` seconds when set (--cost FB=),
    # else max(F, B) + overlap_share * min(F, B): 1.0 runs the halves back to back (CPU), 0 hides one fully
    overlap_share: float = 1.0
    overlap_given: float | None = None  # seconds

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def duration(self, action: Action) -> float:
        """Seconds of a compute action; 0 for P2P actions (links are timed by the simulator)."""
        c = self.stages[action.stage]
        if action.kind == Kind.F:
            return c.forward
        if action.kind == Kind.B:
            return c.backward
        if action.kind == Kind.I:
            return c.backward_input
        if action.kind == Kind.W:
            return c.backward_weight
        return 0.0

    def overlap_seconds(self, forward: float, backward: float) -> float:
        """Seconds of one overlapped pair whose halves alone take `forward` and `backward` seconds."""
        if self.overlap_given is not None:
            return self.overlap_given
        return max(forward, backward) + self.overlap_share * min(forward, backward)

    def overlap_forward_seconds(self, forward: float, backward: float) -> float:
        """What the forward half adds to its backward half's `backward` seconds in an overlapped pair:
        `overlap_seconds - backward`, written so that share 1 leaves `forward` exactly as it is."""
        if self.overlap_given is not None:
            return self.overlap_given - backward
        return forward - (1.0 - self.overlap_share) * min(forward, backward)

    def transfer_bytes(self, action: Action) -> int:
        """Bytes a SEND/RECV moves: the activation (F) or gradient (B) at the stage boundary."""
        if action.kind in (Kind.SEND_F, Kind.RECV_B):
            return self.stages[action.stage].boundary_bytes
        if action.kind in (Kind.RECV_F, Kind.SEND_B):
            return self.stages[action.stage - 1].boundary_bytes
        return 0

    def scaled(self, factor: float) -> CostTable:
        return CostTable(
            tuple(
                replace(c, forward=c.forward * factor, backward_input=c.backward_input * factor,
                        backward_weight=c.backward_weight * factor, split_rerun=c.split_rerun * factor)
                for c in self.stages
            )
        )

    @staticmethod
    def uniform(num_stages: int, forward: float, backward_input: float, backward_weight: float,
                boundary_bytes: int = 0, activation_bytes: int = 0, param_bytes: int = 0) -> CostTable:
        one = StageCosts(forward, backward_input, backward_weight, boundary_bytes, activation_bytes, param_bytes)
        return CostTable(tuple(one for _ in range(num_stages)))


def parse_cost_spec(text: str) -> dict[str, float]:
    """Parse `F=1,B=2` or `F=1,I=1,W=1` into {'F', 'I', 'W'} seconds (B splits evenly into I and W);
    `FB=2.5` adds the seconds of an overlapped forward + backward (key 'FB')."""
    values: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().upper()
        if not sep or key not in ("F", "B", "I", "W", "FB"):
            raise PipesimError(f"malformed --cost {text!r}: expected F=<s>,B=<s> or F=<s>,I=<s>,W=<s>")
        if key in values:
            raise PipesimError(f"--cost {text!r} gives {key} twice")
        try:
            values[key] = float(value)
        except ValueError:
            raise PipesimError(f"malformed --cost {text!r}: {value.strip()!r} is not a number") from None
        if not math.isfinite(values[key]) or values[key] < 0:
            raise PipesimError(f"--cost {key} must be a finite number >= 0, got {values[key]}")
    if "F" not in values:
        raise PipesimError(f"--cost {text!r} needs F=<seconds>")
    if "B" in values and ("I" in values or "W" in values):
        raise PipesimError(f"--cost {text!r}: give B, or I and W, not both")
    extra = {"FB": values["FB"]} if "FB" in values else {}
    if "B" in values:
        out = {"F": values["F"], "I": values["B"] / 2, "W": values["B"] / 2, **extra}
    elif "I" not in values or "W" not in values:
        raise PipesimError(f"--cost {text!r} needs B=<s>, or both I=<s> and W=<s>")
    else:
        out = {"F": values["F"], "I": values["I"], "W": values["W"], **extra}
    if "FB" in out and out["FB"] < max(out["F"], out["I"] + out["W"]):
        raise PipesimError(f"--cost FB={out['FB']} is shorter than its longer half max(F, B)")
    return out
