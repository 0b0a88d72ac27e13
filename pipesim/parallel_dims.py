"""The rank layout: the one place that knows which global rank holds which (pp, dp, cp, tp) coordinate.

Megatron-LM and torchtitan order the axes tp innermost, then cp, then dp, with pp outermost:
rank = ((pp * dp + d) * cp + c) * tp + t. Consecutive ranks share a node (torchrun gives node n the
ranks n * nproc_per_node ...), so the tensor-parallel group, the chattiest (blocking collectives in
every layer), stays on NVLink; data-parallel replicas of a stage come next; pipeline neighbours,
which exchange one activation per microbatch, are the ones allowed to cross nodes. The executor's
process groups and the simulator's device placement both read the layout from here; device ids are
global ranks (node-major), so `node_of` is plain division.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError

AXES = ("pp", "dp", "cp", "tp")  # outermost first


@dataclass(frozen=True)
class Coords:
    """One rank's position on each axis."""

    pp: int
    dp: int
    cp: int
    tp: int


@dataclass(frozen=True)
class ParallelDims:
    """Sizes of the parallel axes; validates in __post_init__ (PipesimError, one line)."""

    pp: int = 1  # pipeline ranks (the schedule's num_ranks)
    dp: int = 1  # data-parallel replicas of each stage
    tp: int = 1  # tensor-parallel shards of each stage
    cp: int = 1  # context-parallel shards of each sequence (room for it; 1 today)

    def __post_init__(self) -> None:
        for name in AXES:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PipesimError(f"{name} must be a positive integer, got {value!r}")

    @property
    def world(self) -> int:
        """Ranks in all: pp * dp * cp * tp."""
        return self.pp * self.dp * self.cp * self.tp

    def check_world(self, world: int) -> None:
        """PipesimError showing the arithmetic when the grid does not fill `world` ranks exactly."""
        if self.world != world:
            cp = f" * cp({self.cp})" if self.cp > 1 else ""
            raise PipesimError(f"dp({self.dp}) * pp({self.pp}){cp} * tp({self.tp}) != WORLD_SIZE({world})")

    def rank(self, *, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        """Global rank of a coordinate (pp outermost, tp innermost)."""
        for name, value in (("pp", pp), ("dp", dp), ("cp", cp), ("tp", tp)):
            if not 0 <= value < getattr(self, name):
                raise PipesimError(f"{name} coordinate {value} is outside 0..{getattr(self, name) - 1}")
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def coords(self, rank: int) -> Coords:
        """Coordinates of a global rank (the inverse of `rank`)."""
        if not 0 <= rank < self.world:
            raise PipesimError(f"rank {rank} is outside 0..{self.world - 1}")
        rest, t = divmod(rank, self.tp)
        rest, c = divmod(rest, self.cp)
        p, d = divmod(rest, self.dp)
        return Coords(pp=p, dp=d, cp=c, tp=t)

    def group(self, axis: str, rank: int) -> list[int]:
        """Members (global ranks, ascending) of `rank`'s group along `axis` ("pp", "dp", "cp" or "tp")."""
        if axis not in AXES:
            raise PipesimError(f"unknown axis {axis!r}; choose one of {', '.join(AXES)}")
        me = self.coords(rank)
        fixed = {name: getattr(me, name) for name in AXES if name != axis}
        return [self.rank(**fixed, **{axis: i}) for i in range(getattr(self, axis))]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along `axis`, in the order of their lowest rank (each rank in exactly one)."""
        seen: dict[int, list[int]] = {}
        for r in range(self.world):
            members = self.group(axis, r)
            seen.setdefault(members[0], members)
        return [seen[k] for k in sorted(seen)]

    def pp_peer(self, rank: int, pp_rank: int) -> int:
        """Global rank of pipeline rank `pp_rank` in `rank`'s (dp, cp, tp) slice."""
        me = self.coords(rank)
        return self.rank(pp=pp_rank, dp=me.dp, cp=me.cp, tp=me.tp)

    @staticmethod
    def node_of(rank: int, devices_per_node: int) -> tuple[int, int]:
        """(node, local device) of a global rank when each node runs `devices_per_node` ranks."""
        if devices_per_node < 1:
            raise PipesimError(f"devices per node must be >= 1, got {devices_per_node}")
        return divmod(rank, devices_per_node)


__all__ = ["AXES", "Coords", "ParallelDims"]
