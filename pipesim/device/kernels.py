"""Non-GEMM kernels on a device: memory-bound ops at HBM bandwidth, and flash attention as its own kernel.

Softmax, norms, activations, dropout, residual adds and the optimizer step do a few FLOPs per
byte, so their time is the bytes they move at the achievable HBM bandwidth plus one kernel
overhead each (their byte counts: pipesim/model/elementwise.py). Flash attention fuses Q K^T,
the softmax and A V into one kernel that never writes the s x s scores: its time is its FLOPs at
the attention kernel's own achievable rate (FlashAttention-2/3's measured fractions of peak),
with the wave quantisation of its (batch, head, query block) grid. Formulas: docs/gpu_model.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from pipesim.device.gemm import roofline
from pipesim.device.profile import DTYPE_BYTES, DeviceProfile
from pipesim.errors import PipesimError

FLASH_QUERY_BLOCK = 128  # rows of queries per thread block in FlashAttention-2/3's forward grid
BACKWARD_FLOP_RATIO = 2.5  # backward / forward FLOPs: recompute Q K^T (1 matmul) + 4 gradient matmuls over 2


@dataclass(frozen=True)
class KernelTime:
    """Predicted seconds of one kernel and its parts (seconds, FLOPs, bytes)."""

    seconds: float
    compute: float  # seconds of FLOPs at the kernel's achievable rate (0 for memory-bound kernels)
    memory: float  # seconds of HBM traffic at the achievable bandwidth
    overhead: float  # seconds of per-kernel overhead
    flops: float
    bytes_moved: float


def memory_bound_time(nbytes: float, device: DeviceProfile, *, kernels: int = 1) -> KernelTime:
    """`nbytes` read and written by `kernels` memory-bound kernels: bytes / (HBM x memory_bound_efficiency) + overhead
    each (DeviceProfile.memory_bound_rate)."""
    if nbytes < 0 or kernels < 0:
        raise PipesimError(f"a memory-bound kernel needs bytes >= 0 and kernels >= 0, got {nbytes}, {kernels}")
    memory = nbytes / device.memory_bound_rate
    overhead = kernels * device.kernel_overhead
    return KernelTime(memory + overhead, 0.0, memory, overhead, 0.0, float(nbytes))


def attention_flops(batch: int, seq: int, heads: int, head_dim: int, *, kv_seq: int | None = None,
                    causal: bool = False, backward: bool = False, v_head_dim: int | None = None) -> float:
    """FLOPs of Q K^T and A V: forward 4 b s_q s_k h (h = heads x head_dim); backward 2.5x; causal halves.

    The backward re-computes Q K^T from the saved log-sum-exp (flash), then runs four gradient
    matmuls: (2 + 8) / 4 = 2.5x the forward, as pipesim/model/flops.py counts it. A value head
    `v_head_dim` narrower than the query/key head (latent attention: 128 against 192): forward
    2 b s_q s_k heads (q + v), backward 2 b s_q s_k heads (3 q + 2 v).
    """
    kv = seq if kv_seq is None else kv_seq
    vd = head_dim if v_head_dim is None else v_head_dim
    for name, value in (("batch", batch), ("seq", seq), ("heads", heads), ("head_dim", head_dim), ("kv_seq", kv),
                        ("v_head_dim", vd)):
        if not isinstance(value, int) or value < 1:
            raise PipesimError(f"attention needs positive integer sizes, got {name} = {value!r}")
    if vd != head_dim:
        flops = 2.0 * batch * seq * kv * heads * (3 * head_dim + 2 * vd if backward else head_dim + vd)
        return flops / 2 if causal else flops
    flops = 4.0 * batch * seq * kv * heads * head_dim
    if backward:
        flops *= BACKWARD_FLOP_RATIO
    return flops / 2 if causal else flops


def band_pairs(seq: int, size: int) -> int:
    """Causal (query, key) pairs of one head of a windowed layer over `seq` tokens: sum of min(i + 1, size)."""
    if size >= seq:
        return seq * (seq + 1) // 2
    return size * seq - size * (size - 1) // 2


@lru_cache(maxsize=1 << 12)
def band_tile_pairs(seq: int, size: int, block: int) -> int:
    """(query, key) pairs a flash kernel computes for one head of a windowed layer: every B x B tile the band touches,
    whole (B = `block`; pipesim.model.attention_window gives the formula)."""
    total = 0
    for first in range(0, seq, block):
        last = min(first + block, seq) - 1  # the query block's last row
        earliest = max(0, first - (size - 1))  # its first row's earliest key
        total += (last // block - earliest // block + 1) * block * (last - first + 1)
    return total


def window_tile_factor(seq: int, size: int) -> float:
    """Executed over counted FLOPs of a flash kernel over a causal window of `size` keys: the B x B tiles the band
    touches (`band_tile_pairs`) over its pairs (`band_pairs`), B = FLASH_QUERY_BLOCK; causal_tile_factor's 1 + B / s
    when the window covers the sequence (and s is a multiple of B)."""
    return band_tile_pairs(seq, size, FLASH_QUERY_BLOCK) / band_pairs(seq, size)


def causal_tile_factor(kv_seq: int) -> float:
    """Executed over counted FLOPs of a causal flash kernel: 1 + FLASH_QUERY_BLOCK / kv_seq.

    The count (`attention_flops`, causal) is the lower triangle, s_q s_k / 2 pairs; the kernel's grid computes each
    diagonal tile of FLASH_QUERY_BLOCK x FLASH_QUERY_BLOCK whole and masks half of it, FLASH_QUERY_BLOCK^2 / 2 pairs
    more per query block, s_q FLASH_QUERY_BLOCK / 2 in all (with context parallelism's local causal block as well).
    Short sequences pay the most: 6 % at 2,048 tokens, 1.6 % at 8,192 (FlashAttention-2/3 and cuDNN skip only the
    tiles wholly above the diagonal)."""
    return 1.0 + FLASH_QUERY_BLOCK / kv_seq


HEAD_DIM_REFERENCE = 128  # the head dim a family's flash figures are measured at


def head_dim_factor(device: DeviceProfile, head_dim: int, *, backward: bool = False) -> float:
    """The flash kernel's rate at `head_dim` over its rate at HEAD_DIM_REFERENCE: the family's figure at 64
    (`flash_hd64_*`; 1 without one) for 64 and below, linear in the head dim up to 1 at 128, 1 above (no backward
    figure beyond 128 was found; [FA3]'s causal cuDNN forward at 256 is within 6 % of 128's)."""
    at64 = device.flash_hd64_backward if backward else device.flash_hd64_forward
    if at64 is None or head_dim >= HEAD_DIM_REFERENCE:
        return 1.0
    if head_dim <= 64:
        return at64
    return at64 + (1.0 - at64) * (head_dim - 64) / (HEAD_DIM_REFERENCE - 64)


def flash_attention_time(batch: int, seq: int, heads: int, head_dim: int, dtype: str, device: DeviceProfile, *,
                         kv_seq: int | None = None, kv_heads: int | None = None, causal: bool = False,
                         backward: bool = False, sms: int | None = None, v_head_dim: int | None = None,
                         window: int | None = None) -> KernelTime:
    """Seconds of one flash-attention forward (or backward) kernel on `device`.

    compute = FLOPs executed (causal: the diagonal tiles whole, `causal_tile_factor`) / (peak x flash
    efficiency x `head_dim_factor`) / wave efficiency, with blocks = b x heads x
    ceil(s / 128) and wave efficiency = blocks / (ceil(blocks / SMs) x SMs); memory = Q, K, V, O
    (and dO, dQ, dK, dV backward) once through HBM; the two overlap as GEMMs do; plus one overhead.
    Grouped-query attention (`kv_heads` < heads) reads fewer K, V bytes, same FLOPs.
    sms: the SMs its blocks may use (default all), e.g. those an overlapped NCCL collective leaves: the
    waves are ceil(blocks / sms), each SM keeping the device's per-SM rate (as pipesim.device.gemm).
    v_head_dim: the value (and output) head when it differs from the query/key head (latent attention): its
    FLOPs (`attention_flops`) at the same rate, V, O, dV, dO at that width.
    window: a causal sliding window of that many keys (seq = kv_seq, one rank's whole sequence): its counted FLOPs the
    band's (`band_pairs`), its executed ones the B x B tiles the band touches (`band_tile_pairs`), at the same rate.
    """
    flops = attention_flops(batch, seq, heads, head_dim, kv_seq=kv_seq, causal=causal, backward=backward,
                            v_head_dim=v_head_dim)
    if window is not None:
        if not causal or (kv_seq is not None and kv_seq != seq):
            raise PipesimError("a sliding window is timed on a causal kernel over the rank's whole sequence")
        flops = attention_flops(batch, 1, heads, head_dim, backward=backward, v_head_dim=v_head_dim) * \
            band_pairs(seq, window)
    kv, kvh = seq if kv_seq is None else kv_seq, heads if kv_heads is None else kv_heads
    if not isinstance(kvh, int) or not 1 <= kvh <= heads or heads % kvh:
        raise PipesimError(f"kv_heads must divide heads ({heads}), got {kvh!r}")
    if dtype not in DTYPE_BYTES:
        raise PipesimError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    free = device.sms if sms is None else sms
    if not isinstance(free, int) or isinstance(free, bool) or not 1 <= free <= device.sms:
        raise PipesimError(f"flash attention runs on 1 to {device.sms} SMs of {device.name!r}, got {free!r}")
    eff = (device.flash_backward_efficiency if backward else device.flash_forward_efficiency) * \
        head_dim_factor(device, head_dim, backward=backward)
    blocks = batch * heads * math.ceil(seq / FLASH_QUERY_BLOCK)
    waves = math.ceil(blocks / free)
    if window is not None:
        executed = flops * window_tile_factor(seq, window)
    else:
        executed = flops * causal_tile_factor(kv) if causal else flops
    compute = executed / (device.peak(dtype) * eff) * (waves * device.sms / blocks)
    vd = head_dim if v_head_dim is None else v_head_dim
    q_o = batch * seq * heads * (head_dim + vd)  # elements of Q and O (and dQ, dO)
    k_v = batch * kv * kvh * (head_dim + vd)  # elements of K and V (and dK, dV)
    elements = 2 * (q_o + k_v) if backward else q_o + k_v  # bwd: Q O dO dQ, K V dK dV
    moved = float(elements * DTYPE_BYTES[dtype])
    memory = moved / (device.hbm_bandwidth * device.memory_efficiency)
    seconds = roofline(compute, memory, device.overlap) + device.kernel_overhead
    return KernelTime(seconds, compute, memory, device.kernel_overhead, flops, moved)


__all__ = ["BACKWARD_FLOP_RATIO", "FLASH_QUERY_BLOCK", "HEAD_DIM_REFERENCE", "KernelTime", "attention_flops",
           "band_pairs", "band_tile_pairs", "causal_tile_factor", "flash_attention_time", "head_dim_factor",
           "memory_bound_time", "window_tile_factor"]
