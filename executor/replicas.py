"""DualPipe's replicated stages: the ranks that hold one model stage sum its gradients before the optimizer.

A schedule with chains (`Schedule.chains`, DualPipe) runs every model stage once per chain, on
different ranks, with the same initial parameters; each copy sees its own chain's microbatches, so
the step's gradient is the sum of the copies'. Each rank swaps its replicated gradients with the
rank holding the other copy (one isend + irecv per partner: a two-rank all-reduce without a process
group) and adds them; a + b is b + a bit for bit, so the copies stay identical.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from executor.mesh import Mesh
from pipesim.ir.schedule import Schedule

_TAG = 1 << 30  # above every P2P tag of a step (executor.p2p: < 2 x stages x microbatches)


def _partners(schedule: Schedule, me: int) -> dict[int, list[int]]:
    """Partner rank -> this rank's stages whose other copy lives there, ordered by model stage (the
    partner lists the same model stages in the same order)."""
    out: dict[int, list[int]] = {}
    for s in sorted(schedule.stages_of(me), key=schedule.model_stage):
        for other in schedule.replicas(s):
            if other != s:
                out.setdefault(schedule.rank_of(other), []).append(s)
    return out


def sum_chain_replicas(schedule: Schedule, me: int, stages: dict, mesh: Mesh) -> int:
    """Add the other copies' gradients to this rank's replicated stages; returns the bytes exchanged."""
    nbytes = 0
    for partner, local in sorted(_partners(schedule, me).items()):
        params = [p for s in local for p in stages[s].params]
        if not params:  # identity stages (no layers): nothing to sum, on the partner either (same model stages)
            continue
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if partner == me:  # both copies on this rank (odd chain layouts): sum them pairwise
            raise NotImplementedError("two copies of one model stage on the same rank")
        mine = torch.cat([p.grad.reshape(-1) for p in params])
        theirs = torch.empty_like(mine)
        peer = mesh.pp_peer(partner)
        if dist.get_backend() == "nccl":  # one batch: NCCL would serialise the two ranks' sends
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)])
        else:
            works = [dist.isend(mine, peer, tag=_TAG), dist.irecv(theirs, peer, tag=_TAG)]
        for work in works:
            work.wait()
        total = mine + theirs if me < partner else theirs + mine  # one operand order on both ranks
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(total[offset:offset + n].view_as(p.grad))
            offset += n
        nbytes += mine.numel() * mine.element_size()
    return nbytes
