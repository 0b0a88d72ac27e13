"""A flash kernel's rate at a head dim other than 128 (pipesim.device.kernels.head_dim_factor): the Hopper figures of
[FA3]'s Figures 5 and 6 by hand, the interpolation, what it scales, FlashAttention-2's own figures, the families
without a figure, and a measured record at head dim 64 read back at the reference."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesim.device import gpu_measurements as measured
from pipesim.device.kernels import flash_attention_time, head_dim_factor
from pipesim.device.profile import device_profile

H100, A100 = device_profile("H100"), device_profile("A100")
# [FA3] Figures 5 and 6 (H100 SXM5, BF16, 16k tokens): cuDNN and FlashAttention-2 at head dim 64 over 128
CUDNN = (388 / 539, 433 / 516)  # causal forward, backward
FA2 = (299 / 335, 291 / 322)


def test_the_hopper_figures_by_hand():
    for family in ("H100", "H200"):
        p = device_profile(family)
        assert (p.flash_hd64_forward, p.flash_hd64_backward) == (round(CUDNN[0], 3), round(CUDNN[1], 3))
        assert (p.flash2_hd64_forward, p.flash2_hd64_backward) == (round(FA2[0], 3), round(FA2[1], 3))


@pytest.mark.parametrize("head_dim,forward,backward", [
    (32, 0.720, 0.839), (64, 0.720, 0.839), (96, (0.720 + 1) / 2, (0.839 + 1) / 2), (128, 1.0, 1.0), (192, 1.0, 1.0),
])
def test_the_factor_is_the_figure_at_64_linear_to_1_at_128(head_dim, forward, backward):
    assert head_dim_factor(H100, head_dim) == pytest.approx(forward, rel=1e-12)
    assert head_dim_factor(H100, head_dim, backward=True) == pytest.approx(backward, rel=1e-12)
    assert head_dim_factor(A100, head_dim) == head_dim_factor(A100, head_dim, backward=True) == 1.0  # no figure


def test_it_scales_the_compute_only():
    for backward in (False, True):
        kwargs = dict(causal=True, backward=backward, kv_heads=8)
        at64 = flash_attention_time(1, 4096, 64, 64, "bfloat16", H100, **kwargs)
        plain = flash_attention_time(1, 4096, 64, 64, "bfloat16", replace(H100, flash_hd64_forward=None,
                                                                           flash_hd64_backward=None), **kwargs)
        factor = CUDNN[1] if backward else CUDNN[0]
        assert at64.compute == pytest.approx(plain.compute / round(factor, 3), rel=1e-12)
        assert (at64.memory, at64.flops, at64.bytes_moved) == (plain.memory, plain.flops, plain.bytes_moved)


def test_flash2_takes_flashattention2s_figures():
    fa2 = H100.with_flash2()
    assert (fa2.flash_hd64_forward, fa2.flash_hd64_backward) == (H100.flash2_hd64_forward, H100.flash2_hd64_backward)
    assert fa2.sources["flash_hd64_forward"] == H100.sources["flash2_hd64_forward"]


def test_a_measured_record_at_head_dim_64_is_read_at_the_reference():
    """The same kernel timed at head dim 128 and, 1 / 0.720 slower per FLOP, at 64 give the same efficiency."""
    s, heads = 8192, 16

    def efficiency(head_dim: int, seconds: float) -> float:
        rec = measured.Record(measured.FLASH_FWD, "bfloat16", (1, s, heads, head_dim, 1), 0, seconds)
        return measured.summarise(measured.Measurements({}, (rec,)), H100)["flash_forward_efficiency"]

    t128 = 0.001
    t64 = t128 / 2 / H100.flash_hd64_forward  # half the FLOPs at 0.720 of the rate
    assert efficiency(64, t64) == pytest.approx(efficiency(128, t128), rel=1e-12)
