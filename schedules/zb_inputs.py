"""What the searched zero-bubble schedules are searched for: per stage seconds of F, I, W, the hops, bytes.

Shared by the list scheduler (schedules.zb_auto), the paper's heuristic (schedules.zb_heuristic) and the
ILP (schedules.zb_ilp), which each read the same record so the three compare on one set of inputs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AutoCosts:
    """What the searches need, per stage (= rank): seconds and bytes."""

    forward: tuple[float, ...]  # seconds of F
    backward_input: tuple[float, ...]  # seconds of I
    backward_weight: tuple[float, ...]  # seconds of W
    comm: tuple[float, ...]  # seconds to move a tensor across boundary s -> s + 1 (p - 1 entries)
    activation: tuple[float, ...]  # bytes one microbatch stashes on the stage from F (the paper's M_B)
    limit: tuple[float, ...]  # bytes of activations each rank may hold
    # bytes of one microbatch still held from its I until its W (the paper's M_W); empty: all of `activation`
    weight_activation: tuple[float, ...] = ()

    def weight_bytes(self, stage: int) -> float:
        """Bytes W frees on `stage` (what I keeps for it)."""
        return self.weight_activation[stage] if self.weight_activation else self.activation[stage]

    @staticmethod
    def uniform(p: int, f: float, i: float, w: float, comm: float = 0.0, limit_microbatches: float = 0.0,
                weight_share: float | None = None) -> AutoCosts:
        """Equal stages, unit activation; `limit_microbatches` 0 means unlimited; `weight_share`: M_W / M_B."""
        limit = float(limit_microbatches) if limit_microbatches else float("inf")
        held = () if weight_share is None else (float(weight_share),) * p
        return AutoCosts((f,) * p, (i,) * p, (w,) * p, (comm,) * max(0, p - 1), (1.0,) * p, (limit,) * p, held)
