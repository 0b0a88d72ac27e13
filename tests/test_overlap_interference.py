"""SM sharing under overlap (pipesim/comm/overlap_interference.py): a GEMM beside an NCCL collective runs on the SMs
the collective's channels leave, and the pair's time follows by hand from the wave model and NCCL's rules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesim.comm.collective_algos import collective_time
from pipesim.comm.overlap_interference import HidingGemm, channels_used, exposed_beside
from pipesim.comm.tp_collective import TpCollective
from pipesim.cost.kernel_costs import layer_seconds
from pipesim.cost.model_costs import model_costs
from pipesim.device.gemm import gemm_time
from pipesim.device.profile import DeviceProfile, device_profile
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.schedule import Action, Kind
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.kernel_types import Gemm
from pipesim.model.options import LayerOptions
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.program import _tp_time

TILE_FLOPS = 2 * 128 * 128 * 1024  # FLOPs of one 128 x 128 tile over k = 1024


def toy(**changes) -> DeviceProfile:
    """4 SMs of 1 TFLOP/s each, one 128 x 128 tile, compute and memory fully overlapped, no launch cost, and
    one NCCL channel: numbers a hand can follow."""
    base = DeviceProfile(name="toy", sms=4, tiles=((128, 128),), flops={"bfloat16": 4e12}, hbm_bandwidth=1e12,
                         matmul_efficiency=1.0, memory_efficiency=1.0, kernel_overhead=0.0, overlap=1.0,
                         flash_forward_efficiency=0.5, flash_backward_efficiency=0.25, nccl_channels=1)
    return replace(base, **changes)


GEMM = Gemm("QKV wgrad", 256, 512, 1024)  # 2 x 4 = 8 tiles: 2 waves on 4 SMs, 3 on the 3 one channel leaves


def test_a_gemm_on_fewer_sms_pays_the_waves_they_need():
    full = gemm_time(256, 512, 1024, "bfloat16", toy())
    fewer = gemm_time(256, 512, 1024, "bfloat16", toy(), sms=3)
    assert (full.tiles, full.waves, fewer.waves) == (8, 2, 3)
    assert full.seconds == 2 * TILE_FLOPS / 1e12  # compute-bound: the memory term (1.8 us) is hidden
    assert fewer.seconds == 3 * TILE_FLOPS / 1e12  # each SM keeps its rate: one more wave
    assert fewer.quantisation_efficiency == 8 / 9  # 8 tiles in 3 waves of 3 SMs
    assert gemm_time(256, 512, 1024, "bfloat16", toy(), sms=4) == full
    for bad in (0, 5, 2.5, True):
        with pytest.raises(PipesimError, match="a GEMM runs on 1 to 4 SMs"):
            gemm_time(256, 512, 1024, "bfloat16", toy(), sms=bad)


def test_nccls_channels_follow_its_bytes_per_thread_rule():
    # Simple: 512 threads x 64 bytes per channel; LL128: 640 x 8; ring LL: 512 x 8 x ranks (NCCL getAlgoInfo)
    assert channels_used(100 * 2**20, 8, "ring", "Simple", 24) == 24
    assert channels_used(24 * 512 * 64, 8, "ring", "Simple", 24) == 24
    assert channels_used(24 * 512 * 64 - 1, 8, "ring", "Simple", 24) == 23
    assert channels_used(1000, 8, "ring", "Simple", 24) == 1
    assert channels_used(10 * 640 * 8, 8, "ring", "LL128", 24) == 10
    assert channels_used(102_400, 8, "ring", "LL", 24) == 3  # 3 x 32768 <= 102400 < 4 x 32768
    assert channels_used(102_400, 8, "tree", "LL", 24) == 24  # the ranks factor is the ring's only
    assert channels_used(2**30, 8, "comm_costs", "", 24) == 0  # no NCCL there (CPU processes)
    assert channels_used(2**30, 2, "p2p", "", 24) == 0
    assert channels_used(2**30, 8, "ring", "Simple", 0) == 0  # no channel figure: the overlap stays free


def test_the_pair_is_max_of_gemm_beside_and_collective_then_what_is_left():
    g, g_beside = 2.0, 3.0
    assert exposed_beside(4.0, g, g_beside) == 4.0 - g  # the GEMM ends under the collective
    assert exposed_beside(1.5, g, g_beside) == 1.5 * (1 - g / g_beside)  # half the GEMM ran beside it
    assert exposed_beside(3.0, g, g_beside) == 3.0 - g  # the two branches meet at C = G'
    assert exposed_beside(1.5, g, g) == 0.0 and exposed_beside(4.0, g, g) == 4.0 - g  # G' = G: the free overlap


def test_a_triple_with_a_hiding_gemm_pays_for_the_sms_nccls_channels_hold():
    hw = load_hardware("dgx-a100")
    par = ParallelDims(pp=1, tp=8)
    action = Action(0, Kind.B, 0)
    g = 2 * TILE_FLOPS / 1e12  # 67.1 us on the toy's 4 SMs
    g_beside = 3 * TILE_FLOPS / 1e12  # 100.7 us on the 3 its one channel leaves
    hiding = HidingGemm("QKV wgrad", g, GEMM, "bfloat16", toy())
    assert hiding.seconds_beside(1) == pytest.approx(g_beside, rel=1e-15) and hiding.seconds_beside(0) == g
    for nbytes in (2**22, 2**24):  # LL128 73.8 us (between G and G'), LL128 173.6 us (past G')
        c = collective_time("all_reduce", nbytes, list(range(8)), hw).seconds
        by_hand = c - g if c >= g_beside else c * (1 - 2 / 3)
        shared = _tp_time(0, action, hw, True, par, {(0, "B"): (TpCollective("all_reduce", nbytes, hiding),)})
        assert shared == pytest.approx(by_hand, rel=1e-12)
        free = max(0.0, c - g)  # what a GEMM that kept all its SMs would leave exposed
        assert shared > free if c < g_beside else shared == free  # past G' the slowed GEMM still ends under C
    c = collective_time("all_reduce", 2**22, list(range(8)), hw).seconds
    assert g < c < g_beside  # the first size is the partial case: C / 3 exposed, not C - G
    no_channels = replace(hiding, profile=toy(nccl_channels=0))
    assert _tp_time(0, action, hw, True, par, {(0, "B"): (TpCollective("all_reduce", 2**22, no_channels),)}) == c - g


def test_model_costs_emits_the_gemm_a_collective_hides_behind_with_its_shape_and_profile():
    model = ModelConfig(kind="gpt", hidden=6144, layers=1, heads=64, seq=2048, vocab=51200, batch=4,
                        dtype="float16")
    hw = load_hardware("dgx-a100")
    costs = model_costs(model, 3, 1, hw, Job(ParallelDims(tp=8)), layer_split=[0, 1, 0])
    hidden = [c.beside for c in costs.tp_collectives[(1, "B")] if c.beside is not None]
    layer = dict(layer_seconds(model, 4, LayerOptions(tp=8), True, "A100").gemms)
    assert [h.name for h in hidden] == ["FC1 wgrad", "QKV wgrad"]
    assert [h.seconds for h in hidden] == [layer["FC1 wgrad"], layer["QKV wgrad"]]
    # each accumulates into main_grad (Megatron's gradient-accumulation fusion: C read and written, 2 x 2 bytes)
    assert [h.gemm for h in hidden] == [Gemm("FC1 wgrad", 6144, 3072, 8192, c_bytes=4),
                                        Gemm("QKV wgrad", 6144, 2304, 8192, c_bytes=4)]
    a100 = device_profile("A100")
    assert all(h.profile == a100 and h.dtype == "float16" for h in hidden) and a100.nccl_channels == 24
    qkv = hidden[1]
    ratio = gemm_time(6144, 2304, 8192, "float16", a100, sms=108 - 24, c_bytes=4).seconds / \
        gemm_time(6144, 2304, 8192, "float16", a100, c_bytes=4).seconds
    assert qkv.seconds_beside(24) == qkv.seconds * ratio and ratio > 1


def test_a_profile_needs_a_channel_count_below_its_sms():
    for bad in (-1, 4, 1.5):
        with pytest.raises(PipesimError, match="nccl_channels must be an integer from 0 to sms - 1"):
            toy(nccl_channels=bad)
