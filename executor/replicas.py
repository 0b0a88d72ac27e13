"""Copies of parameters on two ranks sum their gradients before the optimizer: DualPipe's replicated stages, and a
head tied to the embedding on another rank.

A schedule with chains (`Schedule.chains`, DualPipe) runs every model stage once per chain, on
different ranks, with the same initial parameters; each copy sees its own chain's microbatches, so
the step's gradient is the sum of the copies'. Each rank swaps its replicated gradients with the
rank holding the other copy (one isend + irecv per partner: a two-rank all-reduce without a process
group) and adds them; a + b is b + a bit for bit, so the copies stay identical.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

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
        if partner == me:  # both copies on this rank (odd chain layouts): sum them pairwise
            raise NotImplementedError("two copies of one model stage on the same rank")
        nbytes += swap_and_add(params, mesh.pp_peer(partner), me < partner)
    return nbytes


def tied_partner(schedule: Schedule) -> tuple[int, int] | None:
    """(rank of the first stage, rank of the last) when a tied embedding and head live on two ranks; None when one
    rank holds both (pp 1, a V schedule), where they are one Parameter. One-chain schedules (RunConfig.check)."""
    first, last = schedule.rank_of(0), schedule.rank_of(schedule.num_stages - 1)
    return (first, last) if first != last else None


def sum_tied_embedding(schedule: Schedule, me: int, weight: nn.Parameter, mesh: Mesh) -> int:
    """The first stage's embedding and the last stage's copy of it in the head add their gradients, so both copies
    take the same step (Megatron-LM's embedding group: finalize_model_grads' _allreduce_word_embedding_grads);
    returns the bytes exchanged."""
    first, last = tied_partner(schedule)
    partner = last if me == first else first
    return swap_and_add([weight], mesh.pp_peer(partner), me < partner)


def swap_and_add(params: list[nn.Parameter], peer: int, first: bool) -> int:
    """Swap `params`' gradients with the same list on global rank `peer` and add them (one isend + irecv: a two-rank
    all-reduce without a process group); `first` on one side only, so both add in one operand order and stay
    identical bit for bit. Returns the bytes sent."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    mine = torch.cat([p.grad.reshape(-1) for p in params])
    theirs = torch.empty_like(mine)
    if dist.get_backend() == "nccl":  # one batch: NCCL would serialise the two ranks' sends
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)])
    else:
        works = [dist.isend(mine, peer, tag=_TAG), dist.irecv(theirs, peer, tag=_TAG)]
    for work in works:
        work.wait()
    total = mine + theirs if first else theirs + mine
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(total[offset:offset + n].view_as(p.grad))
        offset += n
    return mine.numel() * mine.element_size()
