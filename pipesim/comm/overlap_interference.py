"""A collective overlapped with a GEMM is not free: NCCL's channels hold SMs that the GEMM's tiles lose.

NCCL runs a collective as one kernel with one thread block per channel (src/enqueue.cc: gridDim.x =
nChannels), and each block stays on its SM for the whole collective. A cuBLAS GEMM puts one tile on
each SM at a time. So while Megatron's async tensor-parallel collective runs beside the weight-gradient
GEMM, the GEMM's waves run on SMs - channels SMs. Its time on those SMs, G', comes from the wave model
(pipesim.device.gemm, `sms=`), taken as a ratio so that a calibrated G keeps its calibration. The
collective C takes what NCCL needs (pipesim.comm.collective_algos). Over the overlapped part the pair
takes max(G', C); the GEMM then finishes what is left of its work on all SMs:

    pair    = C                         if C >= G'   (the GEMM ends under the collective)
            = C + G (1 - C / G')        if C <  G'   (a share C / G' of the GEMM ran beside it)
    exposed = pair - G = max(C - G, C (1 - G / G'))

With no channel figure (0) G' = G, and exposed = max(0, C - G): the free overlap. How many channels
NCCL launches for a message follows its getAlgoInfo (src/enqueue.cc): starting from the communicator's
channels, one fewer while nBytes < channels x threads x the protocol's bytes-per-thread threshold
(src/include/comm.h; the ring LL threshold times the ranks, src/graph/tuning.cc). Formulas and sources:
docs/gpu_model.md ("SM sharing under overlap").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from pipesim.comm.collective_algos import CollectiveTime
from pipesim.device.gemm import gemm_time
from pipesim.device.profile import DeviceProfile
from pipesim.model.kernel_types import Gemm

# NVIDIA/nccl src/include/comm.h: bytes per thread before NCCL adds a channel (NCCL_*_THREAD_THRESHOLD)
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
# threads per channel: NCCL_MAX_NTHREADS (Simple, LL) and NCCL_LL128_MAX_NTHREADS (src/graph/tuning.cc defaults)
THREADS = {"LL": 512, "LL128": 640, "Simple": 512}


@dataclass(frozen=True)
class HidingGemm:
    """The GEMM a collective runs beside: its seconds on every SM, its shape and the device it runs on."""

    name: str  # e.g. "QKV wgrad"
    seconds: float  # on all SMs, as the stage's kernel path timed it
    gemm: Gemm  # its shape (m, n, k, batch)
    dtype: str
    profile: DeviceProfile  # the device figures the stage was timed with (nccl_channels among them)

    def seconds_beside(self, channels: int) -> float:
        """Seconds on the SMs `channels` NCCL blocks leave: seconds x t(SMs - channels) / t(SMs) of the wave model."""
        if channels <= 0:
            return self.seconds
        g = self.gemm
        return self.seconds * _ratio(g.m, g.n, g.k, g.batch, self.dtype, self.profile, self.profile.sms - channels,
                                     g.c_bytes)


@lru_cache(maxsize=1 << 14)
def _ratio(m: int, n: int, k: int, batch: int, dtype: str, profile: DeviceProfile, sms: int, c_bytes: int = 0) -> float:
    """The wave model's time of the GEMM on `sms` SMs over its time on all of them."""
    return gemm_time(m, n, k, dtype, profile, batch=batch, sms=sms, c_bytes=c_bytes).seconds / \
        gemm_time(m, n, k, dtype, profile, batch=batch, c_bytes=c_bytes).seconds


def channels_used(nbytes: float, ranks: int, algo: str, protocol: str, channels: int) -> int:
    """NCCL's channels (thread blocks) for one collective of S = `nbytes`: getAlgoInfo's rule.

    0 where NCCL does not run it (no channel figure, or comm_costs' CPU model, or a p2p transfer)."""
    if channels <= 0 or algo not in ("ring", "tree") or protocol not in THREAD_THRESHOLD:
        return 0
    per_channel = THREADS[protocol] * THREAD_THRESHOLD[protocol] * (ranks if (algo, protocol) == ("ring", "LL") else 1)
    used = channels
    while used >= 2 and nbytes < used * per_channel:
        used -= 1
    return used


def exposed_beside(collective: float, gemm: float, gemm_beside: float) -> float:
    """Seconds the pair adds to the GEMM's own: max(C - G, C (1 - G / G')) (C >= G': C - G)."""
    if collective >= gemm_beside:
        return collective - gemm
    return collective * (1.0 - gemm / gemm_beside)


def exposed_collective(timed: CollectiveTime, nbytes: float, ranks: int, gemm: HidingGemm) -> float:
    """Seconds of a collective (as NCCL runs it, `timed`) that its hiding GEMM does not cover, SMs shared."""
    channels = channels_used(nbytes, ranks, timed.algo, timed.protocol, gemm.profile.nccl_channels)
    return exposed_beside(timed.seconds, gemm.seconds, gemm.seconds_beside(channels))


def hiding_gemm(name: str | None, seconds: dict[str, float], shapes: dict[str, Gemm], dtype: str,
                profile: DeviceProfile) -> HidingGemm | None:
    """The named GEMM of a stage's kernel seconds as a HidingGemm; None if the stage has no such GEMM."""
    if not name or seconds.get(name, 0.0) <= 0 or name not in shapes:
        return None
    return HidingGemm(name, seconds[name], shapes[name], dtype, profile)


__all__ = ["THREADS", "THREAD_THRESHOLD", "HidingGemm", "channels_used", "exposed_beside", "exposed_collective",
           "hiding_gemm"]
