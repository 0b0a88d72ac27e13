"""Model cost model: FLOP counts by hand and against torch's FlopCounterMode, splits, tp/dp, memory."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import schedules
from pipesim.comm.tp_collective import TpCollective
from pipesim.cost.model_costs import model_costs, uniform_costs
from pipesim.cost.rank_memory import check_memory
from pipesim.cost.stage_work import gpt_block_activation_bytes, gpt_block_flops, gpt_stage_work, mlp_stage_work
from pipesim.cost.table import parse_cost_spec
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.schedule import Action, Kind
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.layer_kinds import StageLayers
from pipesim.parallel_dims import ParallelDims


def _count(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _fiw_measured(module: nn.Module, x: torch.Tensor, loss_fn) -> tuple[int, int, int]:
    """(F, I, W) FLOPs torch counts: forward; grads wrt the input only; full backward minus I."""
    x = x.detach().requires_grad_(True)  # a middle stage: its input needs a gradient
    f = _count(lambda: module(x))
    module.requires_grad_(False)  # frozen weights: backward computes only the input gradient
    i = _count(lambda: loss_fn(module(x)).backward()) - f
    module.requires_grad_(True)
    full = _count(lambda: loss_fn(module(x)).backward())  # F + I + W
    return f, i, full - f - i


def test_mlp_flops_match_flop_counter_exactly():
    h, b, layers = 24, 5, 3
    model = ModelConfig(kind="mlp", hidden=h, layers=layers, batch=b)
    torch.manual_seed(0)
    mlp = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(h, h), nn.GELU())])
    f, i, w = _fiw_measured(mlp, torch.randn(b, h), lambda y: y.square().mean())
    work = mlp_stage_work(model, b, layers)
    assert (work.flops["F"], work.flops["I"], work.flops["W"]) == (f, i, w) == (2 * b * h * h * layers,) * 3
    assert work.param_count == sum(p.numel() for p in mlp.parameters())


class _Block(nn.Module):
    """A GPT-2 block with explicit score matmuls (what gpt_block_flops counts)."""

    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        qkv = self.qkv(self.ln1(x)).split(h, -1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in qkv)  # (b, a, s, h/a)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(h // self.heads), dim=-1)  # (b, a, s, s)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


def test_gpt_block_flops_match_flop_counter_exactly():
    model = ModelConfig(kind="gpt", hidden=32, layers=1, heads=4, seq=12, vocab=50, batch=3)
    b, s, h = 3, 12, 32
    block = _Block(h, 4)
    f, i, w = _fiw_measured(block, torch.randn(b, s, h), lambda y: y.square().mean())
    assert gpt_block_flops(model, b) == (f, i, w)
    # by hand: weights 24bsh^2 each for F, I, W; scores 4bs^2h forward, 8bs^2h backward, all in I
    dense, scores = 24 * b * s * h * h, 4 * b * s * s * h
    assert (f, i, w) == (dense + scores, dense + 2 * scores, dense)
    work = gpt_stage_work(model, b, StageLayers.uniform(1), first=False, last=False)
    assert work.param_count == sum(p.numel() for p in block.parameters())


def test_gpt_head_and_embedding():
    model = ModelConfig(kind="gpt", hidden=32, layers=2, heads=4, seq=12, vocab=50, batch=3)
    b, s, h, v = 3, 12, 32, 50
    head = nn.Sequential(nn.LayerNorm(h), nn.Linear(h, v, bias=False))
    target = torch.randint(0, v, (b * s,))
    f, i, w = _fiw_measured(head, torch.randn(b, s, h), lambda y: nn.functional.cross_entropy(y.view(-1, v), target))
    last = gpt_stage_work(model, b, StageLayers(), first=False, last=True)
    assert (last.flops["F"], last.flops["I"], last.flops["W"]) == (f, i, w) == (2 * b * s * h * v,) * 3
    assert last.param_count == sum(p.numel() for p in head.parameters())
    first = gpt_stage_work(model, b, StageLayers(), first=True, last=False)
    assert first.flops == {"F": 0.0, "I": 0.0, "W": 0.0}
    assert first.param_count == v * h + s * h  # token and position embeddings


def test_korthikanti_activation_bytes():
    model = ModelConfig(kind="gpt", hidden=64, layers=2, heads=4, seq=16, vocab=50, batch=8, dtype="bfloat16")
    assert gpt_block_activation_bytes(model, 2) == 16 * 2 * 64 * (34 + 5 * 4 * 16 / 64)
    assert gpt_block_activation_bytes(model, 2, tp=2) == 16 * 2 * 64 * (10 + 12 + 5 * 4 * 16 / 128)
    f32 = ModelConfig(kind="gpt", hidden=64, layers=2, heads=4, seq=16, vocab=50, batch=8, dtype="float32")
    assert gpt_block_activation_bytes(f32, 2) == 2 * gpt_block_activation_bytes(model, 2)


def test_mlp_stage_costs_by_roofline():
    hw = load_hardware("dgx-h100")
    hw = dataclasses.replace(hw, device=dataclasses.replace(hw.device, family=""))  # no profile: the roofline
    model = ModelConfig(kind="mlp", hidden=4096, layers=8, batch=512)
    costs = model_costs(model, 2, 8, hw)  # microbatch 64 rows, 4 layers per stage
    mm = 2 * 64 * 4096 * 4096  # FLOPs of one layer
    peak = 67e12 * 0.5  # float32 FLOP/s achieved
    for stage in costs.table.stages:
        assert stage.flops_forward == 4 * mm
        assert stage.forward == 4 * mm / peak + 5e-6
        assert stage.activation_bytes == 4 * 2 * 64 * 4096 * 4
        assert stage.param_bytes == 4 * (4096 * 4096 + 4096) * 4
    last, first = costs.table.stages[1], costs.table.stages[0]
    assert last.backward_input == last.backward_weight == 4 * mm / peak + 5e-6
    # the first stage: no gradient for the data, so its first layer has no input gradient, and the
    # executor runs its whole backward in W (I has nothing to send)
    assert first.backward_input == 0.0
    assert first.backward_weight == pytest.approx((3 * mm / peak + 5e-6) + (4 * mm / peak + 5e-6), rel=1e-12)
    assert costs.table.stages[0].boundary_bytes == 64 * 4096 * 4 and costs.table.stages[1].boundary_bytes == 0
    assert costs.table.duration(Action(1, Kind.B, 3)) == 2 * (4 * mm / peak + 5e-6)
    assert costs.table.duration(Action(0, Kind.B, 3)) == first.backward_weight
    assert (costs.job.tp, costs.job.dp, costs.tp_collectives, costs.dp_grad_bytes) == (1, 1, {}, (0, 0))
    assert costs.layers_per_stage == (4, 4)


def test_framework_ops_are_counted_and_priced_per_op():
    from dataclasses import replace

    from pipesim.cost.stage_work import gpt_stage_work, mlp_stage_work

    mlp = mlp_stage_work(ModelConfig(kind="mlp", hidden=64, layers=3, batch=8), 8, 3)
    assert mlp.ops == {"F": 6.0, "I": 6.0, "W": 3.0}  # per layer: linear + GeLU, their input grads, one dW
    first = mlp_stage_work(ModelConfig(kind="mlp", hidden=64, layers=3, batch=8), 8, 3, first=True)
    assert first.ops == {"F": 6.0, "I": 5.0, "W": 3.0}  # no input gradient of the first Linear
    assert first.flops["I"] == 2 * mlp.flops["I"] / 3
    gpt = ModelConfig(kind="gpt", hidden=32, layers=2, heads=4, seq=12, vocab=50, batch=3)
    whole = gpt_stage_work(gpt, 3, StageLayers.uniform(2), first=True, last=True)
    assert whole.ops == {"F": 3 + 2 * 10 + 3, "I": 0 + 2 * 10 + 3, "W": 2 + 2 * 6 + 2}
    hw = replace(load_hardware("dgx-h100"), per_op_overhead=1e-5)
    model = ModelConfig(kind="mlp", hidden=4096, layers=8, batch=512)
    base = model_costs(model, 2, 8, load_hardware("dgx-h100")).table.stages
    priced = model_costs(model, 2, 8, hw).table.stages
    assert priced[1].forward == pytest.approx(base[1].forward + 8 * 1e-5, rel=1e-12)  # 4 layers x 2 ops
    assert priced[1].backward_weight == pytest.approx(base[1].backward_weight + 4 * 1e-5, rel=1e-12)
    assert priced[0].backward_weight == pytest.approx(base[0].backward_weight + (7 + 4) * 1e-5, rel=1e-12)
    assert hw.compute_time(0.0, 0.0, "bfloat16", "F", ops=3) == pytest.approx(5e-6 + 3e-5)
    assert (priced[0].backward_ops, priced[1].backward_ops) == (7 + 4, 8 + 4)  # the graph a split I walks
    # autograd's ops at their own price: I and W cheaper per op than F's
    back = model_costs(model, 2, 8, replace(hw, backward_op_overhead=4e-6)).table.stages
    assert back[1].forward == priced[1].forward
    assert back[1].backward_weight == pytest.approx(base[1].backward_weight + 4 * 4e-6, rel=1e-12)
    assert back[1].backward_input == pytest.approx(base[1].backward_input + 8 * 4e-6, rel=1e-12)


def test_uneven_split():
    hw = load_hardware("dgx-h100")
    model = ModelConfig(kind="mlp", hidden=256, layers=8, batch=16)
    costs = model_costs(model, 3, 4, hw, layer_split=[4, 3, 1])
    assert costs.layers_per_stage == (4, 3, 1)
    assert [s.flops_forward for s in costs.table.stages] == [2 * 4 * 256 * 256 * n for n in (4, 3, 1)]
    assert model_costs(model, 3, 4, hw).layers_per_stage == (3, 3, 2)
    with pytest.raises(PipesimError, match="must have 3 entries of 0 or more layers summing to the model.s 8 layers"):
        model_costs(model, 3, 4, hw, layer_split=[4, 4, 1])


def test_tensor_and_data_parallel():
    hw = load_hardware("2x-dgx-h100")
    model = ModelConfig(kind="gpt", hidden=512, layers=4, heads=8, seq=64, vocab=1000, batch=32, dtype="bfloat16")
    one = model_costs(model, 2, 4, hw)
    two = model_costs(model, 2, 4, hw, Job(ParallelDims(tp=2, dp=2)))  # microbatch 4 instead of 8
    b = 32 // (2 * 4)
    f, _, _ = gpt_block_flops(model, b)
    assert two.table.stages[0].flops_forward == 2 * f / 2  # 2 blocks, halved by tp; embedding has no FLOPs
    act = b * 64 * 512 * 2  # bytes of one (b, s, h) bf16 tensor
    ar = TpCollective("all_reduce", act)  # blocking
    assert two.tp_collectives[(0, "F")] == (ar,) * 5  # embedding + 2 per block
    assert two.tp_collectives[(0, "W")] == two.tp_collectives[(0, "B")]  # stage 0's W: the backward
    # a fused backward's all_reduces run under the QKV / FC1 weight-gradient GEMMs (beside: the GEMM's seconds)
    assert tuple(c._replace(beside=None) for c in two.tp_collectives[(0, "B")]) == (ar,) * 4
    assert all(c.beside is not None and c.beside.seconds > 0 for c in two.tp_collectives[(0, "B")])
    assert (0, "I") not in two.tp_collectives
    assert two.tp_collectives[(1, "F")] == (ar,) * 4
    assert two.tp_collectives[(1, "I")] == (ar,) * 5  # + the LM head's input gradient
    assert two.dp_grad_bytes == tuple(s.param_bytes for s in two.table.stages)
    assert one.tp_collectives == {} and one.dp_grad_bytes == (0, 0)
    with pytest.raises(PipesimError, match=r"--heads 8 is not divisible by tp\(3\)"):
        model_costs(ModelConfig(kind="gpt", hidden=24, heads=8, layers=2, batch=4), 2, 2, hw, Job(ParallelDims(tp=3)))
    with pytest.raises(PipesimError, match=r"--batch 32 does not split into dp\(3\) x 4 microbatches"):
        model_costs(model, 2, 4, hw, Job(ParallelDims(dp=3)))


def test_uniform_costs():
    costs = uniform_costs(3, parse_cost_spec("F=1,B=2"), boundary_bytes=10)
    assert [costs.table.duration(Action(s, Kind.B, 0)) for s in range(3)] == [2.0, 2.0, 2.0]
    assert costs.table.duration(Action(1, Kind.W, 0)) == 1.0
    assert costs.table.transfer_bytes(Action(0, Kind.SEND_F, 0)) == 10
    assert (costs.job, costs.dp_grad_bytes, costs.tp_collectives) == (Job(), (0, 0, 0), {})


def test_memory_check_names_the_numbers():
    cpu = load_hardware("local-cpu")  # 6 GiB per process
    model = ModelConfig(kind="mlp", hidden=16384, layers=8, batch=512)
    gpipe = schedules.build("gpipe", 2, 8)  # rank 0 stashes all 8 microbatches before its first backward
    costs = model_costs(model, 2, 8, cpu)
    # per stage: 4 x (h*h + h) params x 16 B = 16.00 GiB (fp32: 4 + 4 + 8); activations 4 x 2 x 64 x h x 4 B =
    # 1/32 GiB per microbatch; buffers: a send and a receive of 64 x h x 4 B
    with pytest.raises(PipesimError) as info:
        check_memory(gpipe, costs, cpu)
    assert str(info.value) == (
        "rank 0 (stage 0) needs 16.26 GiB, the largest term optimizer states 8.00 GiB (parameters 4.00, gradients "
        f"4.00, optimizer states 8.00, activations 0.25, comm buffers 0.01 GiB) but {cpu.device.name} has 6.00 GiB")
    small = model_costs(ModelConfig(kind="mlp", hidden=1024, layers=8, batch=64), 4, 8, cpu)
    check_memory(schedules.build("1f1b", 4, 8), small, cpu)  # fits: returns the breakdowns quietly
    # interleaved placement adds up the stages a rank holds
    dgx = load_hardware("dgx-h100")
    big = model_costs(ModelConfig(kind="mlp", hidden=16384, layers=16, batch=512), 4, 8, dgx)  # 16 GiB state each
    smaller = dataclasses.replace(dgx, device=dataclasses.replace(dgx.device, memory=30 * 2**30))
    check_memory(schedules.build("1f1b", 4, 8), big, smaller)  # 16.0x GiB per rank
    with pytest.raises(PipesimError, match=r"rank 0 \(stages 0,2\) needs 32\.\d\d GiB, .* has 30\.00"):
        check_memory(schedules.build("interleaved-1f1b", 2, 8, 2), big, smaller)


