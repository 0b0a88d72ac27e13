"""Sliding-window attention (pipesim.model.attention_window): the band's pairs and a flash kernel's tiles by hand, a
windowed layer's FLOPs, kernels and seconds, which layers are windowed per stage, and the refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesim.cost.device_profiles import profile_of
from pipesim.cost.executor_ops import executor_block_ops
from pipesim.cost.kernel_costs import gpt_stage_seconds, layer_seconds
from pipesim.cost.model_costs import model_costs
from pipesim.cost.stage_work import gpt_stage_work
from pipesim.device.kernels import (
    FLASH_QUERY_BLOCK,
    attention_flops,
    band_pairs,
    band_tile_pairs,
    causal_tile_factor,
    flash_attention_time,
)
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.attention_window import SlidingWindow
from pipesim.model.config import ModelConfig
from pipesim.model.executor_scope import unbuilt_structure
from pipesim.model.flops import attention_core_flops, hardware_flops, iteration_flops, layer_flops, model_flops
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.layer_kinds import DENSE, LayerKind, StageLayers, stage_layers
from pipesim.model.options import LayerOptions
from pipesim.parallel_dims import ParallelDims

# a Llama-shaped model whose odd layers (1, 3, ...) attend fully and even ones over 128 keys, GPT-OSS's pattern
WINDOW = LayerKind(variant=True)  # a windowed layer's kind (pipesim.model.layer_kinds)
WINDOWED = ModelConfig(kind="gpt", hidden=512, layers=6, heads=8, kv_heads=2, seq=1024, vocab=1000, batch=8,
                       dtype="bfloat16", ffn_hidden=1024, activation="swiglu", norm="rmsnorm", dropout=False,
                       biases=False, positions="rope", window=SlidingWindow(128, full_every=2))
FULL = replace(WINDOWED, window=None)
B = FLASH_QUERY_BLOCK


def _brute_pairs(seq: int, size: int) -> int:
    return sum(1 for q in range(seq) for k in range(seq) if q - size < k <= q)


def _brute_tiles(seq: int, size: int) -> int:
    tiles = {(q // B, k // B) for q in range(0, seq) for k in range(max(0, q - size + 1), q + 1)}
    return sum(B * min(B, seq - qb * B) for qb, _ in tiles)


@pytest.mark.parametrize("seq,size", [(1024, 128), (1000, 100), (512, 600), (4096, 4096), (256, 1)])
def test_band_pairs_and_tiles_by_brute_force(seq, size):
    """The closed forms against counting every (query, key) pair and every B x B tile the band touches."""
    assert band_pairs(seq, size) == _brute_pairs(seq, size)
    if seq <= 1024:
        assert band_tile_pairs(seq, size, B) == _brute_tiles(seq, size)
    if size >= seq and seq % B == 0:  # the whole causal triangle: causal_tile_factor's diagonal tiles
        assert band_tile_pairs(seq, size, B) == seq * seq / 2 * causal_tile_factor(seq)
    assert band_tile_pairs(1024, 128, B) == (2 * 8 - 1) * B * B  # GPT-OSS's window: two tiles a row block but one


def test_which_layers_are_windowed():
    """Megatron's --window-attn-skip-freq 2: layer_number % 2 != 0 windowed (1-based), so layers 0, 2, 4 here; a
    window as long as the sequence windows nothing; full_every 0 windows every layer; 1 is refused."""
    assert [WINDOWED.window.windowed(n) for n in range(6)] == [True, False] * 3
    assert WINDOWED.windowed_layers(0, 6) == 3 and WINDOWED.windowed_layers(1, 2) == 1
    assert replace(WINDOWED, seq=128).windowed_layers(0, 6) == 0  # 128 keys over 128 tokens: full attention
    assert replace(WINDOWED, window=SlidingWindow(128)).windowed_layers(0, 6) == 6
    assert stage_layers(WINDOWED, [3, 3]) == [StageLayers(((DENSE, 1), (WINDOW, 2))),
                                              StageLayers(((DENSE, 2), (WINDOW, 1)))]
    with pytest.raises(PipesimError, match="window full_every 1 keeps every layer's full attention"):
        SlidingWindow(128, 1)
    assert ModelConfig(**WINDOWED.to_dict()) == WINDOWED and "window" not in FULL.to_dict()


def test_a_windowed_layers_flops_are_the_bands():
    """Forward 4 b band h_q / t and flash backward 10 b band h_q / t, causal; the full-square count twice that; the
    kernels carry the same FLOPs; everything but the attention core as the full layer's."""
    b, opts = 2, LayerOptions(attention="flash", tp=2, window=128)
    band, hq = band_pairs(1024, 128), WINDOWED.attention_width
    core = attention_core_flops(WINDOWED, b, opts, causal=True)
    assert (core.F, core.I, core.W) == (4 * b * band * hq // 2, 10 * b * band * hq // 2, 0)
    assert attention_core_flops(WINDOWED, b, opts).F == 2 * core.F
    full, narrow = layer_flops(WINDOWED, b, replace(opts, window=None)), layer_flops(WINDOWED, b, opts)
    full_core = attention_core_flops(WINDOWED, b, replace(opts, window=None))
    assert narrow.F - full.F == attention_core_flops(WINDOWED, b, opts).F - full_core.F and narrow.W == full.W
    kernels = layer_kernels(WINDOWED, b, opts)
    assert (kernels.flops("F"), kernels.flops("I"), kernels.flops("W")) == (narrow.F, narrow.I, narrow.W)
    flash = [k for k in kernels.F if k.name == "sliding-window attention"]
    assert len(flash) == 1 and flash[0].window == 128


def test_a_windowed_kernel_computes_the_tiles_of_its_band():
    """A flash kernel over the band: counted FLOPs the band's, its compute the tiles' at the full kernel's rate."""
    profile = _h100()
    t = flash_attention_time(2, 4096, 32, 64, "bfloat16", profile, causal=True, window=128)
    per_pair = attention_flops(1, 1, 32, 64)
    assert t.flops == 2 * per_pair * band_pairs(4096, 128)
    full = flash_attention_time(2, 4096, 32, 64, "bfloat16", profile, causal=True)
    ratio = band_tile_pairs(4096, 128, B) / (4096 * 4096 / 2 * causal_tile_factor(4096))
    assert t.compute == pytest.approx(full.compute * ratio, rel=1e-12)
    with pytest.raises(PipesimError, match="a sliding window is timed on a causal kernel"):
        flash_attention_time(2, 4096, 32, 64, "bfloat16", profile, window=128)


def _h100():
    hw = load_hardware("dgx-h100")
    return profile_of(hw.device.family, hw.device.kernels)


def test_stage_costs_add_each_kind_of_layer():
    """A stage's F seconds: its full layers' and its windowed layers' pieces, each counted once per layer; the FLOPs
    of its work the same split."""
    b, opts = 1, LayerOptions(attention="flash")
    mix = stage_layers(WINDOWED, [3, 3])[0]
    assert mix == StageLayers(((DENSE, 1), (WINDOW, 2)))  # layers 0 and 1 windowed, layer 2 full
    stage = gpt_stage_seconds(WINDOWED, b, mix, opts, first=False, last=False, fused=True, family="H100")
    full = layer_seconds(WINDOWED, b, opts, True, "H100")
    narrow = layer_seconds(WINDOWED, b, replace(opts, window=128), True, "H100")
    assert stage.F == pytest.approx(full.F + 2 * narrow.F, rel=1e-12) and narrow.F < full.F
    work = gpt_stage_work(WINDOWED, b, mix, first=False, last=False, opts=opts)
    narrow_flops = layer_flops(WINDOWED, b, replace(opts, window=128))
    assert work.flops["F"] == layer_flops(WINDOWED, b, opts).F + 2 * narrow_flops.F


def test_model_flops_count_each_layer_over_its_band():
    """MFU's count: the windowed layers' attention over the band, the others' over the causal half; HFU adds each
    kind's whole tiles."""
    eager = LayerOptions(attention="eager")
    windowed = layer_flops(WINDOWED, 8, replace(eager, window=128), causal=True).total
    full = layer_flops(WINDOWED, 8, eager, causal=True).total
    head = iteration_flops(replace(FULL, layers=1), 8, eager, causal=True) - full
    assert model_flops(WINDOWED, 8) == 3 * windowed + 3 * full + head
    flash = LayerOptions(attention="flash")
    core_w = attention_core_flops(WINDOWED, 8, replace(flash, window=128), causal=True).total
    core_f = attention_core_flops(WINDOWED, 8, flash, causal=True).total
    extra = 3 * core_f * (causal_tile_factor(1024) - 1) + \
        3 * core_w * (band_tile_pairs(1024, 128, B) / band_pairs(1024, 128) - 1)
    assert hardware_flops(WINDOWED, 8, flash) == pytest.approx(iteration_flops(WINDOWED, 8, flash, causal=True)
                                                               + extra, abs=2)


def test_refusals_in_one_line():
    """Context parallelism and eager attention with a window, and a device without a family; the executor builds
    windows (tests/test_executor_structure.py)."""
    hw = load_hardware("dgx-h100")
    with pytest.raises(PipesimError, match=r"--cp 2 with sliding-window attention \(a window of 128 keys\) is not"):
        model_costs(WINDOWED, 2, 4, hw, Job(attention="flash", dims=ParallelDims(cp=2)))
    with pytest.raises(PipesimError, match="timed as a fused kernel only: give --attention flash"):
        model_costs(WINDOWED, 2, 4, hw, Job(attention="eager"))
    plain = replace(hw, device=replace(hw.device, family=""))  # no family, no [host]: nothing times the band
    with pytest.raises(PipesimError, match="sliding-window attention is timed kernel by kernel or on a calibrated"):
        model_costs(WINDOWED, 2, 4, plain, Job(attention="flash"))
    assert unbuilt_structure(WINDOWED) == []


def test_on_a_cpu_host_a_window_costs_its_mask_ops_and_saves_no_flop():
    """The executor masks the whole square on a calibrated CPU host (executor.transformer.attention_core), so a
    windowed layer there has the full layer's FLOPs and bytes and costs only the mask's framework ops more: each
    stage's forward differs from the unwindowed model's by its windowed layers' extra ops x the host's per-op
    seconds."""
    hw = load_hardware("local-cpu")
    eq = hw.cost_equation(WINDOWED.dtype)
    extra = executor_block_ops(WINDOWED, True)[0] - executor_block_ops(WINDOWED, False)[0]
    assert extra > 0
    windowed, full = (model_costs(m, 2, 4, hw, Job()).table.stages for m in (WINDOWED, FULL))
    for stage_w, stage_f, mix in zip(windowed, full, stage_layers(WINDOWED, [3, 3]), strict=True):
        n = mix.variant_layers
        assert n > 0 and stage_w.flops_forward == stage_f.flops_forward
        assert stage_w.forward - stage_f.forward == pytest.approx(n * extra * eq.per_op, rel=1e-9)


def test_a_window_shortens_the_step_by_its_attention_kernels():
    """The same model with and without its window: each stage's forward differs by its windowed layers' attention
    kernels only (forward: one flash kernel each)."""
    hw = load_hardware("dgx-h100")
    job = Job(attention="flash")
    windowed, full = (model_costs(m, 2, 4, hw, job).table.stages for m in (WINDOWED, FULL))
    profile = _h100()
    t_full = flash_attention_time(2, 1024, 8, 64, "bfloat16", profile, kv_heads=2, causal=True).seconds
    t_band = flash_attention_time(2, 1024, 8, 64, "bfloat16", profile, kv_heads=2, causal=True, window=128).seconds
    for stage_w, stage_f, mix in zip(windowed, full, stage_layers(WINDOWED, [3, 3]), strict=True):
        n = mix.variant_layers
        assert stage_f.forward - stage_w.forward == pytest.approx(n * (t_full - t_band), rel=1e-9)
