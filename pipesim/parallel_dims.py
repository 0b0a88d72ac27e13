"""The rank layout: the one place that knows which global rank holds which (pp, dp, cp, tp) coordinate.

Megatron-LM and torchtitan order the axes tp innermost, then cp, then dp, with pp outermost:
rank = ((pp * dp + d) * cp + c) * tp + t. Consecutive ranks share a node (torchrun gives node n the
ranks n * nproc_per_node ...), so the tensor-parallel group, the chattiest (blocking collectives in
every layer), stays on NVLink; data-parallel replicas of a stage come next; pipeline neighbours,
which exchange one activation per microbatch, are the ones allowed to cross nodes. The executor's
process groups and the simulator's device placement both read the layout from here; device ids are
global ranks (node-major), so `node_of` is plain division.

A mixture-of-experts layer sees the same ranks with (pp, edp, ep, etp) coordinates, laid out as
Megatron-core does (megatron/core/parallel_state.py, `initialize_model_parallel`: a second
`RankGenerator` with tp=expert_tensor_parallel_size, ep=expert_model_parallel_size,
dp=expert_data_parallel_size and cp=1 over the default order "tp-cp-ep-dp-pp"): etp innermost, then
ep, then the expert-data-parallel axis edp, with the same pp outermost,
rank = ((pp * edp + e) * ep + x) * etp + t. Within each pipeline stage etp x ep x edp = tp x cp x dp,
so ep x etp must divide tp x cp x dp (edp is what is left; context-parallel ranks are
expert-data-parallel ones to the experts) and the pipeline groups are the dense ones. etp defaults
to tp (Megatron-core's default for --expert-tensor-parallel-size).

Worked example: tp 2, dp 4, ep 4, etp 1 (edp 2) on the 8 ranks of a stage. The dense layout pairs
tp groups [0, 1] [2, 3] [4, 5] [6, 7] and dp groups [0, 2, 4, 6] [1, 3, 5, 7]. The experts count
etp 1 innermost, so the ep groups are runs of 4 consecutive ranks, [0, 1, 2, 3] and [4, 5, 6, 7]:
each spans two dense tp groups (two data-parallel replicas, as tokens go), and each of its ranks
holds a quarter of the experts, whole (etp 1). The edp groups, which hold the same experts and
reduce their gradients, are a stride of ep * etp = 4 apart: [0, 4] [1, 5] [2, 6] [3, 7]; the etp
groups are single ranks. With etp 2 (tp's default) the same 8 ranks give etp groups [0, 1] [2, 3] ...,
ep groups [0, 2, 4, 6] and [1, 3, 5, 7] (the dense dp groups) and single-rank edp groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError

AXES = ("pp", "dp", "cp", "tp")  # outermost first
EXPERT_AXES = ("pp", "edp", "ep", "etp")  # the same ranks in a mixture-of-experts layer, outermost first


@dataclass(frozen=True)
class Coords:
    """One rank's position on each axis."""

    pp: int
    dp: int
    cp: int
    tp: int


@dataclass(frozen=True)
class ExpertCoords:
    """One rank's position in the experts' layout (its pp is its dense pp)."""

    pp: int
    edp: int
    ep: int
    etp: int


@dataclass(frozen=True)
class ParallelDims:
    """Sizes of the parallel axes; validates in __post_init__ (PipesimError, one line)."""

    pp: int = 1  # pipeline ranks (the schedule's num_ranks)
    dp: int = 1  # data-parallel replicas of each stage
    tp: int = 1  # tensor-parallel shards of each stage
    cp: int = 1  # context-parallel shards of each sequence (room for it; 1 today)
    ep: int = 1  # expert-parallel ranks: a MoE layer's experts sharded over them (--expert-model-parallel-size)
    etp: int | None = None  # tensor parallelism inside each expert (--expert-tensor-parallel-size); None: tp

    def __post_init__(self) -> None:
        for name in (*AXES, "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PipesimError(f"{name} must be a positive integer, got {value!r}")
        if self.etp is not None and (not isinstance(self.etp, int) or isinstance(self.etp, bool) or self.etp < 1):
            raise PipesimError(f"etp must be a positive integer, got {self.etp!r}")
        if (self.dp * self.cp * self.tp) % (self.ep * self.expert_tp):
            cp = f" * cp({self.cp})" if self.cp > 1 else ""
            raise PipesimError(f"dp({self.dp}){cp} * tp({self.tp}) is not divisible by ep({self.ep}) * "
                               f"etp({self.expert_tp}): a stage's ranks are etp x ep x edp to its experts")

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel shards of each expert: etp, or tp when not given (Megatron-core's default)."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert-data-parallel ranks (replicas of each expert shard in a stage): tp * cp * dp / (ep * etp)."""
        return self.dp * self.cp * self.tp // (self.ep * self.expert_tp)

    @property
    def dp_cp(self) -> int:
        """Ranks holding the same dense parameters: dp x cp. Megatron-core reduces their gradients and shards its
        distributed optimizer over them (parallel_state.get_data_parallel_group(with_context_parallel=True) in
        megatron/core/distributed/distributed_data_parallel.py and megatron/core/optimizer/__init__.py)."""
        return self.dp * self.cp

    @property
    def has_experts(self) -> bool:
        """An expert layout was asked for: ep > 1 or etp given."""
        return self.ep > 1 or self.etp is not None

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

    def expert_rank(self, *, pp: int = 0, edp: int = 0, ep: int = 0, etp: int = 0) -> int:
        """Global rank of a coordinate in the experts' layout (pp outermost, then edp, ep, etp innermost)."""
        for name, value in (("pp", pp), ("edp", edp), ("ep", ep), ("etp", etp)):
            if not 0 <= value < self._size(name):
                raise PipesimError(f"{name} coordinate {value} is outside 0..{self._size(name) - 1}")
        return ((pp * self.edp + edp) * self.ep + ep) * self.expert_tp + etp

    def expert_coords(self, rank: int) -> ExpertCoords:
        """Coordinates of a global rank in the experts' layout (the inverse of `expert_rank`)."""
        if not 0 <= rank < self.world:
            raise PipesimError(f"rank {rank} is outside 0..{self.world - 1}")
        rest, t = divmod(rank, self.expert_tp)
        rest, x = divmod(rest, self.ep)
        p, e = divmod(rest, self.edp)
        return ExpertCoords(pp=p, edp=e, ep=x, etp=t)

    def _size(self, axis: str) -> int:
        """Ranks along an axis of the experts' layout."""
        if axis == "edp":
            return self.edp
        return self.expert_tp if axis == "etp" else getattr(self, axis)

    def group(self, axis: str, rank: int) -> list[int]:
        """Members (global ranks, ascending) of `rank`'s group along `axis`: "pp", "dp", "cp" or "tp" of the dense
        layout, "dp_cp" (the dense parameters' replicas, `dp_cp`), "tp_dp_cp" (every rank of its pipeline stage:
        Megatron-core's amax reduction group, get_amax_reduction_group(with_context_parallel=True)), or "edp", "ep"
        or "etp" of the experts' (pp is the same in both)."""
        if axis in AXES:
            me = self.coords(rank)
            fixed = {name: getattr(me, name) for name in AXES if name != axis}
            return [self.rank(**fixed, **{axis: i}) for i in range(getattr(self, axis))]
        if axis == "dp_cp":  # dp and cp are adjacent axes: the ranks of my pp and tp
            me = self.coords(rank)
            return [self.rank(pp=me.pp, dp=d, cp=c, tp=me.tp) for d in range(self.dp) for c in range(self.cp)]
        if axis == "tp_dp_cp":  # the inner three axes: every rank of my pipeline stage
            me = self.coords(rank)
            return [self.rank(pp=me.pp, dp=d, cp=c, tp=t) for d in range(self.dp) for c in range(self.cp)
                    for t in range(self.tp)]
        if axis in EXPERT_AXES:
            mine = self.expert_coords(rank)
            fixed = {name: getattr(mine, name) for name in EXPERT_AXES if name != axis}
            return [self.expert_rank(**fixed, **{axis: i}) for i in range(self._size(axis))]
        choices = (*AXES, "dp_cp", "tp_dp_cp", *EXPERT_AXES[1:])
        raise PipesimError(f"unknown axis {axis!r}; choose one of {', '.join(choices)}")

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


__all__ = ["AXES", "EXPERT_AXES", "Coords", "ExpertCoords", "ParallelDims"]
