"""Time of one matrix multiply from its shape and dtype on a device: roofline with tile and wave quantisation.

A GEMM library splits the (M, N) output into tiles, one tile per SM at a time; the tiles run in
waves of `sms`, so a shape whose tile count is just over a multiple of the SM count pays a whole
extra wave (wave quantisation), and a dimension that is not a multiple of the tile pays for the
padding (tile quantisation) -- NVIDIA's "Matrix Multiplication Background" guide. Each tile's
work runs at the device's best achievable matmul rate (MAMF / peak); the operands and output
stream through HBM at its achievable bandwidth; the two overlap as XLA's cost model assumes;
every kernel pays a fixed overhead. Among the tile shapes the library offers, the fastest wins
(what cuBLAS's heuristics aim for). Formulas: docs/gpu_model.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesim.device.profile import DTYPE_BYTES, DeviceProfile
from pipesim.errors import PipesimError


@dataclass(frozen=True)
class GemmTime:
    """The predicted time of one (batched) GEMM and how it was reached; seconds, FLOPs, bytes."""

    seconds: float  # the kernel's time: roofline of compute and memory, plus the overhead
    compute: float  # seconds of tensor-core work: waves x one tile's FLOPs at the achievable rate
    memory: float  # seconds of HBM traffic at the achievable bandwidth
    overhead: float  # seconds: the per-kernel launch/start-up cost
    flops: float  # useful FLOPs, 2 b m n k
    bytes_moved: float  # bytes read and written once: b ((m k + k n) x dtype bytes + m n x C's bytes)
    tile: tuple[int, int]  # (rows, cols) of the tile chosen
    tiles: int  # tiles of the output, over the batch
    waves: int  # ceil(tiles / SMs)
    wave_flops: float  # FLOPs the waves occupy: waves x SMs x 2 t_m t_n k

    @property
    def achieved(self) -> float:
        """FLOP/s the kernel reaches: useful FLOPs / seconds."""
        return self.flops / self.seconds

    @property
    def quantisation_efficiency(self) -> float:
        """Useful FLOPs over the FLOPs the waves occupy (every SM of every wave running one tile)."""
        return self.flops / self.wave_flops

    @property
    def bound(self) -> str:
        """"compute" or "memory": the larger of the two terms."""
        return "compute" if self.compute >= self.memory else "memory"


def gemm_flops(m: int, n: int, k: int, batch: int = 1) -> float:
    """2 b m n k: one multiply and one add per term."""
    return 2.0 * batch * m * n * k


def gemm_bytes(m: int, n: int, k: int, dtype_bytes: int, batch: int = 1, c_bytes: int = 0) -> float:
    """Bytes read and written once: A (m x k), B (k x n) and C (m x n), per batch entry.

    c_bytes: bytes moved per element of C when the epilogue accumulates into it (read and written,
    e.g. 8 for Megatron's fused weight gradient into a float32 main_grad); 0: C written once in the dtype."""
    c = c_bytes or dtype_bytes
    return float(batch * ((m * k + k * n) * dtype_bytes + m * n * c))


def _check_shape(m: int, n: int, k: int, batch: int) -> None:
    for name, value in (("m", m), ("n", n), ("k", k), ("batch", batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PipesimError(f"a GEMM needs positive integer sizes, got {name} = {value!r}")


def roofline(compute: float, memory: float, overlap: float) -> float:
    """Seconds of compute and memory that overlap by `overlap` x the smaller: c + m - overlap min(c, m)."""
    return compute + memory - overlap * min(compute, memory)


def gemm_time(m: int, n: int, k: int, dtype: str, device: DeviceProfile, *, batch: int = 1,
              sms: int | None = None, c_bytes: int = 0) -> GemmTime:
    """Seconds of C (m x n) = A (m x k) @ B (k x n), `batch` times in one kernel, on `device`.

    For each tile (t_m, t_n) the device offers: tiles = b ceil(m / t_m) ceil(n / t_n), waves =
    ceil(tiles / SMs), compute = waves x 2 t_m t_n k / (peak / SMs x matmul_efficiency), memory =
    bytes / (HBM x memory_efficiency), time = compute + memory - overlap min(compute, memory).
    The fastest tile is kept (ties: the first listed) and the kernel overhead added once.
    sms: the SMs the kernel's tiles may use (default: all of the device's), e.g. the SMs an overlapped
    NCCL collective leaves it (pipesim.comm.overlap_interference); each SM keeps the device's per-SM rate.
    """
    _check_shape(m, n, k, batch)
    free = device.sms if sms is None else sms
    if not isinstance(free, int) or isinstance(free, bool) or not 1 <= free <= device.sms:
        raise PipesimError(f"a GEMM runs on 1 to {device.sms} SMs of {device.name!r}, got {free!r}")
    if dtype not in DTYPE_BYTES:
        raise PipesimError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    per_sm = device.peak(dtype) / device.sms * device.matmul_efficiency  # FLOP/s one SM sustains
    moved = gemm_bytes(m, n, k, DTYPE_BYTES[dtype], batch, c_bytes)
    memory = moved / (device.hbm_bandwidth * device.memory_efficiency)
    best: tuple[float, float, tuple[int, int], int, int] | None = None
    for tm, tn in device.tiles:
        tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        waves = math.ceil(tiles / free)
        compute = waves * 2.0 * tm * tn * k / per_sm
        t = roofline(compute, memory, device.overlap)
        if best is None or t < best[0]:
            best = (t, compute, (tm, tn), tiles, waves)
    t, compute, tile, tiles, waves = best  # type: ignore[misc]
    return GemmTime(seconds=t + device.kernel_overhead, compute=compute, memory=memory,
                    overhead=device.kernel_overhead, flops=gemm_flops(m, n, k, batch), bytes_moved=moved,
                    tile=tile, tiles=tiles, waves=waves,
                    wave_flops=waves * free * 2.0 * tile[0] * tile[1] * k)


__all__ = ["GemmTime", "gemm_bytes", "gemm_flops", "gemm_time", "roofline"]
