"""The GPU kernel path: a layer's kernel list (FLOPs tied to pipesim/model/flops.py, fused and unfused bytes), its
timing on a device profile, the wiring into model_costs on presets with a family, and the TP overlap triples."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from pipesim.cli import main as pipesim_main
from pipesim.comm.collective_algos import collective_seconds
from pipesim.comm.tp_collective import TpCollective
from pipesim.cost.device_profiles import profile_of
from pipesim.cost.kernel_costs import gpt_stage_seconds, layer_seconds, overlap_gemm, piece_seconds
from pipesim.cost.model_costs import model_costs
from pipesim.device.gemm import gemm_time
from pipesim.device.kernels import flash_attention_time, memory_bound_time
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.schedule import Action, Kind
from pipesim.job import Job
from pipesim.kernel_switches import KernelSwitches
from pipesim.model.config import ModelConfig
from pipesim.model.elementwise import layer_elementwise_bytes
from pipesim.model.flops import head_flops, layer_flops
from pipesim.model.grad_accumulation import accumulate_gradients
from pipesim.model.kernel_types import FlashAttention, Gemm, MemoryBound
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import block_params
from pipesim.model.piece_kernels import head_kernels
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.program import _tp_time

GPT = ModelConfig(kind="gpt", hidden=512, layers=4, heads=8, seq=256, vocab=1000, batch=8, dtype="bfloat16")
LLAMA = replace(GPT, kv_heads=4, ffn_hidden=1408, activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                positions="rope", tied_embeddings=True)


def _grid():
    for model, tp, sp, cp, recompute, attention in itertools.product(
            (GPT, LLAMA), (1, 2, 4), (False, True), (1, 2), ("none", "selective", "full"), ("eager", "flash")):
        if (cp > 1 and attention != "flash") or (sp and tp == 1):
            continue
        yield model, LayerOptions(tp=tp, sp=sp, cp=cp, recompute=recompute, attention=attention)


@pytest.mark.parametrize("fused", [True, False])
def test_kernel_flops_equal_the_flop_counts_for_every_option(fused):
    n = 0
    for model, opts in _grid():
        kernels, flops = layer_kernels(model, 2, opts, fused=fused), layer_flops(model, 2, opts)
        assert (kernels.flops("F"), kernels.flops("I"), kernels.flops("W")) == (flops.F, flops.I, flops.W), opts
        head, hf = head_kernels(model, 2, opts), head_flops(model, 2, opts)
        assert (head.flops("F"), head.flops("I"), head.flops("W")) == (hf.F, hf.I, hf.W)
        n += 1
    assert n == 2 * 5 * (3 * 2 + 3)  # models x (tp, sp) pairs x (recompute x attention at cp 1, flash at cp 2)


def test_gemm_shapes_of_the_gpt_layer():
    kernels = layer_kernels(GPT, 2, LayerOptions(tp=2))
    gemms = {k.name: (k.m, k.n, k.k, k.batch) for phase in "FIW" for k in getattr(kernels, phase)
             if isinstance(k, Gemm)}
    n, h = 2 * 256, 512
    assert gemms["QKV"] == (n, 3 * h // 2, h, 1) and gemms["QKV dgrad"] == (n, h, 3 * h // 2, 1)
    assert gemms["QKV wgrad"] == (h, 3 * h // 2, n, 1)
    assert gemms["projection"] == (n, h, h // 2, 1) and gemms["FC2"] == (n, h, 4 * h // 2, 1)
    assert gemms["Q K^T"] == (256, 256, 64, 2 * 4) and gemms["A V"] == (256, 64, 256, 2 * 4)
    swiglu = layer_kernels(LLAMA, 2, LayerOptions(tp=2, attention="flash"))
    fc1 = next(k for k in swiglu.F if k.name == "FC1")
    assert (fc1.n, fc1.k) == (2 * 1408 // 2, h)  # gate and up in one linear_fc1
    flash = next(k for k in swiglu.F if isinstance(k, FlashAttention))
    assert (flash.heads, flash.kv_heads, flash.seq, flash.kv_seq) == (4, 2, 256, 256)


def test_fused_bytes_are_the_elementwise_counts_where_nothing_fuses_and_less_elsewhere():
    # Llama (no biases, no dropout) with flash attention: every op is already one kernel in elementwise.py
    opts = LayerOptions(tp=2, attention="flash")
    kernels, ew = layer_kernels(LLAMA, 2, opts), layer_elementwise_bytes(LLAMA, 2, opts)
    assert kernels.memory_bytes("F") == ew.forward_total and kernels.memory_bytes("I") == ew.backward_total
    # the GPT: fused bias + dropout + add saves 2 residual-stream passes per block forward, the rest as counted
    opts = LayerOptions(tp=2)
    fused, unfused = layer_kernels(GPT, 2, opts), layer_kernels(GPT, 2, opts, fused=False)
    ew = layer_elementwise_bytes(GPT, 2, opts)
    d, tokens, h = 2, 2 * 256, 512
    hidden, ffn, scores = tokens * h, tokens * 4 * h // 2, 2 * 4 * 256 * 256
    qkv_bias = 2 * tokens * 3 * h // 2 * d
    extra_f = 2 * scores * d + (2 * scores * d + scores) + 2 * ffn * d + 2 * (2 * hidden * d)  # scale, mask, biases
    assert unfused.memory_bytes("F") == ew.forward_total + qkv_bias + extra_f
    assert fused.memory_bytes("F") == ew.forward_total + qkv_bias - 2 * (2 * hidden * d)
    assert fused.memory_bytes("I") == ew.backward_total
    assert unfused.memory_bytes("I") == ew.backward_total + 2 * scores * d + (2 * scores * d + scores) + ffn * d \
        + 2 * hidden * d


def test_a_bias_on_qkv_alone_adds_its_bias_add_and_its_gradient_only():
    """--add-qkv-bias (Qwen2's q/k/v biases) on Llama's layer: one memory-bound bias add after the QKV GEMM (read and
    write its b s x (h_q + 2 h_kv) / t output) and one bias gradient (a read of that output's gradient); with
    Transformer Engine's linears both live in the GEMMs' epilogues, so the layer's kernels are Llama's."""
    opts = LayerOptions(tp=2, attention="flash")
    plain, qwen2 = layer_kernels(LLAMA, 2, opts), layer_kernels(replace(LLAMA, qkv_bias=True), 2, opts)
    width = (512 + 2 * 4 * 64) // 2  # h_q + 2 h_kv over tp: 4 kv heads of 64
    elements = 2 * 256 * width  # b s tokens
    added = [k for k in qwen2.F if k not in plain.F]
    assert [(k.name, k.nbytes) for k in added] == [("QKV bias add", 2 * elements * 2)]
    assert qwen2.F.index(added[0]) == 1  # right after the QKV GEMM
    assert [(k.name, k.nbytes) for k in qwen2.W if k not in plain.W] == [("QKV bias gradient", elements * 2)]
    assert qwen2.I == plain.I
    te = replace(opts, te_linear=True)
    assert layer_kernels(replace(LLAMA, qkv_bias=True), 2, te) == layer_kernels(LLAMA, 2, te)


def test_recomputation_puts_the_rerun_forward_kernels_first_in_i():
    plain = layer_kernels(GPT, 2, LayerOptions(tp=2))
    full = layer_kernels(GPT, 2, LayerOptions(tp=2, recompute="full"))
    assert full.I == plain.F + plain.I and full.F == plain.F and full.W == plain.W
    selective = layer_kernels(GPT, 2, LayerOptions(tp=2, recompute="selective"))
    assert [k.name for k in selective.I[:4]] == ["Q K^T", "A V", "softmax", "softmax dropout"]
    assert selective.I[4:] == plain.I


def test_piece_seconds_sum_the_device_models_kernel_by_kernel():
    prof = profile_of("A100")
    plain = layer_kernels(LLAMA, 2, LayerOptions(tp=2, attention="flash"))
    kernels = accumulate_gradients(plain, block_params(LLAMA, 2), dtype_bytes=2, grad_bytes=2, fused=True)
    assert any(isinstance(k, Gemm) and k.c_bytes == 4 for k in kernels.W)
    expected = []
    for phase in "FIW":
        total = 0.0
        for k in getattr(kernels, phase):
            if isinstance(k, Gemm):
                total += gemm_time(k.m, k.n, k.k, "bfloat16", prof, batch=k.batch, c_bytes=k.c_bytes).seconds
            elif isinstance(k, FlashAttention):
                total += flash_attention_time(k.batch, k.seq, k.heads, k.head_dim, "bfloat16", prof, kv_seq=k.kv_seq,
                                              kv_heads=k.kv_heads, causal=True, backward=k.backward).seconds
            else:
                assert isinstance(k, MemoryBound)
                total += memory_bound_time(k.nbytes, prof).seconds
        expected.append(total)
    got = piece_seconds(kernels, "bfloat16", prof)
    assert (got.F, got.I, got.W) == pytest.approx(expected, rel=1e-12)
    assert layer_seconds(LLAMA, 2, LayerOptions(tp=2, attention="flash"), True, "A100") == got


def test_model_costs_on_a_family_preset_are_kernel_seconds_plus_the_action_overhead():
    hw = load_hardware("dgx-a100")
    assert hw.device.family == "A100"
    costs = model_costs(GPT, 2, 4, hw, Job(attention="flash"))
    b = GPT.batch // 4
    opts = LayerOptions(attention="flash")
    last = gpt_stage_seconds(GPT, b, StageLayers.uniform(2), opts, first=False, last=True, fused=True, family="A100",
                             grad_bytes=4)  # bfloat16: float32 main grads (Megatron's default)
    stage = costs.table.stages[1]
    assert stage.forward == last.F + hw.per_action_overhead
    assert (stage.backward_input, stage.backward_weight) == (last.I + hw.per_action_overhead,
                                                             last.W + hw.per_action_overhead)
    # without a family: the roofline at compute_efficiency, as before
    plain = replace(hw, device=replace(hw.device, family=""))
    roof = model_costs(GPT, 2, 4, plain, Job(attention="flash")).table.stages[1]
    flops = layer_flops(GPT, b, opts) * 2 + head_flops(GPT, b, opts)
    assert roof.forward >= flops.F / (hw.device.flops["bfloat16"] * hw.device.compute_efficiency)
    assert roof.forward != stage.forward


def test_fused_backward_collectives_carry_the_seconds_of_the_gemm_they_hide_behind():
    hw = load_hardware("dgx-h100")
    for sp in (False, True):
        job = Job(ParallelDims(tp=2), sp=sp, attention="flash")
        costs = model_costs(GPT, 2, 4, hw, job)
        b, opts = GPT.batch // 4, LayerOptions(tp=2, sp=sp, attention="flash")
        layer = dict(layer_seconds(GPT, b, opts, True, "H100", grad_bytes=4).gemms)  # float32 main grads
        fused = costs.tp_collectives[(1, "B")]
        split = costs.tp_collectives[(1, "I")]
        assert all(c.beside is None for c in split)  # a split I's wgrad runs later, in W: nothing to hide behind
        assert [c._replace(beside=None) for c in fused] == list(split)
        hidden = [c.beside.seconds for c in fused if c.beside is not None]  # pipesim.comm.overlap_interference
        per_layer = ([layer["QKV dgrad"], layer["QKV wgrad"]] if sp else [layer["QKV wgrad"]])
        mlp = [layer["FC1 dgrad"], layer["FC1 wgrad"]] if sp else [layer["FC1 wgrad"]]
        head = dict(gpt_stage_seconds(GPT, b, StageLayers(), opts, first=False, last=True, fused=True, family="H100",
                                      grad_bytes=4).gemms)
        tail = [head["LM head dgrad"], head["LM head wgrad"]] if sp else [head["LM head wgrad"]]
        assert hidden == (mlp + per_layer) * 2 + tail
        assert costs.tp_collectives[(0, "W")] == costs.tp_collectives[(0, "B")]
        off = model_costs(GPT, 2, 4, hw, replace(job, kernels=KernelSwitches(tp_comm_overlap=False)))
        assert off.tp_collectives[(1, "B")] == split


def test_overlap_gemm_names():
    assert overlap_gemm("W: QKV weight-gradient GEMM") == "QKV wgrad"
    assert overlap_gemm("I: MLP up input-gradient GEMM") == "FC1 dgrad"
    assert overlap_gemm("W: head weight-gradient GEMM") == "LM head wgrad"
    assert overlap_gemm("") is None and overlap_gemm("attention of the block held") is None


def test_a_blocking_collective_is_exposed_whole():
    hw = load_hardware("dgx-h100")
    par = ParallelDims(pp=1, tp=2)
    action = Action(0, Kind.B, 0)
    whole = _tp_time(0, action, hw, True, par, {(0, "B"): (TpCollective("all_reduce", 2**24),)})
    assert whole == collective_seconds(hw, "all_reduce", [0, 1], 2**24) > 0


def _makespan(tmp_path, *flags):
    out = tmp_path / f"r{len(flags)}.json"
    assert pipesim_main(["simulate", "1f1b", "-p", "2", "-m", "4", "--model", "gpt", "--hidden", "512", "--layers",
                         "4", "--heads", "8", "--seq", "256", "--vocab", "1000", "--batch", "8", "--dtype", "bfloat16",
                         "--hardware", "dgx-h100", "--tp", "2", "--attention", "eager", *flags, "--json",
                         str(out)]) == 0
    return json.loads(out.read_text())["makespan"]


def test_fusion_and_overlap_flags_reach_the_simulation(tmp_path, capsys):
    base = _makespan(tmp_path)
    assert _makespan(tmp_path, "--no-kernel-fusion") > base
    assert _makespan(tmp_path, "--no-async-tensor-model-parallel-allreduce", "--no-kernel-fusion") > \
        _makespan(tmp_path, "--no-kernel-fusion")


def test_fused_cross_entropy_bytes_by_hand():
    """--cross-entropy-loss-fusion: Megatron-core's fused_cross_entropy.py as one kernel per @jit_fuser function:
    forward d + 20 bytes per logit (cast + max, subtract + exp + sum, divide), backward 8 + d, against the unfused
    d + 36 and 12 + d; Transformer Engine's (te) 3 d and 2 d; the GEMMs and the norm are the same."""
    opts = LayerOptions(tp=2, attention="flash")
    logits = 8 * 256 * 500  # b s tokens x the rank's 1000 / 2 vocabulary rows
    plain, fused, te = (head_kernels(GPT, 8, opts, ce_fusion=c) for c in ("unfused", "native", "te"))
    assert [k.nbytes for k in (*plain.F, *plain.I) if "cross-entropy" in k.name] == [logits * 38, logits * 14]
    assert [k.nbytes for k in (*fused.F, *fused.I) if "cross-entropy" in k.name] == [logits * 22, logits * 10]
    assert [k.nbytes for k in (*te.F, *te.I) if "cross-entropy" in k.name] == [logits * 6, logits * 4]  # 3 d, 2 d
    rest = [[k for k in (*pk.F, *pk.I, *pk.W) if "cross-entropy" not in k.name] for pk in (plain, fused, te)]
    assert rest[0] == rest[1] == rest[2]
