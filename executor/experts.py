"""The mixture-of-experts MLP the executor trains: a learned top-k router, routed experts, an optional shared expert.

The layer pipesim's cost model counts (pipesim/model/moe.py, moe_layer.py; the model's activation and biases: the
GPT's GeLU and biases for `--model moe`): a router Linear(h, E) without bias, a float32 softmax and top-k; E experts,
each an executor.mlp.Mlp of f hidden units; `shared_experts x shared_ffn` hidden units of one dense MLP every token
passes through. A token's output is the sum of its k experts' outputs weighted by their router probabilities (divided
by their sum when `MoeConfig.renormalize`: Mixtral's and Qwen3-MoE's routers), so the router learns through those
weights.

Routing is dropless unless `capacity_factor` is set; then each expert keeps at most ceil(cf x s x k / E) of a
sequence's s tokens' pairs, the first ones by position and then by rank among the token's k (Switch/GShard's
first-come order), and the dropped pairs add nothing. The capacity is per sequence, so the choice is the same
however the batch is cut into microbatches and data-parallel replicas, which lets the single-process reference
drop the same pairs as any parallel run.

With expert parallelism each rank keeps the E / ep experts of its ep coordinate (pipesim.parallel_dims; expert x
on rank x E / ep ...), still named by their global index (`moe.experts.5.fc1.weight`), and exchanges rows over
the ep group (executor.expert_dispatch). `steps` is the layer as a generator that yields each exchange in flight,
so a caller can run other work before waiting (DualPipeV's overlapped F&B); `forward` waits at once.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from executor.expert_dispatch import Pending, exchange_counts, issue
from executor.mlp import Mlp
from pipesim.model.config import ModelConfig
from pipesim.model.moe import MoeConfig

Steps = Generator[Pending, None, torch.Tensor]  # yields exchanges in flight, returns the layer's output


class MoeMLP(nn.Module):
    """Router, routed experts (this rank's), shared expert; `steps(x)` on (b, s, h) returns (b, s, h)."""

    def __init__(self, hidden: int, moe: MoeConfig, activation: str = ModelConfig.activation,
                 biases: bool = ModelConfig.biases) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.capacity_factor = moe.experts, moe.top_k, moe.capacity_factor
        self.renormalize = moe.renormalize
        self.router = nn.Linear(hidden, moe.experts, bias=False)
        self.experts = nn.ModuleDict({str(e): Mlp(hidden, moe.expert_ffn, activation, biases)
                                     for e in range(moe.experts)})
        width = moe.shared_experts * moe.shared_width
        self.shared = Mlp(hidden, width, activation, biases) if width else None
        self.group = None  # the ep process group; None: every expert here (ep 1, the reference)
        self.ep = 1

    def shard(self, ep_rank: int, ep: int, group) -> None:
        """Keep the experts of ep coordinate `ep_rank` (E / ep consecutive ones) and exchange over `group`."""
        if self.group is not None:  # DualPipe's two chains may hold one module twice
            return
        local = self.num_experts // ep
        keep = range(ep_rank * local, (ep_rank + 1) * local)
        self.experts = nn.ModuleDict({str(e): self.experts[str(e)] for e in keep})
        self.group, self.ep = group, ep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drive(self.steps(x))

    def kept(self, experts: torch.Tensor, seq: int) -> torch.Tensor | None:
        """Capacity mode: which (token, k) pairs, (b, s k) in token order, fit their expert's per-sequence
        capacity; None when dropless."""
        if self.capacity_factor is None:
            return None
        capacity = math.ceil(self.capacity_factor * seq * self.top_k / self.num_experts)  # pairs per expert
        onehot = F.one_hot(experts, self.num_experts)  # (b, s k, E)
        position = ((onehot.cumsum(dim=1) - 1) * onehot).sum(dim=-1)  # the pair's place in its expert's queue
        return position < capacity

    def steps(self, x: torch.Tensor) -> Steps:
        b, s, h = x.shape
        tokens = x.reshape(-1, h)
        probs = torch.softmax(self.router(tokens).float(), dim=-1)  # (N, E), float32 as Megatron's router
        weight, expert = probs.topk(self.top_k, dim=-1)  # (N, k) each
        if self.renormalize:  # Mixtral's and Qwen3's (norm_topk_prob): the k weights sum to 1
            weight = weight / weight.sum(dim=-1, keepdim=True)
        token = torch.arange(tokens.shape[0], device=x.device).repeat_interleave(self.top_k)
        expert, weight = expert.reshape(-1), weight.reshape(-1)
        keep = self.kept(expert.view(b, s * self.top_k), s)
        if keep is not None:
            keep = keep.reshape(-1)
            token, expert, weight = token[keep], expert[keep], weight[keep]
        order = torch.argsort(expert, stable=True)  # pairs grouped by expert, token order inside each
        token, expert, weight = token[order], expert[order], weight[order]
        counts = torch.bincount(expert, minlength=self.num_experts)  # rows per expert from this rank
        rows = tokens[token]  # (pairs, h)
        if self.group is None:
            out_rows = self._compute(rows, counts.view(1, -1))
        else:
            received = exchange_counts(counts, self.group)  # (ep, E / ep): rows from each peer to my experts
            send = counts.view(self.ep, -1).sum(dim=1).tolist()
            recv = received.sum(dim=1).tolist()
            got, pending = issue(rows, send, recv, self.group)  # dispatch
            yield pending
            pending.wait()
            done, pending = issue(self._compute(got, received), recv, send, self.group)  # combine
            yield pending
            pending.wait()
            out_rows = done
        out = tokens.new_zeros(tokens.shape).index_add(0, token, out_rows * weight.to(tokens.dtype)[:, None])
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.view(b, s, h)

    def _compute(self, rows: torch.Tensor, received: torch.Tensor) -> torch.Tensor:
        """Rows ordered (source rank, local expert) through their experts, returned in the same order. Every local
        expert runs, on no rows if none came, so every rank has a gradient for each (zeros) and the data-parallel
        reductions stay aligned."""
        sources, local = received.shape
        sizes = received.reshape(-1).tolist()
        parts = list(rows.split(sizes))
        for e, module in enumerate(self.experts.values()):
            mine = [src * local + e for src in range(sources)]
            y = module(torch.cat([parts[i] for i in mine]))
            for i, part in zip(mine, y.split([sizes[i] for i in mine]), strict=True):
                parts[i] = part
        return torch.cat(parts)


def drive(steps: Steps) -> torch.Tensor:
    """Run a layer's steps to the end, waiting for each exchange as soon as it is issued."""
    try:
        pending = next(steps)
    except StopIteration as stop:
        return stop.value
    return finish(pending, steps)


def finish(pending: Pending, steps: Steps) -> torch.Tensor:
    """Wait for `pending` (the exchange `steps` last yielded), then run the rest as `drive` does."""
    while True:
        pending.wait()
        try:
            pending = steps.send(None)
        except StopIteration as stop:
            return stop.value


def expert_parameters(modules: Iterable[nn.Module]) -> list[nn.Parameter]:
    """The routed experts' parameters (reduced over the expert-data-parallel group, not dp), in module order."""
    return [p for module in modules for sub in module.modules() if isinstance(sub, MoeMLP)
            for p in sub.experts.parameters()]


def shard_experts(module: nn.Module, ep_rank: int, ep: int, group) -> None:
    """Every MoE MLP of `module` keeps its ep coordinate's experts."""
    for sub in module.modules():
        if isinstance(sub, MoeMLP):
            sub.shard(ep_rank, ep, group)


__all__ = ["MoeMLP", "drive", "expert_parameters", "finish", "shard_experts"]
