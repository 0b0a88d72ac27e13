"""Transformer Engine's ring attention (--cp-comm-type p2p) merges each step's partial output and sums each step's
gradients in memory-bound kernels around its attention kernels (pipesim/model/cp_ring_kernels.py): their bytes by
hand, where they appear, and that full recomputation runs the merges again."""

from __future__ import annotations

from pipesim.model.config import ModelConfig
from pipesim.model.cp_ring_kernels import cp_ring_bytes
from pipesim.model.kernel_types import MemoryBound
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.options import LayerOptions

# 8 query heads of 32 over tp 2 (4 per rank), 2 KV heads (1 per rank), seq 512 over cp 4, float32
MODEL = ModelConfig(kind="gpt", hidden=256, heads=8, kv_heads=2, seq=512, layers=2, batch=4)


def test_the_bytes_by_hand():
    """tokens 2 x 128 = 256, Q = O = 256 x 4 heads x 32 x 4 B = 131,072; KV = 256 x 1 x (32 + 32) x 4 = 65,536.
    Forward: 2 KV + O + 3 x 4 O = 13 O + 2 KV; backward: 2 KV + (12 - 1) Q + (12 + 2) / 2 KV = 11 Q + 9 KV."""
    q, kv = 256 * 4 * 32 * 4, 256 * 1 * 64 * 4
    assert cp_ring_bytes(256, 4, 1, 32, 32, 4, 4) == (13 * q + 2 * kv, 11 * q + 9 * kv)
    assert cp_ring_bytes(256, 4, 1, 32, 32, 2, 4) == (7 * q + 2 * kv, 5 * q + 6 * kv)  # cp 2: 7 O, 5 Q + 6 KV


def _ring(opts: LayerOptions) -> tuple[list[str], list[str]]:
    k = layer_kernels(MODEL, 2, opts)
    names = [x.name for x in k.F if isinstance(x, MemoryBound) and x.name.startswith("CP ring")]
    return names, [x.name for x in k.I if isinstance(x, MemoryBound) and x.name.startswith("CP ring")]


def test_only_the_p2p_ring_has_them_and_full_recomputation_merges_again():
    ring = LayerOptions(tp=2, cp=4, attention="flash")
    assert _ring(ring) == (["CP ring merges"], ["CP ring gradient sums"])
    k = layer_kernels(MODEL, 2, ring)
    merge = next(x for x in k.F if x.name == "CP ring merges")
    assert merge.nbytes == cp_ring_bytes(2 * 128, 4, 1, 32, 32, 4, 4)[0]
    assert _ring(LayerOptions(tp=2, cp=4, attention="flash", recompute="full")) == (
        ["CP ring merges"], ["CP ring merges", "CP ring gradient sums"])
    for other in (LayerOptions(tp=2, cp=1, attention="flash"), LayerOptions(tp=2, cp=4, attention="flash",
                                                                          cp_comm="all_gather")):
        assert _ring(other) == ([], [])
