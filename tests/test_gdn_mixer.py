"""A Gated DeltaNet mixer as Megatron-core runs it (pipesim/model/gdn_mixer.py): Qwen3-Next's parameters written out
from GatedDeltaNet's shapes, the linears' FLOPs against Megatron's gdn_layer_flops, the chunked rule's closed forms,
the F/I/W split, the saved bytes by hand, and the sizes and tp splits Megatron refuses."""

from __future__ import annotations

import pytest

from pipesim.errors import PipesimError
from pipesim.model.gdn_mixer import (
    GatedDeltaNet,
    check_gdn_split,
    gdn_flops,
    gdn_kernels,
    gdn_params,
    gdn_saved,
    gdn_tensors,
)
from pipesim.model.kernel_types import Gemm, MemoryBound

# Qwen3-Next-80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct config.json): hidden 2048, linear_num_key_heads 16,
# linear_num_value_heads 32, linear_key_head_dim 128, linear_value_head_dim 128, linear_conv_kernel_dim 4
QWEN3_NEXT = GatedDeltaNet(key_heads=16, value_heads=32, key_dim=128, value_dim=128, conv_kernel=4)
HIDDEN = 2048
SMALL = GatedDeltaNet(key_heads=2, value_heads=4, key_dim=8, value_dim=16, conv_kernel=3, chunk=16)


def test_qwen3_next_parameters_by_hand() -> None:
    """NVIDIA/Megatron-LM @ d98e8a64dd megatron/core/ssm/gated_delta_net/common.py: in_proj hidden -> 2 qk + 2 v
    + 2 Hv (q, k, v, z, beta, alpha; bias False), conv1d [2 qk + v, 1, 4] (conv_bias False), dt_bias and A_log [Hv],
    out_norm over value_head_dim [Dv] (not tensor_model_parallel), out_proj v -> hidden (bias False)."""
    qk, v = 16 * 128, 32 * 128  # 2048, 4096
    in_proj = 2048 * (2 * qk + 2 * v + 2 * 32)  # 2048 x 12,352 = 25,296,896
    conv = (2 * qk + v) * 1 * 4  # 8192 x 4 = 32,768
    gates = 2 * 32  # dt_bias, A_log
    norm = 128
    out_proj = v * 2048  # 8,388,608
    total = in_proj + conv + gates + norm + out_proj
    assert total == 33_718_464
    assert gdn_params(QWEN3_NEXT, HIDDEN) == total
    # all but the norm's [Dv] weight split over tp; the norm's weight whole on every rank
    split = total - norm
    assert gdn_params(QWEN3_NEXT, HIDDEN, 2) == split // 2 + norm == 16_859_296
    assert gdn_params(QWEN3_NEXT, HIDDEN, 4) == split // 4 + norm == 8_429_712


def test_tensors_sum_to_the_parameters() -> None:
    for mixer, hidden in ((QWEN3_NEXT, HIDDEN), (SMALL, 64)):
        for tp in (1, 2):
            tensors = gdn_tensors(mixer, hidden, tp)
            assert sum(t.numel * t.count for t in tensors) == gdn_params(mixer, hidden, tp)
    shapes = {t.name: t.shape for t in gdn_tensors(QWEN3_NEXT, HIDDEN, 2)}
    assert shapes["in_proj"] == (12_352 // 2, 2048) and shapes["out_proj"] == (2048, 2048)
    assert shapes["conv1d weight"] == (4096, 1, 4) and shapes["A_log"] == (16,) and shapes["dt_bias"] == (16,)
    assert shapes["gated norm weight"] == (128,)


def _gemm(kernels: tuple, name: str) -> Gemm:
    (found,) = [k for k in kernels if isinstance(k, Gemm) and k.name == name]
    return found


def test_linears_match_megatrons_gdn_layer_flops() -> None:
    """megatron/training/training.py (d98e8a64dd) gdn_layer_flops: 2 t (h (2 qk + 2 v + 2 Hv) [in_proj]
    + conv_k (2 qk + v) [conv1d] + 4 Hv Dv^2 [rule] + h v [out_proj]), qk = Hk Dk, v = Hv Dv."""
    t, h, hk, hv, dk, dv = 2 * 4096, HIDDEN, 16, 32, 128, 128
    qk, v = hk * dk, hv * dv
    for tp in (1, 2, 4):
        k = gdn_kernels(QWEN3_NEXT, h, t, tp, sp=True, dtype_bytes=2, batch=2)
        assert tp * _gemm(k.F, "in_proj").flops == 2 * t * h * (2 * qk + 2 * v + 2 * hv)
        assert tp * _gemm(k.F, "out_proj").flops == 2 * t * h * v


def test_flops_are_the_kernels_gemms_per_phase() -> None:
    for mixer, hidden, tokens, batch in ((QWEN3_NEXT, HIDDEN, 8192, 2), (SMALL, 64, 100, 2), (SMALL, 64, 7, 1)):
        for tp in (1, 2):
            k = gdn_kernels(mixer, hidden, tokens, tp, sp=False, dtype_bytes=2, batch=batch)
            assert gdn_flops(mixer, hidden, tokens, tp, batch=batch) == (k.flops("F"), k.flops("I"), k.flops("W"))
            # W: exactly the two weight gradients, in backward order
            assert [g.name for g in k.W] == ["out_proj wgrad", "in_proj wgrad"]
            assert all(isinstance(g, Gemm) for g in k.W)
            assert k.memory_bytes("W") == 0
            # the rule's GEMMs all named "GDN ...": 9 forward, 23 backward
            assert len([g for g in k.F if isinstance(g, Gemm) and g.name.startswith("GDN")]) == 9
            assert len([g for g in k.I if isinstance(g, Gemm) and g.name.startswith("GDN")]) == 23
            assert {g.name for g in k.F if isinstance(g, Gemm)} - {"in_proj", "out_proj"} == {
                g.name for g in k.F if isinstance(g, Gemm) and g.name.startswith("GDN ")}
            assert [g.name for g in k.I if isinstance(g, Gemm) and not g.name.startswith("GDN")] == [
                "out_proj dgrad", "in_proj dgrad"]


def test_rule_flops_closed_form() -> None:
    """Per chunk of C and local value head: forward (beta K) K^T, Q K^T, W (C^2 Dk each), U, (QK^T o M) V_new
    (C^2 Dv), the inverse (C^3), V_new, S update, Q S (C Dk Dv); backward 8 C^2 Dk, 5 C^2 Dv, 2 C^3, 8 C Dk Dv."""
    # SMALL: 100 tokens in 2 sequences of 50, chunks of 16: 4 each (the last padded), 8 in all; tp 2: 2 heads
    c, dk, dv, bh = 16, 8, 16, 8 * 2
    f = 2 * bh * (3 * c * c * dk + 2 * c * c * dv + c ** 3 + 3 * c * dk * dv)
    b = 2 * bh * (8 * c * c * dk + 5 * c * c * dv + 2 * c ** 3 + 8 * c * dk * dv)
    assert (f, b) == (2 * bh * 24_576, 2 * bh * 61_440)
    lin = 2 * 100 * 64 * (SMALL.in_proj_width + SMALL.v_width) // 2
    assert SMALL.in_proj_width == 2 * 16 + 2 * 64 + 8
    assert gdn_flops(SMALL, 64, 100, 2, batch=2) == (lin + f, lin + b, lin)
    # Qwen3-Next per token and value head at Dk = Dv = 2 C: forward 46 C^2, backward 120 C^2 (2.6x)
    ff, bb, _ = gdn_flops(QWEN3_NEXT, HIDDEN, 4096, batch=1)
    lin = 2 * 4096 * HIDDEN * (12_352 + 4096)
    assert ff - lin == 4096 * 32 * 46 * 64 ** 2 and bb - lin == 4096 * 32 * 120 * 64 ** 2


def test_sp_changes_no_kernel_and_batch_adds_the_transposes() -> None:
    a = gdn_kernels(SMALL, 64, 64, 2, sp=False, dtype_bytes=2, batch=2)
    assert a == gdn_kernels(SMALL, 64, 64, 2, sp=True, dtype_bytes=2, batch=2)
    one = gdn_kernels(SMALL, 64, 64, 2, sp=False, dtype_bytes=2, batch=1)
    ev = 64 * 64 // 2
    for phase in ("F", "I"):
        assert a.memory_bytes(phase) - one.memory_bytes(phase) == 2 * ev * 2
    assert all(isinstance(k, MemoryBound) or k.flops > 0 for k in (*a.F, *a.I))


def test_saved_bytes_by_hand() -> None:
    """SMALL, hidden 64, 32 tokens, tp 2 under sp, bf16: Hl = 2 value heads, 1 key head, qk 16, v 64 per mixer."""
    saved = gdn_saved(SMALL, 64, 32, 2, sp=True, dtype_bytes=2)
    assert all(s.block == "GDN" for s in saved)
    by_name = {s.name: s.nbytes for s in saved}
    assert by_name["in_proj input"] == 2 * 32 * 64 // 2 == 2048
    assert by_name["conv1d input (q, k, v)"] == 2 * 32 * 96 // 2 == 3072
    assert by_name["delta rule A (WY inverse)"] == 2 * 32 * 2 * 16 == 2048
    expected = (2048  # in_proj input, sp shard
                + 3072  # conv1d input: (2 qk + v) / tp per token
                + 2 * 32 * 2 * 16 // 2 + 4 * 32 * 2 * 2 // 2  # l2norm output q, k; float32 rstd per token, q/k head
                + 2 * 32 * 2  # alpha
                + 2 * 2 * 32 * 2 * 8 + 2 * 32 * 64 // 2  # q and k on Hl value heads; v
                + 4 * 32 * 2 + 2 * 32 * 2 + 2048  # g (float32), beta, A
                + 2048 + 4 * 32 * 2  # norm input, float32 rstd per token and value head
                + 3 * 2048)  # z, the norm's output, out_proj input
    assert expected == 21_504
    assert sum(by_name.values()) == expected == sum(s.nbytes for s in saved)
    no_sp = gdn_saved(SMALL, 64, 32, 2, sp=False, dtype_bytes=2)
    assert sum(s.nbytes for s in no_sp) == expected + 2048


def test_split_refusals() -> None:
    check_gdn_split(QWEN3_NEXT, 16)
    with pytest.raises(PipesimError, match=r"^tp 32 does not split the Gated DeltaNet's 16 key heads and 32 value "
                                           r"heads \(Megatron-core asserts both % tp == 0\)$") as info:
        check_gdn_split(QWEN3_NEXT, 32)
    assert "\n" not in str(info.value)
    with pytest.raises(PipesimError, match="tp 3 does not split"):
        gdn_params(QWEN3_NEXT, HIDDEN, 3)
    with pytest.raises(PipesimError, match="tp 3 does not split"):
        gdn_kernels(QWEN3_NEXT, HIDDEN, 128, 3, sp=False, dtype_bytes=2, batch=1)
    with pytest.raises(PipesimError, match="tp must be a positive integer, not 0"):
        check_gdn_split(QWEN3_NEXT, 0)
    with pytest.raises(PipesimError, match="7 tokens do not split into 2 sequences"):
        gdn_flops(SMALL, 64, 7, batch=2)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"key_heads": 16, "value_heads": 24},
     "the Gated DeltaNet's 24 value heads are not a multiple of its 16 key heads"),
    ({"key_heads": 0, "value_heads": 32}, "the Gated DeltaNet's key_heads must be a positive integer, not 0"),
    ({"key_heads": 16, "value_heads": 32, "chunk": -64}, "chunk must be a positive integer, not -64"),
    ({"key_heads": 16, "value_heads": 32, "key_dim": 1.5}, "key_dim must be a positive integer, not 1.5"),
    ({"key_heads": True, "value_heads": 32}, "key_heads must be a positive integer, not True"),
])
def test_mixer_refusals(kwargs: dict, message: str) -> None:
    with pytest.raises(PipesimError, match=message) as info:
        GatedDeltaNet(**kwargs)
    assert "\n" not in str(info.value)
