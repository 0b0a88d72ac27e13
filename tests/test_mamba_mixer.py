"""A Mamba-2 mixer as Megatron-core runs it (pipesim/model/mamba_mixer.py): Nemotron-H 8B's parameters written out
from MambaMixer's shapes, the linears' FLOPs against Megatron's mamba_layer_flops, the scan's closed forms, the F/I/W
split, the saved bytes by hand, and the sizes and tp splits Megatron refuses."""

from __future__ import annotations

import pytest

from pipesim.errors import PipesimError
from pipesim.model.kernel_types import Gemm, MemoryBound
from pipesim.model.mamba_mixer import (
    MambaMixer,
    check_mamba_split,
    mamba_flops,
    mamba_kernels,
    mamba_params,
    mamba_saved,
    mamba_tensors,
)

# Nemotron-H 8B (nvidia/Nemotron-H-8B-Base-8K): hidden 4096, mamba heads 128 x head_dim 64, state 128, groups 8, conv 4
H8B = MambaMixer(heads=128, head_dim=64, state=128, groups=8, conv_kernel=4)
HIDDEN = 4096


def test_nemotron_h_8b_parameters_by_hand() -> None:
    """NVIDIA/Megatron-LM @ d98e8a64dd megatron/core/ssm/mamba_mixer.py: in_proj d_model -> 2 d_inner + 2 G N + H
    (bias=False asserted), conv1d_weight [d_inner + 2 G N, 1, d_conv] and conv1d_bias [d_inner + 2 G N], dt_bias,
    A_log, D [H], the gated norm's weight [d_inner], out_proj d_inner -> d_model (bias-free)."""
    d_inner = 128 * 64  # 8192
    conv_dim = d_inner + 2 * 8 * 128  # 10,240
    in_proj = 4096 * (2 * d_inner + 2 * 8 * 128 + 128)  # 4096 x 18,560 = 76,021,760
    conv = conv_dim * 1 * 4 + conv_dim  # 40,960 + 10,240
    vectors = 3 * 128  # dt_bias, A_log, D
    norm = d_inner
    out_proj = d_inner * 4096  # 33,554,432
    total = in_proj + conv + vectors + norm + out_proj
    assert total == 109_635_968
    assert mamba_params(H8B, HIDDEN) == total
    # Every mixer parameter is tensor_model_parallel (split with heads and groups): none is replicated, so each
    # rank's share is exactly 1 / tp and the ranks sum back to the whole; the only replicated weight of a Mamba
    # layer is its pre-norm (in_proj's fused norm), which the caller counts, once per rank.
    for tp in (2, 4, 8):
        assert tp * mamba_params(H8B, HIDDEN, tp) == total


def test_tensors_sum_to_the_parameters() -> None:
    for mixer, hidden in ((H8B, HIDDEN), (MambaMixer(heads=8, head_dim=16, state=32, groups=4, conv_kernel=3), 96)):
        for tp in (1, 2, 4):
            tensors = mamba_tensors(mixer, hidden, tp)
            assert sum(t.numel * t.count for t in tensors) == mamba_params(mixer, hidden, tp)
    shapes = {t.name: t.shape for t in mamba_tensors(H8B, HIDDEN, 2)}
    assert shapes["in_proj"] == (18_560 // 2, 4096) and shapes["out_proj"] == (4096, 4096)
    assert shapes["conv1d weight"] == (5120, 1, 4) and shapes["A_log"] == (64,)


def _gemm(kernels: tuple, name: str) -> Gemm:
    (found,) = [k for k in kernels if isinstance(k, Gemm) and k.name == name]
    return found


def test_linears_match_megatrons_mamba_layer_flops() -> None:
    """megatron/training/training.py (d98e8a64dd) mamba_layer_flops: in_proj 2 t h (2 d_in + 2 G N + H), scan
    7 t d_in N, out_proj 2 t d_in h, with d_in = 2 h (Megatron's expand; 128 x 64 = 8192 = 2 x 4096 here)."""
    t, h, d_in, g, n, heads = 2 * 8192, HIDDEN, 2 * HIDDEN, 8, 128, 128
    for tp in (1, 2, 4):
        k = mamba_kernels(H8B, h, t, tp, sp=False, dtype_bytes=2, batch=2)
        assert tp * _gemm(k.F, "in_proj").flops == 2 * t * h * (2 * d_in + 2 * g * n + heads)
        assert tp * _gemm(k.F, "out_proj").flops == 2 * t * d_in * h


def test_scan_forward_flops_against_megatrons_7_t_d_in_n() -> None:
    """The scan's forward GEMMs per chunk of Q: C B^T 2 G Q^2 N, chunk states 2 H Q N P, (L o CB) X 2 H Q^2 P,
    C h 2 H Q N P; per token (d_in = H P) 2 G Q N + 4 d_in N + 2 Q d_in. Megatron's 7 t d_in N has no chunk term:
    for Nemotron-H 8B ours is 6,553,600 t, Megatron's 7,340,032 t (the 2 Q d_in intra-chunk product in place of
    3 d_in N, and the groups' C B^T on top)."""
    t, q, n, g, d_in = 4 * 8192, 128, 128, 8, 8192
    k = mamba_kernels(H8B, HIDDEN, t, 1, sp=False, dtype_bytes=2, batch=4)
    scan = sum(x.flops for x in k.F if isinstance(x, Gemm) and x.name.startswith("SSD"))
    assert scan == t * (2 * g * q * n + 4 * d_in * n + 2 * q * d_in) == 6_553_600 * t
    assert 7 * t * d_in * n == 7_340_032 * t
    # the backward's: 3 C B^T-sized and, per head, 5 Q N P and 3 Q^2 P products per chunk
    back = sum(x.flops for x in k.I if isinstance(x, Gemm) and x.name.startswith("SSD"))
    assert back == t * (6 * g * q * n + 10 * d_in * n + 6 * q * d_in) == 17_563_648 * t
    # tp splits heads and groups: each rank a quarter of the scan
    k4 = mamba_kernels(H8B, HIDDEN, t, 4, sp=False, dtype_bytes=2, batch=4)
    assert 4 * sum(x.flops for x in k4.F if isinstance(x, Gemm) and x.name.startswith("SSD")) == scan


@pytest.mark.parametrize(("tokens", "batch", "tp"), [(4 * 8192, 4, 1), (2 * 200, 2, 2), (3 * 1000, 3, 8)])
def test_flops_by_phase_and_the_w_phase(tokens: int, batch: int, tp: int) -> None:
    k = mamba_kernels(H8B, HIDDEN, tokens, tp, sp=True, dtype_bytes=2, batch=batch)
    sums = tuple(sum(x.flops for x in phase if isinstance(x, Gemm)) for phase in k.phases())
    assert mamba_flops(H8B, HIDDEN, tokens, tp, batch=batch) == sums
    assert [x.name for x in k.W] == ["out_proj wgrad", "in_proj wgrad"]
    assert all(isinstance(x, Gemm) for x in k.W)
    assert sums[2] == 2 * tokens * HIDDEN * (18_560 + 8192) // tp
    assert not any("wgrad" in x.name for x in (*k.F, *k.I))


def test_partial_chunks_pad_each_sequence() -> None:
    """200 tokens per sequence in chunks of 128: two chunks each, the second padded (4 for the batch of 2)."""
    k = mamba_kernels(H8B, HIDDEN, 400, 1, sp=False, dtype_bytes=2, batch=2)
    assert _gemm(k.F, "SSD C B^T") == Gemm("SSD C B^T", 128, 128, 128, 4 * 8)
    assert _gemm(k.F, "SSD (L o CB) X").batch == 4 * 128
    one = mamba_kernels(H8B, HIDDEN, 400, 1, sp=False, dtype_bytes=2, batch=1)  # one sequence of 400: 4 chunks
    assert _gemm(one.F, "SSD C B^T").batch == 4 * 8
    with pytest.raises(PipesimError, match="401 tokens do not split into 2 sequences"):
        mamba_kernels(H8B, HIDDEN, 401, 1, sp=False, dtype_bytes=2, batch=2)


def test_memory_bound_kernels() -> None:
    """Small mixer, tp 2, 2 sequences of 32 tokens (chunk 16: 4 chunks), bf16: e = 64 x 32 / 2 = 1024 inner
    elements, c = 64 x 96 / 2 = 3072 conv channels' elements; transposes only with b > 1; sp changes nothing."""
    m = MambaMixer(heads=4, head_dim=8, state=16, groups=2, chunk=16)
    k = mamba_kernels(m, 48, 64, 2, sp=True, dtype_bytes=2, batch=2)
    assert k == mamba_kernels(m, 48, 64, 2, sp=False, dtype_bytes=2, batch=2)
    f = {x.name: x.nbytes for x in k.F if isinstance(x, MemoryBound)}
    i = {x.name: x.nbytes for x in k.I if isinstance(x, MemoryBound)}
    e, c, w = 1024, 3072, 64 * 132 // 2
    assert f["Mamba conv1d + SiLU"] == 2 * c * 2 and i["Mamba conv1d + SiLU backward"] == 3 * c * 2
    assert f["Mamba gated RMSNorm"] == 2 * e * 2 + 4 * 64 * 1  # one float32 rstd per token and local group
    assert i["Mamba gated RMSNorm backward"] == 3 * e * 2 + 4 * 64 * 1
    assert f["SSD dt softplus + cumsum"] == 2 * (64 * 2 + 8 * 64)  # 2 local heads: dt in, two float32 arrays out
    states = 4 * 2 * 8 * 16  # chunks x local heads x P x N
    assert f["SSD state passing"] == states * (4 + 2) + 4 * 2 * 2 * 8 * 16
    assert f["zxBCdt transpose"] == i["zxBCdt gradient transpose"] == 2 * w * 2
    single = mamba_kernels(m, 48, 32, 2, sp=False, dtype_bytes=2, batch=1)
    assert not any("transpose" in x.name for x in (*single.F, *single.I))


def test_saved_bytes_by_hand() -> None:
    """heads 4 x head_dim 8 (d_in 32), state 16, groups 4, hidden 32, 2 x 24 = 48 tokens, tp 2, bf16. in_proj
    width W = 2 x 32 + 2 x 4 x 16 + 4 = 196. Saved: in_proj input d t h (/ tp under sp), zxBCdt d t W / tp, the
    scan's out_x, the norm's input and out_proj's input d t d_in / tp each, the norm's rstd 4 t G / tp."""
    m = MambaMixer(heads=4, head_dim=8, state=16, groups=4, chunk=16)
    d, t, h, tp, w, d_in, g = 2, 48, 32, 2, 196, 32, 4
    rest = d * t * w // tp + 3 * d * t * d_in // tp + 4 * t * g // tp
    sp = mamba_saved(m, h, t, tp, sp=True, dtype_bytes=d)
    assert sum(x.nbytes for x in sp) == d * t * h // tp + rest == 15_936
    no_sp = mamba_saved(m, h, t, tp, sp=False, dtype_bytes=d)
    assert sum(x.nbytes for x in no_sp) == d * t * h + rest == 17_472
    assert all(x.block == "Mamba" and x.dropped_by == () for x in (*sp, *no_sp))
    assert [x.name for x in sp][0] == "in_proj input"


def test_tp_must_split_heads_and_groups() -> None:
    for tp in (3, 16):  # 3 splits neither; 16 splits the 128 heads but not the 8 groups
        with pytest.raises(PipesimError) as err:
            check_mamba_split(H8B, tp)
        assert str(err.value) == (f"tp {tp} does not split the Mamba mixer's 128 heads and 8 groups "
                                  "(Megatron-core asserts heads % tp == 0 and groups % tp == 0)")
        with pytest.raises(PipesimError, match=f"tp {tp} does not split"):
            mamba_params(H8B, HIDDEN, tp)
    check_mamba_split(H8B, 8)
    with pytest.raises(PipesimError, match="tp must be a positive integer, not 0"):
        check_mamba_split(H8B, 0)


def test_mixer_sizes_refused() -> None:
    with pytest.raises(PipesimError) as err:
        MambaMixer(heads=12, groups=8)
    assert str(err.value) == "the Mamba mixer's 12 heads do not divide into its 8 groups"
    for bad in ({"heads": 0}, {"heads": 8, "state": -1}, {"heads": 8, "head_dim": 0}, {"heads": 8, "chunk": True},
                {"heads": 8, "conv_kernel": 2.0}):
        with pytest.raises(PipesimError, match="must be a positive integer"):
            MambaMixer(**bad)  # type: ignore[arg-type]
    assert (H8B.d_inner, H8B.conv_channels, H8B.in_proj_width) == (8192, 10_240, 18_560)
