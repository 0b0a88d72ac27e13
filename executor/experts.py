"""The mixture-of-experts MLP the executor trains: a learned top-k router, routed experts, an optional shared expert.

The layer pipesim's cost model counts (pipesim/model/moe.py, moe_layer.py; the model's activation and biases: the
GPT's GeLU and biases for `--model moe`): a router Linear(h, E) (with a bias where `MoeConfig.router_bias`: GPT-OSS's),
a float32 softmax and top-k (or, `MoeConfig.score` "sigmoid", each logit's sigmoid and their top k, divided by their
sum when k > 1: Megatron-core's topk_routing_with_score_function); E experts, each an executor.mlp.Mlp of f hidden
units (its gate shaped as the MoeConfig says: executor.mlp.Gate); `shared_experts x shared_ffn` hidden units of one
dense MLP every token passes through, its output times sigmoid(x . w) where `MoeConfig.shared_gate` (Qwen2-MoE's
shared_expert_gate, a Linear(h, 1) without bias on the block's input: transformers' Qwen2MoeSparseMoeBlock,
Megatron-core's SharedExpertMLP gate_weight; whole on every tp rank, on its own tokens, as the router). A token's
output is the sum of its k experts' outputs weighted by their router probabilities (divided by their sum when
`MoeConfig.renormalize`: Mixtral's and Qwen3-MoE's routers), so the router learns through those weights; with
`MoeConfig.input_probs` (Llama 4's, top-1) the weight multiplies the expert's input instead (Megatron-core's
--moe-apply-probs-on-input).

Routing is dropless unless `capacity_factor` is set; then each expert keeps at most ceil(cf x s x k / E) of a
sequence's s tokens' pairs: those with the largest router weights (`drop_policy` probs, Megatron-core's default
--moe-token-drop-policy: topk_softmax_with_capacity keeps each expert's top-capacity gates), ties by position, or the
first ones by position and then by rank among the token's k (position: Switch/GShard's first-come order); the
dropped pairs add nothing. The capacity is per sequence, so the choice is the same however the batch is cut into
microbatches and data-parallel replicas, which lets the single-process reference drop the same pairs as any parallel
run. Under sequence parallelism each tp rank routes its part of a sequence, and its capacity counts that part
(Megatron-core's per-rank capacity); the reference cuts each sequence into the same `capacity_parts`.

A load-balancing loss (`MoeConfig.balance_loss`, Megatron-core's switch_load_balancing_loss_func) trains the router
towards even loads: per group of tokens, coeff x E / k x sum_i f_i P_i, where f_i is the share of the group's tokens
whose top k holds expert i (before any capacity drop) and P_i the group's mean router probability of i (with sigmoid
scores, each token's sigmoids divided by their sum over E: Megatron-core's compute_routing_scores_for_aux_loss); a
group is a microbatch's tokens (aux_loss: `balance_sequences` sequences, which the runtime sets to the microbatch's) or
each sequence's (seq_aux_loss), and the layer's loss is the mean over its groups. Under sequence parallelism a rank
holds s / tp tokens of each sequence: the counts are summed over tp first (as Megatron-core's reduce over its tp-cp
group) and each rank adds its tokens' share of P, so the ranks' losses sum to the group's. Like Megatron-core's
MoEAuxLossAutoScaler, the loss rides on the layer's output and its backward adds the loss's gradient times
`aux_scale` (the runtime's 1 / microbatches, as the main loss's), so no stage has to carry it to the last one.
The router z-loss (`MoeConfig.z_loss_coeff`, ST-MoE's; Megatron-core's z_loss_func) rides the same way: coeff x the
mean over the rank's tokens of logsumexp(logits)^2, divided by the tp ranks its microbatch's tokens are split over
(Megatron-core divides by its tp-cp group's size), so their sum over tp is the microbatch's mean.

With expert parallelism each rank keeps the E / ep experts of its ep coordinate (pipesim.parallel_dims; expert x
on rank x E / ep ...), still named by their global index (`moe.experts.5.fc1.weight`), and exchanges rows over
the ep group (executor.expert_dispatch). `steps` is the layer as a generator that yields each exchange in flight,
so a caller can run other work before waiting (DualPipeV's overlapped F&B); `forward` waits at once.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable

import torch
import torch.distributed as dist
from torch import nn

from executor.expert_dispatch import Pending, exchange_counts, issue
from executor.mlp import Gate, Mlp
from pipesim.model.config import ModelConfig
from pipesim.model.moe import MoeConfig

Steps = Generator[Pending, None, torch.Tensor]  # yields exchanges in flight, returns the layer's output


class MoeMLP(nn.Module):
    """Router, routed experts (this rank's), shared expert; `steps(x)` on (b, s, h) returns (b, s, h)."""

    def __init__(self, hidden: int, moe: MoeConfig, activation: str = ModelConfig.activation,
                 biases: bool = ModelConfig.biases, *, ep: tuple[int, int] | None = None) -> None:
        """`ep`: (this rank's ep coordinate, ep) to draw only its E / ep experts (default: all of them)."""
        super().__init__()
        self.num_experts, self.top_k, self.capacity_factor = moe.experts, moe.top_k, moe.capacity_factor
        self.drop_policy = moe.drop_policy
        self.capacity_parts = 1  # a sequence's parts the capacity counts apart: tp under sequence parallelism
        self.renormalize = moe.renormalize
        self.score, self.input_probs = moe.score, moe.input_probs
        self.router = nn.Linear(hidden, moe.experts, bias=moe.router_bias)  # GPT-OSS's router has a bias
        # each expert from its own seed (base + e, base one draw of the RNG here, the same on every rank), so that an
        # expert-parallel rank draws only its own experts and they are the whole layer's, bit for bit
        base = int(torch.randint(0, 2**62, (1,)).item())
        local = moe.experts // ep[1] if ep else moe.experts
        first = ep[0] * local if ep else 0
        gate = Gate.of(moe)  # the routed experts' gate shape (GPT-OSS's clamp, gain and offset)
        self.experts = nn.ModuleDict({str(e): _drawn(base + e, lambda: Mlp(hidden, moe.expert_ffn, activation, biases,
                                                                            gate))
                                     for e in range(first, first + local)})
        width = moe.shared_experts * moe.shared_width
        self.shared = Mlp(hidden, width, activation, biases) if width else None
        # Qwen2-MoE's gate on the shared output: drawn last, so the other parameters are the ungated layer's bit for
        # bit, and nothing drawn without it
        self.shared_gate = nn.Linear(hidden, 1, bias=False) if moe.shared_gate and width else None
        self.group = None  # the ep process group; None: every expert here (ep 1, the reference)
        self.ep = 1
        # the load-balancing loss (none when coeff is 0); set by the runtime (set_routing): its gradient's scale, the
        # sequences of an aux_loss group (a microbatch's) and, under sequence parallelism, the tp group the counts sum
        # over (None where a group's tokens are all here)
        self.balance, self.aux_coeff = moe.balance, float(moe.aux_loss_coeff) if moe.balance_loss else 0.0
        self.z_coeff = float(moe.z_loss_coeff)
        self.aux_scale = 1.0
        self.balance_sequences: int | None = None  # None: the whole input is one group (aux_loss)
        self.tp_group = None
        self.token_shards = 1  # the tp ranks a microbatch's tokens are split over (the z-loss's mean)

    def shard(self, ep_rank: int, ep: int, group) -> None:
        """Keep the experts of ep coordinate `ep_rank` (E / ep consecutive ones) and exchange over `group`."""
        if self.group is not None:  # DualPipe's two chains may hold one module twice
            return
        local = self.num_experts // ep
        keep = range(ep_rank * local, (ep_rank + 1) * local)  # already all it holds where built with its `ep`
        self.experts = nn.ModuleDict({str(e): self.experts[str(e)] for e in keep})
        self.group, self.ep = group, ep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drive(self.steps(x))

    def kept(self, experts: torch.Tensor, weights: torch.Tensor, seq: int) -> torch.Tensor | None:
        """Capacity mode: which (token, k) pairs, (b, s k) in token order with their router weights, fit their
        expert's capacity in their sequence (in their part of it: `capacity_parts`); None when dropless."""
        if self.capacity_factor is None:
            return None
        b, parts = experts.shape[0], self.capacity_parts
        experts, weights = experts.reshape(b * parts, -1), weights.reshape(b * parts, -1)  # a row per part
        capacity = math.ceil(self.capacity_factor * (seq // parts) * self.top_k / self.num_experts)  # pairs per expert
        # the order an expert takes its pairs in: by weight, largest first (probs), or by position
        order = torch.argsort(-weights, dim=1, stable=True) if self.drop_policy == "probs" else \
            torch.arange(experts.shape[1], device=experts.device).expand_as(experts)
        queued = experts.gather(1, order)
        # (b parts, s k / parts, E); a scatter, not F.one_hot, whose range check reads the indices back to the host
        onehot = queued.new_zeros(*queued.shape, self.num_experts).scatter_(-1, queued.unsqueeze(-1), 1)
        place = ((onehot.cumsum(dim=1) - 1) * onehot).sum(dim=-1)  # each pair's place in its expert's queue
        return (torch.empty_like(place).scatter_(1, order, place) < capacity).reshape(b, -1)

    def steps(self, x: torch.Tensor) -> Steps:
        b, s, h = x.shape
        tokens = x.reshape(-1, h)
        logits = self.router(tokens).float()  # (N, E), float32 as Megatron's router
        if self.score == "sigmoid":  # each logit's sigmoid; k > 1: the chosen ones divided by their sum (Megatron)
            scores = torch.sigmoid(logits)
            weight, expert = scores.topk(self.top_k, dim=-1)
            if self.top_k > 1:
                weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
            probs = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20) if self.aux_coeff else scores  # the loss's P
        else:
            probs = torch.softmax(logits, dim=-1)
            weight, expert = probs.topk(self.top_k, dim=-1)  # (N, k) each
        chosen = expert
        if self.renormalize:  # Mixtral's and Qwen3's (norm_topk_prob): the k weights sum to 1
            weight = weight / weight.sum(dim=-1, keepdim=True)
        token = torch.arange(tokens.shape[0], device=x.device).repeat_interleave(self.top_k)
        expert, weight = expert.reshape(-1), weight.reshape(-1)
        keep = self.kept(expert.view(b, s * self.top_k), weight.view(b, s * self.top_k), s)
        if keep is not None:
            keep = keep.reshape(-1)
            token, expert, weight = token[keep], expert[keep], weight[keep]
        order = torch.argsort(expert, stable=True)  # pairs grouped by expert, token order inside each
        token, expert, weight = token[order], expert[order], weight[order]
        counts = torch.bincount(expert, minlength=self.num_experts)  # rows per expert from this rank
        rows = tokens[token]  # (pairs, h)
        if self.input_probs:  # the weight on the expert's input (top-1), the output summed unweighted
            rows = rows * weight.to(tokens.dtype)[:, None]
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
        weighted = out_rows if self.input_probs else out_rows * weight.to(tokens.dtype)[:, None]
        out = tokens.new_zeros(tokens.shape).index_add(0, token, weighted)
        if self.shared is not None:
            out = out + self.shared_output(tokens)
        out = out.view(b, s, h)
        losses = ([self.balance_loss(probs.view(b, s, -1), chosen.view(b, s, -1))] if self.aux_coeff else []) + \
            ([self.z_loss(logits)] if self.z_coeff else [])
        if losses:
            out = _AuxLoss.apply(out, losses[0] if len(losses) == 1 else losses[0] + losses[1], self.aux_scale)
        return out

    def shared_output(self, tokens: torch.Tensor) -> torch.Tensor:
        """The shared experts' output on (N, h) tokens, times sigmoid(tokens . w) where the layer gates it (Qwen2-MoE's
        shared_expert_gate: the same tokens the router reads, a score per token)."""
        out = self.shared(tokens)
        return out if self.shared_gate is None else torch.sigmoid(self.shared_gate(tokens)) * out

    def z_loss(self, logits: torch.Tensor) -> torch.Tensor:
        """This rank's share of the router z-loss of (N, E) logits: coeff / token shards x mean logsumexp^2."""
        return torch.logsumexp(logits, dim=-1).square().mean() * (self.z_coeff / self.token_shards)

    def balance_loss(self, probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """This rank's share of the load-balancing loss of (b, s, E) router probabilities and (b, s, k) chosen
        experts: the mean over groups of coeff x E / k x sum_i f_i P_i (the module's docstring)."""
        b, s, e = probs.shape
        per = 1 if self.balance == "seq_aux_loss" else b if self.balance_sequences is None else self.balance_sequences
        if b % per:
            raise ValueError(f"{b} sequences do not form groups of {per} (the load-balancing loss's)")
        groups = b // per
        chose = torch.zeros_like(probs).scatter_(-1, chosen, 1.0)  # (b, s, E): 1 where a token's top k holds i
        counts = chose.view(groups, per * s, e).sum(dim=1)  # (groups, E): tokens per expert, f_i x tokens
        if self.tp_group is not None:  # the sequence's other tokens are on the other tp ranks
            dist.all_reduce(counts, group=self.tp_group)
        tokens = per * s * (self.token_shards if self.tp_group is not None else 1)  # a group's, over its tp ranks
        # sum_g sum_i counts_gi x sum_(t in g) p_ti, as one product over this rank's tokens (its gradient a product)
        weight = counts.repeat_interleave(per * s, dim=0).view(b, s, e)
        return (weight * probs).sum() * (self.aux_coeff * e / (self.top_k * groups * tokens * tokens))

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


def _drawn(seed: int, build):
    """`build()` with the RNG seeded `seed`, the caller's RNG left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


class _AuxLoss(torch.autograd.Function):
    """The layer's output, unchanged; in the backward, the load-balancing loss's gradient times `scale` too
    (Megatron-core's MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, loss: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        ctx.save_for_backward(loss)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (loss,) = ctx.saved_tensors
        return grad, torch.full_like(loss, ctx.scale), None


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


def set_routing(modules: Iterable[nn.Module], *, scale: float, sequences: int | None, tp_group=None, tp: int = 1,
                split_sequences: bool = True, capacity_parts: int = 1) -> None:
    """Every MoE MLP's routing and losses as this rank trains them: the losses' gradient `scale` (1 / microbatches),
    the sequences of an aux_loss group (a microbatch's on this rank), the tp group (of `tp` ranks) a microbatch is
    split over under sequence parallelism (None: none), each sequence's tokens (`split_sequences`: a transformer) or
    its rows (then a sequence is whole here, and only an aux_loss group spans the tp ranks), and the parts of a
    sequence an expert's capacity counts apart (the reference's: a run's tp ranks each route their own part)."""
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, MoeMLP):
                spans = tp_group is not None and (split_sequences or sub.balance == "aux_loss")
                sub.aux_scale, sub.balance_sequences, sub.capacity_parts = scale, sequences, capacity_parts
                sub.tp_group = tp_group if spans else None
                sub.token_shards = tp if tp_group is not None else 1


def shard_experts(module: nn.Module, ep_rank: int, ep: int, group) -> None:
    """Every MoE MLP of `module` keeps its ep coordinate's experts."""
    for sub in module.modules():
        if isinstance(sub, MoeMLP):
            sub.shard(ep_rank, ep, group)


__all__ = ["MoeMLP", "drive", "expert_parameters", "finish", "set_routing", "shard_experts"]
