"""The executor's MoE router on one process: capacity and its drop policies, routing independent of the batch's cut,
recomputation on the overlap path, renormalisation, and Megatron-core's load-balancing loss and z-loss (their closed
forms, their gradients riding on the layer's output). Their distributed runs: tests/test_moe_executor.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from executor.experts import MoeMLP, drive
from executor.models import StageModule, set_recompute
from executor.transformer import Block
from pipesim.model.moe import MoeConfig
from tests.moe_helpers import moe_model

# -- routing -------------------------------------------------------------------------------------------------------

def test_capacity_keeps_each_experts_largest_or_first_pairs_of_a_sequence():
    """Capacity ceil(cf x s k / E) per sequence: with cf 0.5, s 4, k 1, E 2 each expert keeps 1 pair: its largest
    router weight (probs, Megatron-core's default; equal weights by position), or its first (position)."""
    experts = torch.tensor([[0, 0, 1, 1], [1, 0, 1, 0]])  # (b, s k)
    weights = torch.tensor([[0.6, 0.9, 0.7, 0.7], [0.8, 0.5, 0.9, 0.6]])
    probs = MoeMLP(4, MoeConfig(experts=2, top_k=1, expert_ffn=4, capacity_factor=0.5))
    assert probs.kept(experts, weights, 4).tolist() == [[False, True, True, False], [False, False, True, True]]
    first = MoeMLP(4, MoeConfig(experts=2, top_k=1, expert_ffn=4, capacity_factor=0.5, drop_policy="position"))
    assert first.kept(experts, weights, 4).tolist() == [[True, False, True, False], [True, True, False, False]]
    assert MoeMLP(4, MoeConfig(experts=2, top_k=1, expert_ffn=4)).kept(experts, weights, 4) is None  # dropless
    # the reference of a tp 2 run with sequence parallelism: each half of a sequence apart, with cf 1.0 a capacity
    # of ceil(1.0 x 2 x 1 / 2) = 1 pair per expert in each half of 2 tokens
    halves = MoeMLP(4, MoeConfig(experts=2, top_k=1, expert_ffn=4, capacity_factor=1.0))
    halves.capacity_parts = 2
    assert halves.kept(experts, weights, 4).tolist() == [[False, True, True, False], [True, True, True, True]]


@pytest.mark.parametrize(("cf", "policy"), [(None, "probs"), (1.0, "probs"), (1.0, "position")])
def test_routing_is_the_same_however_the_batch_is_cut(cf, policy):
    """What lets the reference (the whole batch at once) match any split into microbatches and replicas: routing
    and capacity are per token and per sequence; and cf 1.0 does drop pairs on this batch."""
    torch.manual_seed(0)
    model = moe_model(capacity_factor=cf, drop_policy=policy)
    layer = MoeMLP(model.hidden, model.moe)
    x = torch.randn(4, model.seq, model.hidden)
    whole = layer(x)
    torch.testing.assert_close(torch.cat([layer(x[:1]), layer(x[1:3]), layer(x[3:])]), whole, rtol=1e-6, atol=1e-7)
    if cf is not None:
        weights, experts = torch.softmax(layer.router(x.reshape(-1, 16)), -1).topk(2, -1)
        assert not layer.kept(experts.reshape(4, -1), weights.reshape(4, -1), model.seq).all()


@pytest.mark.parametrize(("mode", "runs"), [("none", 1), ("full", 2)])
def test_a_recomputed_moe_block_runs_again_in_its_backward_on_the_overlap_path_too(mode, runs, monkeypatch):
    """DualPipeV's overlapped pairs run a stage as `steps` (its all-to-alls in flight): a block full recomputation
    checkpoints runs whole there and again in the backward, as through `forward` (it was skipped before)."""
    stage = StageModule({1: Block(moe_model(), 0)})  # one MoE block
    set_recompute(stage, mode)
    calls = []
    block = stage.pieces["1"]
    real = block.attend
    monkeypatch.setattr(block, "attend", lambda x: calls.append(1) or real(x))
    x = torch.randn(2, 8, 16, requires_grad=True)
    drive(stage.steps(x)).sum().backward()
    assert len(calls) == runs and x.grad is not None


def test_the_router_learns():
    model = moe_model()
    layer = MoeMLP(model.hidden, model.moe)
    drive(layer.steps(torch.randn(2, model.seq, model.hidden))).square().sum().backward()
    assert layer.router.weight.grad is not None and layer.router.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(("balance", "per", "want"), [
    # one group of both sequences: f = (5/8, 3/8), P = (0.5, 0.5); sum f P = 0.5
    ("aux_loss", 2, 0.5),
    # per sequence: (3/4, 1/4) . (0.6, 0.4) = 0.55 and (2/4, 2/4) . (0.4, 0.6) = 0.5, mean 0.525
    ("seq_aux_loss", None, 0.525),
])
def test_the_balance_loss_is_megatrons_switch_loss_over_each_group(balance, per, want):
    """coeff x E / k x sum_i f_i P_i per group (Megatron-core's switch_load_balancing_loss_func; seq_aux_loss per
    sequence), the mean over groups: two sequences of four tokens, E 2, k 1, coeff 0.1."""
    layer = MoeMLP(4, MoeConfig(experts=2, top_k=1, expert_ffn=4, balance=balance, aux_loss_coeff=0.1))
    layer.balance_sequences = per
    probs = torch.tensor([[[0.9, 0.1], [0.7, 0.3], [0.2, 0.8], [0.6, 0.4]],
                          [[0.3, 0.7], [0.6, 0.4], [0.1, 0.9], [0.6, 0.4]]])
    chosen = torch.tensor([[[0], [0], [1], [0]], [[1], [0], [1], [0]]])
    assert layer.balance_loss(probs, chosen).item() == pytest.approx(0.1 * 2 / 1 * want, rel=1e-6)


def test_the_z_loss_is_the_mean_squared_log_sum_exp_of_the_routers_logits():
    """ST-MoE's router z-loss as Megatron-core's z_loss_func: coeff x mean over tokens of logsumexp(logits)^2, over
    the tp ranks a microbatch's tokens are split over (each rank's share; their sum is the mean)."""
    layer = MoeMLP(4, MoeConfig(experts=2, top_k=1, expert_ffn=4, z_loss_coeff=0.1))
    logits = torch.tensor([[0.0, 0.0], [1.0, -1.0], [2.0, 2.0]])
    lse = [math.log(2.0), math.log(math.e + 1 / math.e), 2.0 + math.log(2.0)]
    assert layer.z_loss(logits).item() == pytest.approx(0.1 * sum(v * v for v in lse) / 3, rel=1e-6)
    layer.token_shards = 2
    assert layer.z_loss(logits).item() == pytest.approx(0.1 * sum(v * v for v in lse) / 6, rel=1e-6)


@pytest.mark.parametrize(("balance", "aux", "z"), [("aux_loss", 0.5, 0.0), ("seq_aux_loss", 0.5, 0.0),
                                                   ("aux_loss", 0.0, 0.1), ("seq_aux_loss", 0.5, 0.1)])
def test_the_routers_losses_ride_on_the_output_as_if_added_to_the_loss(balance, aux, z):
    """Megatron-core's MoEAuxLossAutoScaler: backpropagating the output alone gives the gradients of output plus
    `aux_scale` x the balance loss and the z-loss, which reach the router and the input; none at coefficient 0."""
    torch.manual_seed(0)
    moe = MoeConfig(experts=4, top_k=2, expert_ffn=8, balance=balance, aux_loss_coeff=aux, z_loss_coeff=z)
    layer, plain = MoeMLP(6, moe), MoeMLP(6, replace(moe, aux_loss_coeff=0.0, z_loss_coeff=0.0))
    plain.load_state_dict(layer.state_dict())
    layer.aux_scale = plain.aux_scale = 0.25
    x = torch.randn(3, 5, 6, requires_grad=True)
    drive(layer.steps(x)).sum().backward()
    carried = layer.router.weight.grad.clone(), x.grad.clone()
    x.grad = None
    logits = plain.router(x.reshape(-1, 6)).float()
    probs = torch.softmax(logits, dim=-1).view(3, 5, 4)
    loss = layer.balance_loss(probs, probs.topk(2, dim=-1).indices) if aux else 0.0
    loss = loss + (layer.z_loss(logits) if z else 0.0)
    (drive(plain.steps(x)).sum() + 0.25 * loss).backward()
    torch.testing.assert_close(carried[0], plain.router.weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(carried[1], x.grad, rtol=1e-5, atol=1e-6)
    plain.zero_grad()
    drive(plain.steps(x)).sum().backward()  # the output alone, without the loss
    assert (carried[0] - plain.router.weight.grad).abs().max() > 1e-3


@pytest.mark.parametrize("renormalize", [False, True])
def test_a_renormalising_router_weighs_each_tokens_k_experts_to_one(renormalize):
    """Mixtral's and Qwen3's router (MoeConfig.renormalize, their configs' norm_topk_prob): each token's k weights
    divided by their sum; without it, the softmax's own probabilities. The layer's output is that weighted sum."""
    torch.manual_seed(0)
    layer = MoeMLP(4, MoeConfig(experts=4, top_k=2, expert_ffn=8, renormalize=renormalize))
    x = torch.randn(1, 3, 4)
    probs = torch.softmax(layer.router(x.reshape(3, 4)).float(), dim=-1)
    weight, chosen = probs.topk(2, dim=-1)
    if renormalize:
        weight = weight / weight.sum(dim=-1, keepdim=True)
    expected = torch.stack([sum(w * layer.experts[str(int(e))](x[0, t]) for w, e in zip(weight[t], chosen[t],
                                                                                       strict=True))
                            for t in range(3)])
    torch.testing.assert_close(layer(x)[0], expected)
    assert torch.allclose(weight.sum(dim=-1), torch.ones(3)) == renormalize
