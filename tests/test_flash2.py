"""`--attention flash2`: FlashAttention-2 (PyTorch SDPA's flash backend) beside the device's fastest fused attention:
the same FLOPs, memory and kernels, its attention timed on the family's FlashAttention-2 figures."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from pipesim.cost.device_profiles import profile_of
from pipesim.cost.kernel_costs import layer_seconds, piece_seconds
from pipesim.errors import PipesimError
from pipesim.model.activations import stage_activation_bytes
from pipesim.model.config import ModelConfig
from pipesim.model.flops import layer_flops
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.options import LayerOptions
from pipesim.plan.exports import megatron_args
from pipesim.plan.space import enumerate_candidates
from tests.test_plan import big_request

LLAMA = ModelConfig(kind="gpt", hidden=4096, layers=4, heads=32, kv_heads=8, ffn_hidden=14336, seq=8192, vocab=128256,
                    dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                    positions="rope")
FLASH, FLASH2 = LayerOptions(attention="flash", cp=2), LayerOptions(attention="flash2", cp=2)


def test_same_work_and_memory_as_flash():
    assert layer_flops(LLAMA, 1, FLASH2) == layer_flops(LLAMA, 1, FLASH)
    assert stage_activation_bytes(LLAMA, 1, FLASH2, StageLayers.uniform(4), first=True, last=True) == \
        stage_activation_bytes(LLAMA, 1, FLASH, StageLayers.uniform(4), first=True, last=True)
    assert layer_kernels(LLAMA, 1, FLASH2) == layer_kernels(LLAMA, 1, FLASH)


def test_hopper_times_the_attention_on_flashattention_2s_figures():
    """On an H100 the layer is the flash layer with its attention kernels at 0.318 / 0.275 of the peak; every other
    kernel keeps its time."""
    fa2 = layer_seconds(LLAMA, 1, FLASH2, True, "H100")
    h100 = profile_of("H100")
    assert (h100.flash2_forward_efficiency, h100.flash2_backward_efficiency) == (0.318, 0.275)
    same = piece_seconds(layer_kernels(LLAMA, 1, FLASH), LLAMA.dtype,
                         replace(h100, flash_forward_efficiency=0.318, flash_backward_efficiency=0.275))
    flash = layer_seconds(LLAMA, 1, FLASH, True, "H100")
    assert (fa2.F, fa2.I, fa2.W) == (same.F, same.I, flash.W)  # W: no attention (and its gradient accumulation)
    best = dict(flash.gemms)
    slow = dict(fa2.gemms)
    assert slow["flash attention"] > 1.5 * best["flash attention"]
    assert {k: v for k, v in slow.items() if "attention" not in k} == \
        {k: v for k, v in best.items() if "attention" not in k}


def test_ampere_flash_is_flashattention_2_blackwell_has_cudnns_benchmark_and_a_profile_without_figures_refuses():
    """The A100's flash kernel is FlashAttention-2; the B200's figures are NVIDIA's cuDNN benchmark's flash_attn rows
    ([CUDNNB200]: 399.9 / 318.0 TFLOP/s causal at 8k, through the diagonal-tile count 1 + 128 / 8192, at the B200's
    sustained clock, 1237 / 1450 of its burst: [B200SUST]); a profile
    without FlashAttention-2 figures (a user's measured one) refuses the flag in one line."""
    a100 = layer_seconds(LLAMA, 1, FLASH, True, "A100")
    assert layer_seconds(LLAMA, 1, FLASH2, True, "A100") == a100
    b200 = profile_of("B200")
    assert (b200.flash2_forward_efficiency, b200.flash2_backward_efficiency) == pytest.approx(
        (399.9 / 2250 * (1 + 128 / 8192) * 1237 / 1450, 318.0 / 2250 * (1 + 128 / 8192) * 1237 / 1450), abs=5e-4)
    assert layer_seconds(LLAMA, 1, FLASH2, True, "B200").F > layer_seconds(LLAMA, 1, FLASH, True, "B200").F
    bare = replace(b200, flash2_forward_efficiency=None, flash2_backward_efficiency=None)
    with pytest.raises(PipesimError, match="^--attention flash2: device 'B200-180GB' has no FlashAttention-2 figures"):
        bare.with_flash2()
    ok = subprocess.run([sys.executable, "-m", "pipesim", "simulate", "1f1b", "--stages", "1", "--microbatches", "1",
                         "--model", "gpt", "--hidden", "512", "--layers", "2", "--heads", "8", "--seq", "256",
                         "--batch", "1", "--hardware", "hgx-b200", "--attention", "flash2"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_megatron_export_names_the_flash_backend():
    req = big_request()
    c = next(iter(enumerate_candidates(req)))
    fused = megatron_args(c, req, "flash")
    assert "--use-flash-attn" not in fused and fused[fused.index("--attention-backend") + 1] == "fused"  # cuDNN's
    args = megatron_args(c, req, "flash2")
    assert "--use-flash-attn" not in args and args[args.index("--attention-backend") + 1] == "flash"
