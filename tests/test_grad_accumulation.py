"""Gradient accumulation into main_grad (pipesim/model/grad_accumulation.py): its exact bytes, fused into the wgrad
GEMM's epilogue or a separate add, and `--no-gradient-accumulation-fusion` on GPU presets only."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipesim.cli import main as pipesim_main
from pipesim.cost.device_profiles import profile_of
from pipesim.cost.kernel_costs import piece_seconds
from pipesim.device.gemm import gemm_bytes, gemm_time
from pipesim.device.kernels import memory_bound_time
from pipesim.job import Job
from pipesim.kernel_switches import KernelSwitches
from pipesim.model.config import ModelConfig
from pipesim.model.grad_accumulation import accumulate_gradients, weight_gradient_params
from pipesim.model.kernel_types import Gemm, MemoryBound
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.options import LayerOptions, vocab_shard
from pipesim.model.param_counts import block_params, embedding_params, head_params
from pipesim.model.piece_kernels import embedding_kernels, head_kernels
from pipesim.parallel_dims import ParallelDims

GPT = ModelConfig(kind="gpt", hidden=512, layers=4, heads=8, seq=256, vocab=1000, batch=8, dtype="float16")
LLAMA = replace(GPT, kv_heads=4, ffn_hidden=1408, activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                positions="rope", dtype="bfloat16")


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_wgrad_gemms_hold_exactly_the_linear_weights(tp):
    h = GPT.hidden
    opts = LayerOptions(tp=tp)
    assert weight_gradient_params(layer_kernels(GPT, 2, opts)) == 12 * h * h // tp  # QKV 3h^2, proj h^2, MLP 8h^2
    assert block_params(GPT, tp) - 12 * h * h // tp == 3 * h // tp + h + 4 * h // tp + h + 4 * h  # biases, norms
    f, hkv = LLAMA.ffn_size, LLAMA.num_kv_heads * LLAMA.head_dim
    assert weight_gradient_params(layer_kernels(LLAMA, 2, opts)) == (h * (h + 2 * hkv) + h * h + 3 * h * f) // tp
    assert block_params(LLAMA, tp) - weight_gradient_params(layer_kernels(LLAMA, 2, opts)) == 2 * h  # RMSNorms
    assert weight_gradient_params(head_kernels(GPT, 2, opts)) == h * vocab_shard(GPT, tp)
    assert weight_gradient_params(embedding_kernels(GPT, 2, opts)) == 0


@pytest.mark.parametrize("model", [GPT, LLAMA])
def test_separate_adds_d_plus_2g_bytes_per_parameter_after_each_wgrad(model):
    opts = LayerOptions(tp=2)
    plain = layer_kernels(model, 2, opts)
    params, d = block_params(model, 2), model.dtype_bytes
    out = accumulate_gradients(plain, params, dtype_bytes=d, grad_bytes=4, fused=False)
    assert (out.F, out.I) == (plain.F, plain.I)
    wgrads = [k for k in plain.W if isinstance(k, Gemm)]
    adds = {k.name: k.nbytes for k in out.W if isinstance(k, MemoryBound) and "main_grad" in k.name}
    expected = {f"{g.name.removesuffix(' wgrad')} main_grad add": (d + 8) * g.m * g.n for g in wgrads}
    expected["main_grad add (biases, norms, tables)"] = (d + 8) * (params - weight_gradient_params(plain))
    assert adds == expected
    assert sum(adds.values()) == (d + 8) * params
    for n, k in enumerate(out.W):  # each add right after its GEMM
        if isinstance(k, Gemm):
            assert out.W[n + 1].name == k.name.removesuffix(" wgrad") + " main_grad add"


def test_fused_accumulates_in_the_gemm_epilogue_and_adds_only_the_other_parameters():
    opts = LayerOptions(tp=2)
    plain = layer_kernels(GPT, 2, opts)
    params = block_params(GPT, 2)
    out = accumulate_gradients(plain, params, dtype_bytes=2, grad_bytes=2, fused=True)
    assert [k.c_bytes for k in out.W if isinstance(k, Gemm)] == [4, 4, 4, 4]
    assert [k for k in out.W if isinstance(k, MemoryBound) and "main_grad" in k.name] == [
        MemoryBound("main_grad add (biases, norms, tables)", 6 * (params - 12 * 512 * 512 // 2))]
    # the epilogue reads and writes C: (m k + k n) d + m n c
    assert gemm_bytes(256, 384, 1024, 2, c_bytes=4) == (256 * 1024 + 1024 * 384) * 2 + 256 * 384 * 4
    assert gemm_bytes(256, 384, 1024, 2) == (256 * 1024 + 1024 * 384 + 256 * 384) * 2
    a100 = profile_of("A100")
    small_k = (Gemm("w", 4096, 4096, 64), Gemm("w", 4096, 4096, 64, c_bytes=8))  # memory-bound: the epilogue shows
    assert gemm_time(4096, 4096, 64, "float16", a100, c_bytes=8).seconds > gemm_time(4096, 4096, 64, "float16",
                                                                                     a100).seconds
    assert piece_seconds(type(plain)((), (), small_k[1:]), "float16", a100).W == \
        gemm_time(4096, 4096, 64, "float16", a100, c_bytes=8).seconds


def test_the_embedding_table_always_takes_the_hooks_add():
    opts = LayerOptions(tp=2)
    plain = embedding_kernels(GPT, 2, opts)
    for fused in (True, False):
        out = accumulate_gradients(plain, embedding_params(GPT, 2), dtype_bytes=2, grad_bytes=2, fused=fused)
        assert out.W[-1] == MemoryBound("main_grad add (biases, norms, tables)", 6 * embedding_params(GPT, 2))
    head = accumulate_gradients(head_kernels(GPT, 2, opts), head_params(GPT, 2), dtype_bytes=2, grad_bytes=2,
                                fused=False)
    assert [k.nbytes for k in head.W if isinstance(k, MemoryBound)] == [6 * 512 * vocab_shard(GPT, 2), 6 * 2 * 512]


def test_a_piece_smaller_than_its_gemms_is_refused():
    with pytest.raises(ValueError, match="has 3145728 in its weight-gradient GEMMs"):
        accumulate_gradients(layer_kernels(GPT, 2, LayerOptions()), 10, dtype_bytes=2, grad_bytes=2, fused=True)


def _step(tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    code = pipesim_main(["simulate", "1f1b", "--model", "gpt", "--hidden", "1024", "--layers", "4", "--heads", "16",
                         "--seq", "1024", "--batch", "16", "--stages", "2", "--microbatches", "4", *extra,
                         "--json", str(out)])
    assert code == 0
    return json.loads(out.read_text())


def test_the_flag_adds_exactly_the_separate_adds_on_a_gpu_preset_and_is_refused_on_the_cpu(tmp_path, capsys):
    gpu = ("--hardware", "dgx-a100", "--dtype", "float16")
    fused, separate = _step(tmp_path, "f", *gpu), _step(tmp_path, "s", *gpu, "--no-gradient-accumulation-fusion")
    assert separate["step_time"] > fused["step_time"]
    capsys.readouterr()
    # the calibrated CPU host's equation has no GEMM epilogue to move the adds out of: the flag would change nothing
    assert pipesim_main(["simulate", "1f1b", "--model", "gpt", "--stages", "2", "--microbatches", "4", "--hardware",
                         "local-cpu", "--no-gradient-accumulation-fusion"]) == 2
    assert capsys.readouterr().err == ("pipesim: error: --no-gradient-accumulation-fusion acts on GPU kernels: "
                                       "local-cpu has no GPU device family (use a GPU preset)\n")
    # one layer's W on the kernel path: separate - fused = the weights' adds less what the epilogues cost
    a100, model = profile_of("A100"), ModelConfig(kind="gpt", hidden=1024, layers=4, heads=16, seq=1024,
                                                  batch=16, dtype="float16")
    plain = layer_kernels(model, 4, LayerOptions())
    f, s = (piece_seconds(accumulate_gradients(plain, block_params(model), dtype_bytes=2, grad_bytes=2, fused=x),
                          "float16", a100).W for x in (True, False))
    gemms = [k for k in plain.W if isinstance(k, Gemm)]
    epilogue = sum(gemm_time(g.m, g.n, g.k, "float16", a100, c_bytes=4).seconds
                   - gemm_time(g.m, g.n, g.k, "float16", a100).seconds for g in gemms)
    adds = sum(memory_bound_time(6 * g.m * g.n, a100).seconds for g in gemms)
    assert s - f == pytest.approx(adds - epilogue, rel=1e-9)


def test_float32_main_grads_double_the_gradient_bytes_everywhere_they_are_counted():
    """--accumulate-allreduce-grads-in-fp32: memory, the dp reduction and the accumulation move 4 bytes per gradient."""
    from pipesim.cost.model_costs import model_costs
    from pipesim.hardware.toml_io import load_hardware

    hw = load_hardware("dgx-a100")
    model = ModelConfig(kind="gpt", hidden=1024, layers=4, heads=16, seq=1024, batch=16, dtype="bfloat16")
    dp2 = Job(ParallelDims(dp=2))
    mixed = model_costs(model, 2, 4, hw, replace(dp2, kernels=KernelSwitches(grad_fp32=False)))
    fp32_job = replace(dp2, kernels=KernelSwitches(grad_fp32=True))
    fp32 = model_costs(model, 2, 4, hw, fp32_job)
    assert (mixed.precision, fp32.precision) == ("mixed", "megatron")
    # Megatron's defaults: bfloat16 takes float32 main gradients by itself, float16 keeps 16-bit ones
    assert model_costs(model, 2, 4, hw, dp2).precision == "megatron"
    assert model_costs(replace(model, dtype="float16"), 2, 4, hw, dp2).precision == "mixed"
    for a, b, params in zip(mixed.step.collectives, fp32.step.collectives, mixed.param_counts):
        assert [(c.kind, c.nbytes) for c in a] == [("all_reduce", 2 * params)]  # ZeRO 0: one all_reduce
        assert [(c.kind, c.nbytes) for c in b] == [("all_reduce", 4 * params)]
    layer = accumulate_gradients(layer_kernels(model, 4, LayerOptions()), block_params(model), dtype_bytes=2,
                                 grad_bytes=4, fused=True)
    assert {k.c_bytes for k in layer.W if isinstance(k, Gemm)} == {8}  # the epilogue reads and writes float32 C
    assert fp32.table.stages[1].backward_weight > mixed.table.stages[1].backward_weight
    assert model_costs(replace(model, dtype="float32"), 2, 4, hw, fp32_job).precision == "fp32"


def test_the_flag_doubles_each_ranks_gradient_memory(tmp_path):
    base = ("--hardware", "dgx-a100", "--dp", "2", "--dtype", "float16")
    mixed, fp32 = _step(tmp_path, "m", *base), _step(tmp_path, "f", *base, "--accumulate-allreduce-grads-in-fp32")
    for a, b in zip(mixed["memory"]["ranks"], fp32["memory"]["ranks"]):
        assert b["gradients"] == 2 * a["gradients"] > 0 and b["parameters"] == a["parameters"]
    assert fp32["step_time"] > mixed["step_time"]
    # bfloat16: float32 gradients unless --grad-reduce-in-bf16 (Megatron's flags)
    bf16 = ("--hardware", "dgx-a100", "--dp", "2", "--dtype", "bfloat16")
    default, bf16_grads = _step(tmp_path, "d", *bf16), _step(tmp_path, "b", *bf16, "--grad-reduce-in-bf16")
    for a, b in zip(bf16_grads["memory"]["ranks"], default["memory"]["ranks"]):
        assert b["gradients"] == 2 * a["gradients"] > 0 and b["parameters"] == a["parameters"]
    given = _step(tmp_path, "e", *bf16, "--accumulate-allreduce-grads-in-fp32")
    assert (given["step_time"], given["memory"]) == (default["step_time"], default["memory"])


def test_grad_reduce_in_bf16_is_refused_off_bfloat16(capsys):
    assert pipesim_main(["simulate", "1f1b", "-p", "2", "-m", "4", "--model", "gpt", "--hardware", "dgx-a100",
                 "--dtype", "float16", "--grad-reduce-in-bf16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--grad-reduce-in-bf16 needs a bfloat16 model (--dtype bfloat16), got float16" in err
