"""This rank's place in the (pp, dp, tp) grid and its process groups, all read off `ParallelDims`.

With experts (ep > 1) the same ranks also get their expert-parallel group (the ranks a MoE layer's tokens are
exchanged over) and their expert-data-parallel group (the replicas of the same experts, whose gradients are
averaged), both `ParallelDims.groups("ep" / "edp")`: Megatron-core's layout, etp innermost.

The executor builds its mesh from the run's one ParallelDims (`build_mesh_for(cfg.job_for(world).dims)`,
`executor.api.train`'s job's dims); nothing rebuilds the grid from loose sizes.

The layout itself (tp innermost, then dp, pp outermost, as Megatron-LM and torchtitan) belongs to
`pipesim.parallel_dims`; the simulator places devices with the same object, so the devices it times
are the ones these ranks run on. Nothing here computes a rank number by hand. Pipeline P2P uses
global ranks (`pp_peer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from pipesim.parallel_dims import Coords, ExpertCoords, ParallelDims

GROUP_AXES = ("dp", "tp", "ep", "edp")  # the axes that get a process group, created in this order on every rank


@dataclass
class Mesh:
    """One rank's view of the grid: coordinates, group members, and its DP, TP, EP and EDP groups (None when size 1).

    `Mesh(dims, rank)` alone (no groups) is the pure layout; `build_mesh_for` adds the process groups.
    """

    dims: ParallelDims
    rank: int  # global rank
    dp_group: object | None = None
    tp_group: object | None = None
    ep_group: object | None = None  # expert-parallel: the ranks a MoE layer's tokens are exchanged over
    edp_group: object | None = None  # expert-data-parallel: the replicas of this rank's experts
    coords: Coords = field(init=False)
    expert_coords: ExpertCoords = field(init=False)

    def __post_init__(self) -> None:
        self.coords = self.dims.coords(self.rank)
        self.expert_coords = self.dims.expert_coords(self.rank)

    @property
    def dp(self) -> int:
        return self.dims.dp

    @property
    def pp(self) -> int:
        return self.dims.pp

    @property
    def tp(self) -> int:
        return self.dims.tp

    @property
    def world(self) -> int:
        return self.dims.world

    def members(self, axis: str) -> list[int]:
        """Global ranks (ascending) of this rank's group along `axis`."""
        return self.dims.group(axis, self.rank)

    def pp_peer(self, pp_rank: int) -> int:
        """Global rank of pipeline rank `pp_rank` in this rank's (dp, tp) slice."""
        return self.dims.pp_peer(self.rank, pp_rank)


def build_mesh_for(dims: ParallelDims) -> Mesh:
    """This rank's Mesh with its DP, TP, EP and EDP groups (collective: every rank creates every group, in order);
    the grid must fill the process group exactly."""
    dims.check_world(dist.get_world_size())
    mesh = Mesh(dims, dist.get_rank())
    for axis in GROUP_AXES:  # new_group is collective over the world: same calls, same order, everywhere
        if getattr(dims, axis) == 1 or (axis in ("ep", "edp") and dims.ep == 1):  # a dense run needs neither
            continue
        for members in dims.groups(axis):
            group = dist.new_group(members)
            if mesh.rank in members:
                setattr(mesh, f"{axis}_group", group)
    return mesh
