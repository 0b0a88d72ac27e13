"""FP8 training (--fp8-format / --fp8-recipe): GEMM rates, cast kernels, memory, refusals and exports, each against
a hand count (pipesim.model.fp8, fp8_kernels, pipesim.device.fp8_rates, pipesim.cost.fp8_costs)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import tomllib

from pipesim.cli import main
from pipesim.cost.device_profiles import fp8_profile_of, profile_of
from pipesim.cost.fp8_costs import mfu_peak, stage_fp8_weights, weight_cast
from pipesim.cost.kernel_costs import fp8_layer, kernel_seconds
from pipesim.device.fp8_rates import check_fp8_recipe, load_fp8_figures
from pipesim.device.gemm import gemm_time
from pipesim.device.profile import device_profile
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.activations import layer_activation_bytes, layer_saved_tensors
from pipesim.model.config import ModelConfig
from pipesim.model.flops import model_flops, utilization
from pipesim.model.fp8 import Fp8Options, saved_bytes, weight_copy_bytes
from pipesim.model.hf_config import load_hf_config
from pipesim.model.kernel_types import MemoryBound
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.options import LayerOptions
from pipesim.parallel_dims import ParallelDims
from pipesim.plan.exports import megatron_args
from pipesim.plan.space import PlanRequest, enumerate_candidates
from pipesim.plan.torchtitan_export import torchtitan_toml

LLAMA = ModelConfig(kind="gpt", hidden=256, layers=4, heads=8, seq=128, vocab=512, batch=8, dtype="bfloat16",
                    kv_heads=2, ffn_hidden=512, activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                    positions="rope")
D = 2  # bfloat16 bytes
TOKENS = 128  # b = 1, seq 128
H, HQ, HKV, F = 256, 256, 64, 512  # hidden, query width, key/value width, MLP width
DELAYED, TENSORWISE = Fp8Options("hybrid", "delayed"), Fp8Options("hybrid", "tensorwise")


def _opts(fp8=DELAYED, **kw) -> LayerOptions:
    return LayerOptions(attention="flash", fp8=fp8, **kw)


def _bytes(pk, phase: str) -> dict[str, int]:
    return {k.name: k.nbytes for k in pk.phase(phase) if isinstance(k, MemoryBound)}


def test_shipped_fp8_figures_are_the_datasheets_with_a_source_each():
    figs = load_fp8_figures()
    assert list(figs) == ["H100", "H200", "B200", "B300"]  # no A100: no FP8 tensor cores
    for family, peak in (("H100", 1979e12), ("H200", 1979e12), ("B200", 4500e12), ("B300", 4500e12)):
        assert figs[family].peak == peak == pytest.approx(2 * device_profile(family).peak("bfloat16"), rel=1e-3)
        assert set(figs[family].sources) == {"peak", "matmul_efficiency", "tn_only", "recipes",
                                             *(("recipe_efficiency",) if figs[family].recipe_efficiency else ()),
                                             *(("fp4_peak",) if figs[family].fp4_peak else ())}
    # [MAMF]'s FP8 rows (torch._scaled_mm, bursts) x the H200 run's sustained fraction, on both GH100 boards
    assert figs["H100"].matmul_efficiency == round(1402.6 / 1979 * 0.938, 3)
    assert figs["H200"].matmul_efficiency == round(1453.4 / 1979 * 0.938, 3)
    # the B200: [MAMF]'s FP8 row (3432.5 TFLOP/s, tensorwise) x the B200's sustained fraction 1237 / 1450 ([B200SUST]);
    # MXFP8 that figure x its rate over FP8 current scaling's on the same 12 GEMMs (TE's GEMM profiling guide on a B300:
    # 6.812 against 7.161 ms); the other recipes take the tensorwise figure
    b200 = figs["B200"]
    assert b200.matmul_efficiency == round(3432.5 / 4500 * 1237 / 1450, 3)
    assert b200.efficiency("mxfp8") == round(b200.matmul_efficiency * 6.812 / 7.161, 3) != b200.efficiency("tensorwise")
    assert b200.efficiency("blockwise") == b200.efficiency(None) == b200.matmul_efficiency
    assert figs["H100"].recipe_efficiency == ()
    assert figs["H100"].tn_only and figs["H200"].tn_only and not figs["B200"].tn_only
    assert "mxfp8" in figs["B200"].recipes and "mxfp8" not in figs["H100"].recipes


def test_one_fp8_gemm_is_the_gemm_model_at_fp8_figures_by_hand():
    m = n = k = 8192
    h100 = device_profile("H100")
    got = gemm_time(m, n, k, "float8", fp8_profile_of("H100"), c_bytes=D)
    per_sm = 1979e12 / 132 * 0.665  # MAMF's 0.709 x the sustained fraction 0.938
    memory = ((m * k + k * n) * 1 + m * n * 2) / (3.35e12 * 0.9)  # FP8 operands, bf16 output
    best = math.inf
    for tm, tn in h100.tiles:
        compute = math.ceil(math.ceil(m / tm) * math.ceil(n / tn) / 132) * 2.0 * tm * tn * k / per_sm
        best = min(best, compute + memory - 0.95 * min(compute, memory))
    assert got.seconds == pytest.approx(best + 5e-6, rel=1e-12)
    assert got.bytes_moved == 2 * 8192**2 + 2 * 8192**2
    bf16 = gemm_time(m, n, k, "bfloat16", h100)
    assert bf16.seconds / got.seconds == pytest.approx(2 * 0.665 / 0.7532, rel=0.01)  # compute-bound: peaks x fractions


def test_which_gemms_run_in_fp8():
    pk = fp8_layer(LLAMA, 1, _opts(), True, "H100")
    fp8 = {k.name for ph in "FIW" for k in pk.phase(ph) if getattr(k, "dtype", None) == "float8"}
    linears = ("QKV", "projection", "FC1", "FC2")
    assert fp8 == {f"{x}{s}" for x in linears for s in ("", " dgrad", " wgrad")}  # attention core, norms: bf16
    assert all(getattr(k, "c_bytes", D) == D for k in pk.F)  # FP8 GEMMs write their output in bf16


def test_cast_kernels_bytes_by_hand():
    e_in, e_qkv = TOKENS * H, TOKENS * (HQ + 2 * HKV)
    hopper = fp8_layer(LLAMA, 1, _opts(), True, "H100")  # TN only: casts write the transposed copy too
    assert _bytes(hopper, "F")["QKV input cast"] == D * e_in + 2 * e_in
    assert _bytes(hopper, "F")["FC2 input cast"] == D * TOKENS * F + 2 * TOKENS * F
    assert _bytes(hopper, "I")["QKV output gradient cast"] == D * e_qkv + 2 * e_qkv
    assert "QKV input amax" not in _bytes(hopper, "F")  # delayed: the amax comes with the cast
    tensorwise = fp8_layer(LLAMA, 1, _opts(TENSORWISE), True, "H100")
    assert _bytes(tensorwise, "F")["QKV input amax"] == D * e_in  # current scaling reads the input once more
    blackwell = fp8_layer(LLAMA, 1, _opts(), True, "B200")  # any layout: one copy
    assert _bytes(blackwell, "F")["QKV input cast"] == D * e_in + e_in
    mx = fp8_layer(LLAMA, 1, _opts(Fp8Options("e4m3", "mxfp8")), True, "B200")  # both directions, 1 B per 32
    assert _bytes(mx, "F")["QKV input cast"] == D * e_in + 2 * (e_in + e_in // 32)
    sp = fp8_layer(LLAMA, 1, _opts(tp=2, sp=True), True, "H100")  # shard cast row-wise, gathered, transposed in W
    assert _bytes(sp, "F")["QKV input cast"] == D * e_in // 2 + e_in // 2
    assert _bytes(sp, "W")["QKV input transpose"] == 2 * e_in
    assert _bytes(sp, "F")["projection input cast"] == D * TOKENS * HQ // 2 + 2 * TOKENS * HQ // 2  # row-parallel


def test_the_projection_keeps_its_bf16_input_under_every_recipe_but_delayed():
    """Megatron-core's save_original_input on linear_proj (781e765818): the projection's wgrad reads flash's bf16
    output, which flash keeps anyway, so no FP8 copy is saved; F casts row-wise only and W casts column-wise."""
    e = TOKENS * HQ  # the projection's input elements
    hopper = fp8_layer(LLAMA, 1, _opts(TENSORWISE), True, "H100")
    assert _bytes(hopper, "F")["projection input cast"] == D * e + e  # row-wise only (the TN transpose not written)
    w = _bytes(hopper, "W")
    assert (w["projection input (column-wise) amax"], w["projection input (column-wise) cast"]) == (D * e, D * e + e)
    mx = fp8_layer(LLAMA, 1, _opts(Fp8Options("e4m3", "mxfp8")), True, "B200")
    assert _bytes(mx, "F")["projection input cast"] == D * e + e + e // 32  # one direction and its scales
    assert _bytes(mx, "W")["projection input (column-wise) cast"] == D * e + e + e // 32
    delayed = fp8_layer(LLAMA, 1, _opts(), True, "H100")  # delayed: the FP8 copy of both layouts, saved
    assert _bytes(delayed, "F")["projection input cast"] == D * e + 2 * e and "projection input (column-wise) cast" \
        not in _bytes(delayed, "W")
    for fp8, attention in ((TENSORWISE, "flash"), (Fp8Options("e4m3", "mxfp8"), "flash"), (TENSORWISE, "eager")):
        saved = {x.name: x.nbytes for x in layer_saved_tensors(LLAMA, 1, replace(_opts(fp8), attention=attention))}
        assert saved["attention output (projection input)"] == D * e and "projection input (FP8)" not in saved
    saved = {x.name: x.nbytes for x in layer_saved_tensors(LLAMA, 1, _opts())}
    assert (saved["attention output (projection input)"], saved["projection input (FP8)"]) == (D * e, e)


def test_the_cast_kernels_time_as_memory_bound_kernels():
    pk = fp8_layer(LLAMA, 1, _opts(), True, "H100")
    prof = profile_of("H100")
    cast = next(k for k in pk.F if k.name == "QKV input cast")
    assert kernel_seconds(cast, "bfloat16", prof) == cast.nbytes / (3.35e12 * 0.525) + 5e-6


def test_saved_activations_under_fp8_by_hand():
    bf16 = layer_activation_bytes(LLAMA, 1, _opts(None))
    fp8 = layer_activation_bytes(LLAMA, 1, _opts())
    # QKV, FC1 and FC2 inputs at 1 byte instead of 2; the projection input: flash keeps its bf16 output, + FP8 copy
    assert bf16 - fp8 == (D - 1) * TOKENS * (H + H + F) - TOKENS * HQ
    names = {x.name for x in layer_saved_tensors(LLAMA, 1, _opts())}
    assert {"QKV input (FP8)", "MLP input (FP8)", "down projection input (FP8)", "projection input (FP8)"} <= names
    eager = layer_activation_bytes(LLAMA, 1, replace(_opts(), attention="eager"))
    assert layer_activation_bytes(LLAMA, 1, replace(_opts(None), attention="eager")) - eager == \
        (D - 1) * TOKENS * (H + H + F + HQ)  # eager: the projection's own saved input is FP8 alone
    assert saved_bytes(1024, Fp8Options("hybrid", "blockwise")) == 1024 + 32  # a float32 scale per 128


def test_fp8_weight_copies_and_their_cast_by_hand():
    per_layer = H * (HQ + 2 * HKV) + HQ * H + H * 2 * F + F * H
    params, weights = stage_fp8_weights(LLAMA, 1, _opts(), "H100", StageLayers.uniform(3))
    assert (params, weights) == (3 * per_layer, 12)
    assert weight_copy_bytes(params, DELAYED, tn_only=True) == 2 * params  # the weight and its transpose
    assert weight_copy_bytes(params, DELAYED, tn_only=False) == params
    assert weight_cast(params, weights, TENSORWISE, dtype_bytes=D, tn_only=True) == (2 * D * params + 2 * params, 24)


def test_refusals_are_one_line_and_exit_2(capsys):
    base = ["simulate", "1f1b", "-p", "2", "-m", "4", "--model-config", "llama3-8b", "--seq", "1024", "--batch", "8"]
    cases = [(["--hardware", "dgx-a100", "--fp8-format", "hybrid"], "--fp8-format needs FP8 tensor cores (H100, "
              "H200, B200, B300): A100-SXM4-80GB has none"),
             (["--hardware", "local-cpu", "--fp8-format", "hybrid"], "has none"),
             (["--hardware", "dgx-h100", "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"],
              "--fp8-recipe mxfp8 needs Blackwell (B200, B300): H100-SXM5-80GB runs delayed, tensorwise, blockwise"),
             (["--hardware", "dgx-h100", "--fp8-recipe", "tensorwise"],
              "--fp8-recipe tensorwise needs --fp8-format (e4m3 or hybrid) to turn FP8 on"),
             (["--hardware", "dgx-h100", "--fp8-format", "hybrid", "--dtype", "float32"],
              "--fp8-format needs 16-bit parameters (--dtype bfloat16), got float32")]
    for extra, message in cases:
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("pipesim: error: ") and message in err and "\n" not in err
    assert check_fp8_recipe("B200", "blockwise").family == "B200"  # TE >= 2.9 runs it on Blackwell
    with pytest.raises(PipesimError, match="fp8 must be Fp8Options"):
        Job(fp8="hybrid")
    with pytest.raises(PipesimError, match="unknown --fp8-recipe"):
        Fp8Options("hybrid", "columnwise")
    with pytest.raises(PipesimError, match="--fp8-recipe rowwise is torchao's"):  # Transformer Engine has no rowwise
        Fp8Options("hybrid", "rowwise")


def test_fp8_is_faster_and_reports_its_weights(tmp_path):
    base = ["simulate", "1f1b", "-p", "2", "--microbatch-size", "1", "--model-config", "llama3-8b", "--seq", "2048",
            "--batch", "8", "--hardware", "dgx-h100", "--tp", "2", "--sequence-parallel"]
    out = {}
    for name, extra in (("bf16", []), ("fp8", ["--fp8-format", "hybrid"])):
        path = tmp_path / f"{name}.json"
        assert main(base + extra + ["--json", str(path)]) == 0
        out[name] = json.loads(path.read_text())
    assert out["fp8"]["step_time"] < out["bf16"]["step_time"]
    assert "fp8_weights" not in out["bf16"]["memory"]["ranks"][0]  # BF16's breakdown unchanged
    assert out["fp8"]["memory"]["ranks"][0]["fp8_weights"] > 0
    fp8_peak = load_fp8_figures()["H100"].peak
    assert out["bf16"]["mfu"] == out["bf16"]["tflops_per_gpu"] * 1e12 / 989e12  # the BF16 peak of dgx-h100
    assert out["fp8"]["mfu"] == out["fp8"]["tflops_per_gpu"] * 1e12 / fp8_peak  # an FP8 step: the FP8 peak


def test_mfu_is_over_the_fp8_peak_as_nvidia_reports_fp8_runs():
    """dgxc-benchmarking v25.04.02 llama3.1/README.md, Llama 3.1 405B on 512 H100: BF16 19.78 s at 55.47 % MFU, FP8
    12.37 s at 44.35 %. NVIDIA counts attention its own way (a constant factor on pipesim's causal count for one
    model and sequence), so pipesim's MFU of each published step time over the published MFU is one number for both
    rows only if the FP8 row's peak is the FP8 peak, as mfu_peak takes it (over the BF16 peak the FP8 row's would be
    twice the BF16 row's)."""
    hw = load_hardware("dgx-h100")
    model = load_hf_config("llama3-405b", seq=8192, batch=256)
    flops = float(model_flops(model, model.batch))
    ratios = []
    for fp8, seconds, published in ((None, 19.78, 0.5547), (DELAYED, 12.37, 0.4435)):
        mfu, _ = utilization(flops, seconds, 512, mfu_peak(hw, model, fp8))
        ratios.append(published / mfu)
    assert ratios[0] == pytest.approx(ratios[1], abs=0.002)
    assert mfu_peak(hw, model, None) == 989e12 and mfu_peak(hw, model, DELAYED) == load_fp8_figures()["H100"].peak


def test_a_chained_schedule_holds_both_copies_fp8_weights(tmp_path):
    """DualPipe's rank holds two stages (one per chain): each its model stage's FP8 weight copies."""
    base = ["simulate", "--microbatch-size", "1", "--model", "gpt", "--dtype", "bfloat16", "--hidden", "1024",
            "--layers", "4", "--heads", "16", "--seq", "1024", "--batch", "8", "--hardware", "dgx-h100",
            "--fp8-format", "hybrid"]
    out = {}
    for name in ("dualpipe", "1f1b"):
        path = tmp_path / f"{name}.json"
        assert main([base[0], name, "-p", "2", *base[1:], "--json", str(path)]) == 0
        out[name] = [r["fp8_weights"] for r in json.loads(path.read_text())["memory"]["ranks"]]
    assert out["dualpipe"][0] == out["dualpipe"][1] == out["1f1b"][0] + out["1f1b"][1]  # stages 0 and 3, 1 and 2


def test_the_planner_exports_fp8_as_each_framework_spells_it():
    model = ModelConfig(kind="gpt", hidden=1024, layers=8, heads=16, seq=1024, vocab=32000, batch=16)
    req = PlanRequest(model, load_hardware("dgx-h100"), 8, ("1f1b",), None, ("none",), (0,),
                      Job(fp8=Fp8Options("hybrid", "delayed")))
    c = enumerate_candidates(req)[0]
    args = megatron_args(c, req)
    assert args[args.index("--fp8-format"):args.index("--fp8-format") + 4] == ["--fp8-format", "hybrid",
                                                                               "--fp8-recipe", "delayed"]
    text = torchtitan_toml(c, req)
    assert "# torchao has no delayed scaling" in text
    toml = tomllib.loads(text)
    assert toml["model"]["converters"] == ["quantize.linear.float8"]
    assert toml["quantize"]["linear"]["float8"]["recipe_name"] == "tensorwise"
    mx = tomllib.loads(torchtitan_toml(c, replace(req, job=Job(fp8=Fp8Options("e4m3", "mxfp8")))))
    assert mx["quantize"]["linear"]["mx"]["recipe_name"] == "mxfp8_cublas"
    assert Job(dims=ParallelDims(dp=2), fp8=DELAYED).flags()[-4:] == ["--fp8-format", "hybrid", "--fp8-recipe",
                                                                      "delayed"]
