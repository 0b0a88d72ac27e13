"""On every rank of a launch: train example models with `executor.api.train` under every registered schedule, and
compare each run with the single-process reference (losses and final parameters): `every_schedule(which)`,
{schedule: report}, called by tests/test_api.py's case of the shared launch (tests/launch_shared.py).

conv: examples/conv_net.py as model= (an nn.Sequential) with an even split; widths: examples/widths.py as
stages= (one nn.Sequential per stage).
"""

from __future__ import annotations

import gc

import torch.distributed as dist
from torch import nn

import schedules
from executor.api import train
from executor.user_model import call_factory, pieces_of, train_single, workload_from_parts
from executor.workload import PiecesWorkload

STEPS, BATCH, SEED, LR = 2, 16, 0, 0.05


def _pieces(spec: str) -> list[nn.Module]:
    """A fresh copy of the model's pieces (same seed: same parameters)."""
    return pieces_of(call_factory(spec, SEED))[0]


def _workload(spec: str) -> PiecesWorkload:
    """The model's data and loss, the same for every schedule: built (with its shape inference) once per model."""
    return workload_from_parts(call_factory(spec, SEED), batch=BATCH, seed=SEED, split=None)


def _grouped(pieces: list[nn.Module], split: list[int]) -> list[nn.Module]:
    out, start = [], 0
    for n in split:
        out.append(nn.Sequential(*pieces[start:start + n]))
        start += n
    return out


def every_schedule(which: str) -> dict[str, dict]:
    """Rank 0: each registered schedule's losses and parameters against the reference; {} elsewhere."""
    p = dist.get_world_size()
    spec = {"conv": "examples/conv_net.py:make", "widths": "examples/widths.py:make"}[which]
    work = _workload(spec)
    # the shape inference imported torch._dynamo: kept out of the full collection after each train (the launch's
    # tests/workers/shared_ranks.py froze what was alive before the cases), which then walks the new runtime only
    gc.collect()
    gc.freeze()
    report = {}
    for name in schedules.names():
        m = 2 * p
        sched = schedules.build(name, p, m)
        pieces, ref_pieces = _pieces(spec), _pieces(spec)
        if which == "conv":  # model= with split=None: an even split of the nn.Sequential's pieces
            res = train(sched, model=nn.Sequential(*pieces), loss_fn=work.loss, batches=work.batch_source,
                        steps=STEPS, lr=LR)
            ref = PiecesWorkload(ref_pieces, len(ref_pieces), False, work.loss, work.batch_source, BATCH)
        else:  # stages=: one module per model stage, layers grouped by an uneven split
            n = sched.model_stages
            split = [len(pieces) - (n - 1)] + [1] * (n - 1)
            res = train(name, _grouped(pieces, split), loss_fn=work.loss, batches=work.batch_source,
                        steps=STEPS, microbatches=m, lr=LR)
            grouped = _grouped(ref_pieces, split)
            ref = PiecesWorkload(grouped, len(grouped), False, work.loss, work.batch_source, BATCH)
        params = res.named_parameters()
        everyone = [None] * p if dist.get_rank() == 0 else None
        dist.gather_object(params, everyone, dst=0)
        if dist.get_rank() != 0:
            continue
        init = {k: t.detach().clone() for k, t in ref.full_model().named_parameters()}
        ref_losses, ref_params = train_single(ref, STEPS, lr=LR)
        merged = {}
        for rank_params in everyone:
            merged.update(rank_params)
        diffs = {k: float((merged[k] - v).abs().max() / (v.abs().max() + 1e-12)) for k, v in ref_params.items()
                 if k in merged}
        report[name] = {"losses": res.losses, "ref_losses": ref_losses, "names": sorted(merged),
                        "ref_names": sorted(ref_params), "max_param_rel": max(diffs.values()),
                        "moved": min(float((ref_params[k] - v).abs().max()) for k, v in init.items())}
    return report
