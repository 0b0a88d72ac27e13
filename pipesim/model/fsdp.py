"""FSDP2's resharding under ZeRO 3: when a chunk's parameters are gathered, when its gradients are reduced, and how
many of its parameters a rank holds at once (torchtitan's `--parallelism.fsdp_reshard_after_forward`).

torchtitan shards every transformer block as one FSDP unit (torchtitan/distributed/fsdp.py, apply_fsdp_to_decoder,
@ b5bcd76): a unit is gathered before its forward, and FSDP2 gathers the next unit while this one computes (its
implicit prefetch). `get_fsdp_reshard_after_forward_policy` decides whether a unit is freed after its forward:
"always" yes, "never" no, "default" only without pipelining ("For PP, by default do not reshard after forward to
avoid per-microbatch all-gathers"). A unit freed after its forward is gathered again for its backward.

After a backward the two runtimes differ. Without pipelining torchtitan's gradient-accumulation loop
(torchtitan/trainer.py, train_step) calls forward and backward with FSDP2's defaults every microbatch:
the unit is freed after its backward (reshard_after_backward) and its gradients are reduce-scattered then
(requires_gradient_sync). With pipelining, torch.distributed.pipelining's stages keep the units gathered and
their gradients unreduced until the chunk's last backward (`backward_maybe_with_nosync`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError

FSDP_RESHARD = ("default", "always", "never")  # torchtitan's fsdp_reshard_after_forward choices


@dataclass(frozen=True)
class FsdpPolicy:
    """What FSDP2 does with a ZeRO-3 chunk's gathered parameters between its computes."""

    after_forward: bool  # freed after each forward, gathered again for the backward
    after_backward: bool  # freed after each backward, its gradients reduce-scattered every microbatch

    @property
    def once_per_step(self) -> bool:
        """Gathered once (before the chunk's first forward) and reduced once (after its last backward)."""
        return not self.after_forward and not self.after_backward


def check_reshard(reshard: str) -> None:
    if reshard not in FSDP_RESHARD:
        raise PipesimError(f"unknown --fsdp-reshard-after-forward {reshard!r}; choose {', '.join(FSDP_RESHARD)}")


def fsdp_policy(reshard: str, pp: int) -> FsdpPolicy:
    """The policy of torchtitan's `reshard` choice on `pp` pipeline ranks (pp > 1: torch.distributed.pipelining)."""
    check_reshard(reshard)
    pipelined = pp > 1
    after_forward = {"always": True, "never": False, "default": not pipelined}[reshard]
    return FsdpPolicy(after_forward=after_forward, after_backward=not pipelined)


def fsdp_units(layers: int, *, first: bool, last: bool) -> int:
    """A chunk's FSDP units: its transformer blocks, the embedding on the first chunk and the head on the last (each
    fully_shard'ed on its own), at least one (the simulator's, the memory model's and the planner's one count)."""
    return max(1, layers + first + last)


def resident_fraction(policy: FsdpPolicy, units: int) -> float:
    """Fraction of a chunk's parameters gathered at a rank's peak: all of them when they stay gathered from the
    forward to the backward; otherwise the unit computing and the next one, prefetched (2 of `units`)."""
    if units < 1:
        raise PipesimError(f"an FSDP chunk has at least one unit, got {units}")
    return 1.0 if not policy.after_forward else min(2, units) / units


def gathered_seconds(now: float, start: float, end: float, compute: float, units: int) -> float:
    """Seconds a compute of `compute` seconds takes from `now` when its chunk's all-gather runs from `start` to
    `end` (>= now) in `units` equal parts, each unit computing once its part is in and the one before it is done:
    the later of the compute alone, the first part's arrival then the whole compute, and the last part's arrival
    then the last unit's share."""
    if units < 1:
        raise PipesimError(f"an FSDP chunk has at least one unit, got {units}")
    first = start + (end - start) / units
    return max(compute, first - now + compute, end - now + compute / units)


__all__ = ["FSDP_RESHARD", "FsdpPolicy", "check_reshard", "fsdp_policy", "fsdp_units", "gathered_seconds",
           "resident_fraction"]
