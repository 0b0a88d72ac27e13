"""The (dp, pp, tp) process grid: `arange(world).view(dp, pp, tp)`, tp innermost (as picotron).

tp innermost keeps a stage's tensor-parallel ranks on adjacent ranks (one node); each rank reads
its coordinates and its DP and TP groups off the grid. Pipeline P2P uses global ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Coords:
    dp: int
    pp: int
    tp: int


def grid(dp: int, pp: int, tp: int) -> torch.Tensor:
    return torch.arange(dp * pp * tp).view(dp, pp, tp)


def coords_of(rank: int, dp: int, pp: int, tp: int) -> Coords:
    """Coordinates of a global rank on the grid."""
    d, rest = divmod(rank, pp * tp)
    p, t = divmod(rest, tp)
    return Coords(d, p, t)


@dataclass
class Mesh:
    """One rank's view of the grid: its coordinates, its DP and TP groups (None when size 1)."""

    dp: int
    pp: int
    tp: int
    rank: int
    coords: Coords
    dp_group: object | None = None
    tp_group: object | None = None

    def pp_peer(self, pp_rank: int) -> int:
        """Global rank of pipeline rank `pp_rank` in this rank's (dp, tp) slice."""
        return (self.coords.dp * self.pp + pp_rank) * self.tp + self.coords.tp

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp


def build_mesh(dp: int, pp: int, tp: int) -> Mesh:
    """Create the DP and TP groups; every rank creates every group, in the same order."""
    rank = dist.get_rank()
    g = grid(dp, pp, tp)
    me = coords_of(rank, dp, pp, tp)
    dp_group = tp_group = None
    if dp > 1:
        for p in range(pp):
            for t in range(tp):
                group = dist.new_group(g[:, p, t].tolist())
                if (p, t) == (me.pp, me.tp):
                    dp_group = group
    if tp > 1:
        for d in range(dp):
            for p in range(pp):
                group = dist.new_group(g[d, p, :].tolist())
                if (d, p) == (me.dp, me.pp):
                    tp_group = group
    return Mesh(dp, pp, tp, rank, me, dp_group, tp_group)
