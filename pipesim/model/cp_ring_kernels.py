"""The memory-bound work Transformer Engine's ring attention (--cp-comm-type p2p) does around its per-step attention
kernels: the partial outputs merged forward, the gradients summed backward."""

from __future__ import annotations


def cp_ring_bytes(tokens: int, heads: int, kv_heads: int, head_dim: int, v_dim: int, cp: int, d: int
                  ) -> tuple[int, int]:
    """(forward, backward) bytes of Transformer Engine's ring attention around its per-step attention kernels on the
    busiest rank (the last, which meets every block whole), v2.1 attention.py AttnFuncWithCPAndKVP2P: forward, K and
    V concatenated into the send buffer (2 KV), the output zeroed (O) and each of the cp steps' partial output merged
    into it by its log-sum-exp (flash_attn_fwd_out_correction: read both, write one, 3 O per step); backward, K and V
    copied into the ring's buffer (2 KV), dQ copied from the first step and added from the other cp - 1 (2 Q + 3 Q
    each), dK/dV copied as a first half block and added (half blocks, then the whole at the last step):
    (3 cp / 2 + 1) KV. Q, O and KV are the rank's b s / cp tokens of query, output and key plus value."""
    q, o = tokens * heads * head_dim * d, tokens * heads * v_dim * d
    kv = tokens * kv_heads * (head_dim + v_dim) * d
    return 2 * kv + o + 3 * cp * o, 2 * kv + (3 * cp - 1) * q + (3 * cp + 2) * kv // 2


__all__ = ["cp_ring_bytes"]
