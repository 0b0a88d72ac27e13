"""The single-process, non-parallel reference: same model, same data, same optimizer, full batch.

The pipelined run (any schedule, any dp x pp x tp grid) must reproduce its losses and final
parameters within float32 tolerance; that is the executor's correctness test.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.experts import set_routing
from executor.models import build_full, loss_fn, synthetic_batch
from pipesim.model.config import ModelConfig


@dataclass
class ReferenceResult:
    losses: list[float]  # per step, mean over the global batch
    params: dict[str, torch.Tensor]  # full-model names (`pieces.3.fc.weight`) -> final values


def train_reference(model_cfg: ModelConfig, steps: int, *, optimizer: str = "sgd", lr: float = 0.01,
                    balance_sequences: int | None = None, capacity_parts: int = 1) -> ReferenceResult:
    """`balance_sequences`: the sequences of a load-balancing (aux_loss) group, the run's microbatch per replica
    (None: the whole batch); `capacity_parts`: the parts of a sequence an expert's capacity counts apart, the run's
    tp under sequence parallelism."""
    model = build_full(model_cfg)
    set_routing([model], scale=1.0, sequences=balance_sequences, capacity_parts=capacity_parts)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=lr) if optimizer == "sgd" else torch.optim.Adam(params, lr=lr)
    losses = []
    for step in range(steps):
        x, y = synthetic_batch(model_cfg, step)
        loss = loss_fn(model_cfg, model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return ReferenceResult(losses, {n: p.detach().clone() for n, p in model.named_parameters()})
