"""`--fp8-impl torchao` (the torchtitan profile's): torchao's Float8Linear casts every operand at its use, keeps no FP8
weight copy and saves its input in the dtype (pipesim.model.fp8_kernels.torchao_layer_kernels)."""

from __future__ import annotations

import json

import pytest

from pipesim.cli import build_parser, main
from pipesim.commands.setup_args import sim_job
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.activations import layer_saved_tensors
from pipesim.model.config import ModelConfig
from pipesim.model.fp8 import Fp8Options
from pipesim.model.fp8_kernels import torchao_layer_kernels
from pipesim.model.kernel_types import Gemm, MemoryBound, PieceKernels
from pipesim.model.options import LayerOptions
from pipesim.parallel_dims import ParallelDims
from pipesim.plan.exports import megatron_args
from pipesim.plan.space import Candidate, PlanRequest
from pipesim.plan.torchtitan_export import torchtitan_fp8

TORCHAO = Fp8Options("hybrid", "tensorwise", "torchao")
LLAMA = ["--model-config", "llama3.1-8b", "--seq", "2048", "--batch", "8", "--microbatch-size", "1"]


def test_one_linear_casts_each_operand_at_its_use():
    """FC2 of 100 tokens, 30 in, 20 out, bf16: input and weight before the forward GEMM, output gradient and weight
    before the dgrad, output gradient and input again before the wgrad; each an amax pass (read 2 bytes per element)
    and a row-wise cast (read 2, write 1); each FP8 GEMM writes its output in the dtype."""
    kernels = PieceKernels((Gemm("FC2", 100, 20, 30),), (Gemm("FC2 dgrad", 100, 30, 20),),
                           (Gemm("FC2 wgrad", 30, 20, 100),))
    got = torchao_layer_kernels(kernels, TORCHAO, dtype_bytes=2)

    def casts(what: str, elements: int) -> list[MemoryBound]:
        return [MemoryBound(f"FC2 {what} amax", 2 * elements), MemoryBound(f"FC2 {what} cast", 3 * elements)]

    assert got.F == (*casts("input", 100 * 30), *casts("weight", 30 * 20),
                     Gemm("FC2", 100, 20, 30, c_bytes=2, dtype="float8"))
    assert got.I == (*casts("output gradient", 100 * 20), *casts("weight", 30 * 20),
                     Gemm("FC2 dgrad", 100, 30, 20, c_bytes=2, dtype="float8"))
    assert got.W == (*casts("output gradient (wgrad)", 100 * 20), *casts("input (wgrad)", 100 * 30),
                     Gemm("FC2 wgrad", 30, 20, 100, c_bytes=2, dtype="float8"))


def test_compiled_tensorwise_casts_each_tensor_once_as_torchaos_roofline_counts():
    """Under torch.compile one scale per tensor lets Inductor cast each activation and output gradient once, writing
    both layouts, and read the weight for its amax once: torchao's roofline model of the recipe
    (torchao/testing/training/roofline_utils.py @ 36027d8, no fusion into the producer) gives, per linear of M tokens,
    K in and N out, 6 MK + 6 MN + 8 KN bytes of casts at 2 bytes per element; the wgrad adds none."""
    m, k, n = 100, 30, 20
    kernels = PieceKernels((Gemm("FC2", m, n, k),), (Gemm("FC2 dgrad", m, k, n),), (Gemm("FC2 wgrad", k, n, m),))
    got = torchao_layer_kernels(kernels, TORCHAO, dtype_bytes=2, compiled=True)
    casts = [x for phase in got.phases() for x in phase if isinstance(x, MemoryBound)]
    assert sum(x.nbytes for x in casts) == 6 * m * k + 6 * m * n + 8 * k * n
    assert got.F == (MemoryBound("FC2 input amax", 2 * m * k), MemoryBound("FC2 input cast (both layouts)", 4 * m * k),
                     MemoryBound("FC2 weight amax", 2 * k * n), MemoryBound("FC2 weight cast", 3 * k * n),
                     Gemm("FC2", m, n, k, c_bytes=2, dtype="float8"))
    assert got.I == (MemoryBound("FC2 output gradient amax", 2 * m * n),
                     MemoryBound("FC2 output gradient cast (both layouts)", 4 * m * n),
                     MemoryBound("FC2 weight cast", 3 * k * n), Gemm("FC2 dgrad", m, k, n, c_bytes=2, dtype="float8"))
    assert got.W == (Gemm("FC2 wgrad", k, n, m, c_bytes=2, dtype="float8"),)
    eager = torchao_layer_kernels(kernels, TORCHAO, dtype_bytes=2)  # each operand at its use: 10 bytes per element
    assert sum(x.nbytes for ph in eager.phases() for x in ph if isinstance(x, MemoryBound)) == 10 * (m * k + m * n
                                                                                                    + k * n)


def test_compiled_tensorwise_casts_a_gathered_input_on_its_shard_and_transposes_the_gathered_copy():
    """DTensor's sequence parallelism gathers QKV's input in FP8: amax and a one-layout cast on the rank's 1/tp shard,
    then the gathered copy transposed for the wgrad (read 1, write 1 byte per element)."""
    kernels = PieceKernels((Gemm("QKV", 64, 48, 32),), (), ())
    got = torchao_layer_kernels(kernels, TORCHAO, dtype_bytes=2, gathered_shard=4, compiled=True)
    x = 64 * 32  # the gathered input's elements
    assert got.F[:3] == (MemoryBound("QKV input amax", 2 * x // 4), MemoryBound("QKV input cast", 3 * x // 4),
                         MemoryBound("QKV input transpose", 2 * x))


def test_it_keeps_no_weight_copy_and_saves_inputs_in_the_dtype(capsys):
    base = ["simulate", "1f1b", *LLAMA, "--hardware", "dgx-h100", "--stages", "1", "--dp", "8", "--zero", "3",
            "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--json"]
    memory = {}
    for impl in ("te", "torchao"):
        assert main([*base, "--fp8-impl", impl]) == 0
        memory[impl] = json.loads(capsys.readouterr().out)["memory"]["ranks"][0]
    assert memory["te"]["fp8_weights"] > 0 and "fp8_weights" not in memory["torchao"]  # the JSON lists set terms
    assert memory["torchao"]["activations"] > memory["te"]["activations"]
    model = ModelConfig(kind="gpt", hidden=256, heads=8, layers=2, seq=64, kv_heads=2, activation="swiglu",
                        ffn_hidden=512, dtype="bfloat16")
    names = {x.name for x in layer_saved_tensors(model, 1, LayerOptions(attention="flash", fp8=TORCHAO))}
    assert "QKV input" in names and not any("FP8" in n for n in names)


def test_torchao_has_only_its_recipes_and_reads_back():
    with pytest.raises(PipesimError, match="--fp8-impl torchao has no delayed recipe"):
        Fp8Options("hybrid", "delayed", "torchao")
    job = Job(ParallelDims(dp=2), attention="flash", fp8=TORCHAO)
    assert job.flags()[-6:] == ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-impl", "torchao"]
    argv = ["simulate", "1f1b", "--model", "gpt", "--dtype", "bfloat16", "--dp", "2", *job.flags()]
    model = ModelConfig(kind="gpt", dtype="bfloat16")
    assert sim_job(build_parser().parse_args(argv), model, load_hardware("dgx-h100")) == job
    # the torchtitan profile's float8 is torchao's, tensorwise unless said
    args = build_parser().parse_args(["simulate", "1f1b", "--model", "gpt", "--dtype", "bfloat16", "--framework",
                                      "torchtitan", "--fp8-format", "hybrid"])
    assert sim_job(args, model, load_hardware("dgx-h100")).fp8 == TORCHAO


def test_megatrons_export_names_te_flags_and_says_what_was_timed():
    req = PlanRequest(ModelConfig(kind="gpt", dtype="bfloat16", batch=16), load_hardware("dgx-h100"), 8,
                      job=Job(fp8=TORCHAO))
    args = megatron_args(Candidate("1f1b", 1, 1, 1, 8, 1, 2, "none", 0), req)
    assert "--fp8-impl" not in args and args[args.index("--fp8-recipe") + 1] == "tensorwise"
    assert "# pipesim timed torchao's float8 linears (--fp8-impl torchao); Megatron-core runs Transformer Engine's" \
        in args



def test_fsdp2s_float8_all_gather_gathers_one_byte_and_casts_no_weight_at_its_use(capsys):
    """--fp8-param-gather under ZeRO 3 with torchao (its enable_fsdp_float8_all_gather): each FP8 linear's parameter
    all-gathered as one byte instead of two, the weights reaching the linears already cast; the shards stay."""
    gathered = Fp8Options("hybrid", "tensorwise", "torchao", gathered=True)
    kernels = PieceKernels((Gemm("FC2", 100, 20, 30),), (Gemm("FC2 dgrad", 100, 30, 20),), ())
    got = torchao_layer_kernels(kernels, gathered, dtype_bytes=2)
    assert not any("weight" in k.name for k in (*got.F, *got.I))
    assert Job(ParallelDims(dp=2), zero=3, fp8=TORCHAO, fp8_param_gather=True).layer_fp8 == gathered
    base = ["simulate", "1f1b", *LLAMA, "--hardware", "dgx-h100", "--stages", "1", "--dp", "8", "--zero", "3",
            "--fp8-format", "hybrid", "--fp8-impl", "torchao", "--json"]
    runs = {}
    for name, extra in (("bf16", []), ("fp8", ["--fp8-param-gather"])):
        assert main([*base, *extra]) == 0
        runs[name] = json.loads(capsys.readouterr().out)
    gathers = {name: sorted(c["bytes"] for c in run["collectives"] if c["kind"] == "all_gather")
               for name, run in runs.items()}
    assert len(gathers["fp8"]) == len(gathers["bf16"]) and all(f < b for f, b in zip(gathers["fp8"], gathers["bf16"]))
    assert runs["fp8"]["memory"]["ranks"][0]["parameters"] == runs["bf16"]["memory"]["ranks"][0]["parameters"]
    assert runs["fp8"]["step_time"] < runs["bf16"]["step_time"]


def test_compiled_rowwise_casts_as_torchaos_roofline_counts():
    """torchao's rowwise recipe under torch.compile (roofline_utils.py @ 36027d8, 'rowwise', no fusion into the
    producer): per linear of M tokens, K in and N out at 2 bytes, 8 MK + 8 MN + 10 KN bytes of casts; each tensor a
    wgrad reads along its other axis is cast again from a transposed copy in the dtype."""
    m, k, n = 100, 30, 20
    rowwise = Fp8Options("e4m3", "rowwise", "torchao")
    kernels = PieceKernels((Gemm("FC2", m, n, k),), (Gemm("FC2 dgrad", m, k, n),), (Gemm("FC2 wgrad", k, n, m),))
    got = torchao_layer_kernels(kernels, rowwise, dtype_bytes=2, compiled=True)
    assert got.F == (MemoryBound("FC2 input cast (row-wise, transposed copy)", 5 * m * k),
                     MemoryBound("FC2 weight cast (row-wise)", 3 * k * n),
                     Gemm("FC2", m, n, k, c_bytes=2, dtype="float8"))
    assert got.I == (MemoryBound("FC2 output gradient cast (row-wise, transposed copy)", 5 * m * n),
                     MemoryBound("FC2 weight transpose", 4 * k * n),
                     MemoryBound("FC2 weight cast (column-wise)", 3 * k * n),
                     Gemm("FC2 dgrad", m, k, n, c_bytes=2, dtype="float8"))
    assert got.W == (MemoryBound("FC2 output gradient cast (column-wise)", 3 * m * n),
                     MemoryBound("FC2 input cast (column-wise)", 3 * m * k),
                     Gemm("FC2 wgrad", k, n, m, c_bytes=2, dtype="float8"))
    casts = [x for phase in got.phases() for x in phase if isinstance(x, MemoryBound)]
    assert sum(x.nbytes for x in casts) == 8 * m * k + 8 * m * n + 10 * k * n
    # eager: each operand cast at its use after a per-row amax pass, the same bytes as tensorwise's
    eager = torchao_layer_kernels(kernels, rowwise, dtype_bytes=2)
    assert eager == torchao_layer_kernels(kernels, TORCHAO, dtype_bytes=2)
    # under DTensor's sequence parallelism a rowwise input is gathered in the dtype (only tensorwise gathers in FP8)
    qkv = PieceKernels((Gemm("QKV", 64, 48, 32),), (), ())
    assert torchao_layer_kernels(qkv, rowwise, dtype_bytes=2, gathered_shard=4, compiled=True) == \
        torchao_layer_kernels(qkv, rowwise, dtype_bytes=2, compiled=True)


@pytest.mark.parametrize("extra,message", [
    (["--fp8-format", "e4m3", "--fp8-recipe", "rowwise"],
     "--fp8-recipe rowwise is torchao's (Transformer Engine has no such recipe): give --fp8-impl torchao"),
    (["--fp8-format", "e4m3", "--fp8-recipe", "rowwise", "--fp8-impl", "torchao", "--zero", "3", "--fp8-param-gather"],
     "FSDP2's float8 all-gather, which takes tensorwise scaling only (torchao/float8/config.py), got --fp8-recipe "
     "rowwise"),
])
def test_rowwise_is_torchaos_and_gathers_in_the_dtype(capsys, extra, message):
    base = ["simulate", "1f1b", *LLAMA, "--hardware", "dgx-h100", "--stages", "1", "--dp", "8", "--json"]
    assert main([*base, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert main([*base, "--framework", "torchtitan", "--fp8-format", "e4m3", "--fp8-recipe", "rowwise"]) == 0


def test_the_exports_name_rowwise_where_the_framework_has_it():
    """torchtitan's float8 section takes torchao's recipe name; Megatron-core has no rowwise, so its export gives the
    nearest (tensorwise) and says so."""
    assert torchtitan_fp8("rowwise") == ["[model]", 'converters = ["quantize.linear.float8"]', "",
                                         "[quantize.linear.float8]", 'recipe_name = "rowwise"',
                                         'filter_fqns = ["output"]']
    assert torchtitan_fp8("delayed")[0] == "# torchao has no delayed scaling: tensorwise (current scaling) is the " \
                                           "nearest recipe"
    req = PlanRequest(ModelConfig(kind="gpt", dtype="bfloat16", batch=16), load_hardware("dgx-h100"), 8,
                      job=Job(fp8=Fp8Options("e4m3", "rowwise", "torchao")))
    args = megatron_args(Candidate("1f1b", 1, 1, 1, 8, 1, 2, "none", 0), req)
    assert args[args.index("--fp8-recipe") + 1] == "tensorwise"
    assert "# Megatron-core has no rowwise recipe (torchao's): tensorwise, current scaling, is nearest" in args
