"""NVFP4 (Megatron-core's --fp4-format e2m1 --fp4-recipe nvfp4, Transformer Engine's NVFP4BlockScaling) on Blackwell:
its bytes, its casts, its GEMMs at the FP4 tensor cores' figures, and its refusals, each against a hand count."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import schedules
from pipesim.cli import main
from pipesim.cost.device_profiles import fp8_profile_of, profile_of
from pipesim.cost.fp8_costs import mfu_peak, stage_fp8_weights, weight_cast
from pipesim.cost.kernel_costs import fp8_layer, kernel_seconds
from pipesim.cost.model_costs import model_costs
from pipesim.cost.rank_memory import rank_memory
from pipesim.device.fp8_rates import Fp8Figures, load_fp8_figures
from pipesim.device.gemm import gemm_time
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig, split_layers
from pipesim.model.fp8 import Fp8Options, cast_write_bytes, saved_bytes, weight_copy_bytes
from pipesim.model.kernel_types import Gemm, MemoryBound
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.options import LayerOptions
from pipesim.parallel_dims import ParallelDims
from pipesim.plan.exports import megatron_args
from pipesim.plan.space import PlanRequest, enumerate_candidates
from tests.test_fp8 import HKV, HQ, LLAMA, TOKENS, D, F, H  # the same small Llama layer, hand-counted there

NVFP4 = Fp8Options("e2m1", "nvfp4")


def _opts(fp8=NVFP4, **kw) -> LayerOptions:
    return LayerOptions(attention="flash", fp8=fp8, **kw)


def _bytes(pk, phase: str) -> dict[str, int]:
    return {k.name: k.nbytes for k in pk.phase(phase) if isinstance(k, MemoryBound)}


def test_nvfp4_bytes_by_hand():
    # half a byte per E2M1 element, one E4M3 scale per 16 elements
    assert saved_bytes(1024, NVFP4) == 512 + 64
    assert cast_write_bytes(1024, NVFP4, tn_only=False) == 2 * (512 + 64)  # row-wise and the transformed column-wise
    assert cast_write_bytes(1024, NVFP4, tn_only=False, transposed=False) == 512 + 64
    # weights: 16 x 16 blocks, one E4M3 scale per 256 elements, the copy and its transpose
    assert weight_copy_bytes(65536, NVFP4, tn_only=False) == 2 * (32768 + 256)
    assert NVFP4.gemm_dtype == "float4" and Fp8Options("e4m3", "mxfp8").gemm_dtype == "float8"
    assert NVFP4.flags() == ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    assert NVFP4.report() == {"fp4_format": "e2m1", "fp4_recipe": "nvfp4"}  # --json's words: the flags'
    assert Fp8Options("hybrid", "tensorwise", "torchao").report() == \
        {"fp8_format": "hybrid", "fp8_recipe": "tensorwise", "fp8_impl": "torchao"}
    assert (NVFP4.param_gather_flag, Fp8Options().param_gather_flag) == ("--fp4-param-gather", "--fp8-param-gather")


def test_nvfp4_casts_by_hand():
    pk = fp8_layer(LLAMA, 1, _opts(), True, "B200")
    quantized = {k.name for ph in "FIW" for k in pk.phase(ph) if isinstance(k, Gemm) and k.dtype == "float4"}
    assert quantized == {f"{x}{s}" for x in ("QKV", "projection", "FC1", "FC2") for s in ("", " dgrad", " wgrad")}
    e_in, e_qkv = TOKENS * H, TOKENS * (HQ + 2 * HKV)
    f, i = _bytes(pk, "F"), _bytes(pk, "I")
    # every cast first reads its tensor for the amaxes (TE's nvte_hadamard_transform_amax), then one fused kernel
    # writes the row-wise copy and the Hadamard-transformed column-wise one, each with its scales
    assert f["QKV input amax"] == D * e_in
    assert f["QKV input cast"] == D * e_in + 2 * (e_in // 2 + e_in // 16)
    assert i["QKV output gradient amax"] == D * e_qkv
    assert i["QKV output gradient cast"] == D * e_qkv + 2 * (e_qkv // 2 + e_qkv // 16)
    e_proj = TOKENS * HQ  # the projection keeps its bf16 input (save_original_input): row-wise now, column-wise in W
    assert f["projection input cast"] == D * e_proj + e_proj // 2 + e_proj // 16
    assert _bytes(pk, "W") == {"projection input (column-wise) amax": D * e_proj,
                               "projection input (column-wise) cast": D * e_proj + e_proj // 2 + e_proj // 16}
    sp = fp8_layer(LLAMA, 1, _opts(tp=2, sp=True), True, "B200")  # the shard cast in both directions, then gathered
    assert _bytes(sp, "F")["QKV input cast"] == D * e_in // 2 + 2 * (e_in // 4 + e_in // 32)


def test_an_nvfp4_gemm_is_the_gemm_model_at_the_fp4_tensor_cores_figures():
    b200 = profile_of("B200")
    by_hand = replace(b200, flops={**b200.flops, "float4": 9000e12}, matmul_efficiency=0.497)
    gemm = Gemm("FC1", 8192, 8192, 8192, dtype="float4", c_bytes=D)
    got = kernel_seconds(gemm, "bfloat16", b200, fp8=fp8_profile_of("B200", None, "nvfp4"))
    want = gemm_time(8192, 8192, 8192, "float4", by_hand, c_bytes=D)
    assert got == want.seconds
    assert want.bytes_moved == 2 * 8192**2 * 0.5 + 8192**2 * D  # E2M1 operands, bf16 output
    fig = load_fp8_figures()["B200"]
    assert fig.peak_of("nvfp4") == 2 * fig.peak_of("mxfp8") == 9000e12
    # cuBLAS's FP4 GEMM at 8192^3 on a B200 (DeepGEMM PR #348: 5239 TFLOP/s) x the B200's sustained fraction 1237/1450
    assert fig.efficiency("nvfp4") == round(5239 / 9000 * 1237 / 1450, 3)
    hw = load_hardware("hgx-b200")
    assert mfu_peak(hw, LLAMA, NVFP4) == 9000e12 and mfu_peak(hw, LLAMA, Fp8Options("e4m3", "mxfp8")) == 4500e12


def test_nvfp4_weight_copies_and_their_cast_by_hand():
    per_layer = H * (HQ + 2 * HKV) + HQ * H + H * 2 * F + F * H
    params, weights = stage_fp8_weights(LLAMA, 1, _opts(), "B200", StageLayers.uniform(2))
    assert (params, weights) == (2 * per_layer, 8)
    # an amax pass, then one cast writing both directions: 2 kernels per weight
    assert weight_cast(params, weights, NVFP4, dtype_bytes=D, tn_only=False) == \
        (2 * D * params + 2 * (params // 2 + params // 256), 16)


def test_a_family_offering_nvfp4_names_its_fp4_figures():
    with pytest.raises(PipesimError, match="recipe nvfp4 needs fp4_peak and its own recipe_efficiency"):
        Fp8Figures("X", 4500e12, 0.6, False, ("mxfp8", "nvfp4"))
    with pytest.raises(PipesimError, match="--fp4-recipe nvfp4 goes with --fp4-format e2m1"):
        Fp8Options("e4m3", "nvfp4")
    with pytest.raises(PipesimError, match="goes with --fp4-format"):
        Fp8Options("e2m1", "mxfp8")


def test_nvfp4_refusals_are_one_line_and_exit_2(capsys):
    base = ["simulate", "1f1b", "-p", "2", "-m", "4", "--model-config", "llama3-8b", "--seq", "1024", "--batch", "8"]
    cases = [(["--hardware", "dgx-h100", "--fp4-format", "e2m1"],
              "--fp4-recipe nvfp4 needs Blackwell (B200, B300): H100-SXM5-80GB runs delayed, tensorwise"),
             (["--hardware", "hgx-b200", "--fp4-recipe", "nvfp4"], "--fp4-recipe nvfp4 needs --fp4-format e2m1"),
             (["--hardware", "dgx-a100", "--fp4-format", "e2m1"],
              "--fp4-format needs FP4 tensor cores (Blackwell: B200, B300): A100-SXM4-80GB has none"),
             (["--hardware", "hgx-b200", "--fp4-format", "e2m1", "--dtype", "float32"],
              "--fp4-format needs 16-bit parameters (--dtype bfloat16), got float32"),
             (["--hardware", "hgx-b200", "--fp4-format", "e2m1", "--fp8-format", "e4m3"],
              "--fp4-format and --fp8-format cannot be used together"),
             (["--hardware", "hgx-b200", "--fp4-format", "e2m1", "--fp8-impl", "torchao"],
              "--fp8-impl torchao has none"),
             (["--hardware", "hgx-b200", "--fp4-format", "e2m1", "--zero", "1", "--dp", "2", "--nodes", "1",
               "--fp8-param-gather"], "NVFP4 parameters are gathered by --fp4-param-gather (Megatron-core's flag)"),
             (["--hardware", "hgx-b200", "--fp8-format", "e4m3", "--fp4-param-gather"],
              "--fp4-param-gather must be used together with --fp4-format"),
             (["--hardware", "hgx-b200", "--fp4-format", "e2m1", "--fp4-param-gather"],
              "--fp4-param-gather needs the distributed optimizer (--zero 1 or 2), got --zero 0")]
    for extra, message in cases:
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("pipesim: error: ") and message in err and "\n" not in err


def test_nvfp4_runs_end_to_end_and_the_planner_exports_megatrons_flags(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["simulate", "1f1b", "-p", "1", "--model-config", "llama3-8b", "--seq", "2048", "--batch", "4",
                 "--microbatch-size", "1", "--hardware", "hgx-b200", "--nodes", "1", "--dp", "4", "--zero", "1",
                 "--fp4-format", "e2m1", "--fp4-param-gather", "--json", str(out)]) == 0
    options = json.loads(out.read_text())["options"]  # in the flags' names
    assert (options["fp4_format"], options["fp4_recipe"], options["fp4_param_gather"]) == ("e2m1", "nvfp4", True)
    assert "fp8_format" not in options and "fp8_param_gather" not in options
    capsys.readouterr()
    model = ModelConfig(kind="gpt", hidden=1024, layers=8, heads=16, seq=1024, vocab=32000, batch=16)
    req = PlanRequest(model, load_hardware("hgx-b200"), 8, ("1f1b",), None, ("none",), (0,), Job(fp8=NVFP4))
    args = megatron_args(enumerate_candidates(req)[0], req)
    assert args[args.index("--fp4-format"):args.index("--fp4-format") + 4] == ["--fp4-format", "e2m1",
                                                                               "--fp4-recipe", "nvfp4"]
    assert "--fp8-format" not in args
    assert Job(fp8=NVFP4).flags()[-4:] == NVFP4.flags()


def test_fp4_param_gather_keeps_the_parameters_in_nvfp4_and_gathers_packed_bytes():
    """Megatron-core's --fp4-param-gather: the NVFP4 linears' parameters are their NVFP4 copies (the 16-bit copy goes)
    and the distributed optimizer all-gathers them as packed bytes, two elements to a byte (param_and_grad_buffer.py:
    numel // 2 uint8), so the gather moves 2 (P - Pq) + Pq / 2 bytes."""
    hw = load_hardware("hgx-b200")
    plain, fp4 = (model_costs(LLAMA, 2, 2, hw, Job(ParallelDims(pp=2, dp=4), zero=1, fp8=NVFP4, attention="flash",
                                                   fp8_param_gather=g)) for g in (False, True))
    opts = plain.job.layer_options(LLAMA)
    quantized = [stage_fp8_weights(LLAMA, 1, opts, "B200", StageLayers.uniform(n))[0]
               for n in split_layers(LLAMA.layers, 2)]
    assert fp4.fp8_param_counts == tuple(quantized)
    for s in range(2):
        gather = {c.kind: c.nbytes for c in fp4.step.collectives[s]}["all_gather"]
        assert gather == 2 * (plain.param_counts[s] - quantized[s]) + quantized[s] // 2
    sched = schedules.build("1f1b", 2, 2)
    for r, (a, b) in enumerate(zip(rank_memory(sched, plain), rank_memory(sched, fp4), strict=True)):
        assert a.parameters - b.parameters == 2 * quantized[r] and a.fp8_weights == b.fp8_weights
    assert Job(ParallelDims(dp=2), zero=1, fp8=NVFP4, fp8_param_gather=True).flags()[-5:] == \
        [*NVFP4.flags(), "--fp4-param-gather"]


def test_transformer_engines_nvfp4_switches_turned_off():
    """--nvfp4-disable (TE's NVTE_NVFP4_DISABLE_* environment): without 2D quantization each weight copy carries
    1 x 16 block scales (an activation's) instead of 16 x 16 ones; without the random Hadamard transform or
    stochastic rounding the casts read and write the same bytes, so nothing pipesim counts moves."""
    one_d = Fp8Options("e2m1", "nvfp4", nvfp4_disabled=("2d-quantization",))
    p = 16 * 1024 * 1024
    assert weight_copy_bytes(p, NVFP4, tn_only=False) == 2 * (p // 2 + p // 256)
    assert weight_copy_bytes(p, one_d, tn_only=False) == 2 * (p // 2 + p // 16)
    hw = load_hardware("hgx-b200")
    job = Job(ParallelDims(pp=2), fp8=NVFP4, attention="flash")
    plain, quiet, flat = (model_costs(LLAMA, 2, 2, hw, replace(job, fp8=f)) for f in
                          (NVFP4, Fp8Options("e2m1", "nvfp4", nvfp4_disabled=("stochastic-rounding", "rht")), one_d))
    assert (quiet.table, quiet.fp8_weight_bytes, quiet.step) == (plain.table, plain.fp8_weight_bytes, plain.step)
    params = [stage_fp8_weights(LLAMA, 1, _opts(), "B200", StageLayers.uniform(n))[0]
               for n in split_layers(LLAMA.layers, 2)]
    assert flat.fp8_weight_bytes == tuple(2 * (n // 2 + n // 16) for n in params)
    assert flat.table == plain.table  # the weights' cast is charged once per step, with the optimizer
    assert all(a > b for a, b in zip(flat.step.optimizer_seconds, plain.step.optimizer_seconds, strict=True))
    # canonical order, reported as a list, exported to Megatron as the environment it is
    assert Fp8Options("e2m1", "nvfp4", nvfp4_disabled=("rht", "2d-quantization", "stochastic-rounding")).flags() == \
        ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4", "--nvfp4-disable", "rht", "stochastic-rounding",
         "2d-quantization"]
    assert one_d.report() == {"fp4_format": "e2m1", "fp4_recipe": "nvfp4", "nvfp4_disable": ["2d-quantization"]}
    model = ModelConfig(kind="gpt", hidden=1024, layers=8, heads=16, seq=1024, vocab=32000, batch=16)
    req = PlanRequest(model, hw, 8, ("1f1b",), None, ("none",), (0,), Job(fp8=one_d))
    args = megatron_args(enumerate_candidates(req)[0], req)
    assert "--nvfp4-disable" not in args and "# in the environment: NVTE_NVFP4_DISABLE_2D_QUANTIZATION=1" in args
    with pytest.raises(PipesimError) as err:
        Fp8Options("e4m3", "mxfp8", nvfp4_disabled=("rht",))
    assert str(err.value) == "--nvfp4-disable turns off Transformer Engine's NVFP4 switches: it needs --fp4-format e2m1"
