"""Seconds and state bytes of Megatron-core's Muon step on one pipeline stage's rank (`--optimizer muon | dist_muon`).

Which tensors: every 2-D weight but the embedding and the output layer goes to TensorParallelMuon, the rest to Adam
(get_megatron_muon_optimizer, megatron/core/optimizer/muon.py at NVIDIA/Megatron-LM d7288711ba); QKV is cut per
head group into its Q, K and V parts, each orthogonalized alone (`split_qkv`, on by default); `--muon-tp-mode
blockwise` (the default) orthogonalizes each rank's shard as it is, no communication.

The Newton-Schulz orthogonalization of an m x n matrix (m <= n, transposed if not) under --muon-fp32-matmul-prec
medium: X normalized and cast to bfloat16, then per step (newton_schulz_step, NVIDIA-NeMo/Emerging-Optimizers
muon_utils.py) A = X X^T, B = b A + c A A, X = a X + B X: GEMMs m x m x n, m x m x m (accumulating into A) and
m x n x m (accumulating into X), each timed by pipesim.device.gemm; 4 m^2 n + 2 m^3 FLOPs a step.

Around it, per element of a Muon matrix (float32 unless said), the passes Megatron-core's Float16 wrapper and
OrthogonalizedOptimizer.step make: the 16-bit gradient copied to a float32 main gradient (2 + 4 bytes), its norm for
clipping (4), decoupled weight decay p *= 1 - lr wd (8), the momentum buffer's lerp (12), with Nesterov a lerp into
a new tensor (12), the normalisation's norm and division (12) and the casts to bfloat16 and back (6 + 6), the
update's scale by two factors (16), p += -lr update (12), the master copied to the 16-bit parameter (4 + 2) and the
gradient buffer zeroed (2): MUON_PASS_BYTES, + NESTEROV_BYTES. The Adam tensors take the Adam step's passes
(pipesim.model.optimizer_step). States: a float32 master and a momentum buffer per Muon element, a master and two
moments per Adam element (no master under float32 training).

`dist_muon` (LayerWiseDistributedOptimizer, megatron/core/optimizer/layer_wise_optimizer.py): the tensors sorted by
size and dealt in ping-pong order (ranks 0, 1, .., n - 1, n - 1, .., 0, ...) over the dp x cp ranks, the routed
experts' apart over the expert-data-parallel ranks; each rank steps and keeps the state of its own, then the
parameters are all-gathered. The stage's step is its slowest rank's; its state the largest share. pipesim deals each
stage's tensors (a rank holding several virtual stages deals each apart).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from pipesim.device.gemm import gemm_time
from pipesim.device.kernels import memory_bound_time
from pipesim.device.profile import DeviceProfile
from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.memory import Precision
from pipesim.model.muon_options import MuonOptions
from pipesim.model.optimizer_step import optimizer_passes
from pipesim.model.weight_tensors import QKV, WeightTensor

MUON_PASS_BYTES = 6 + 4 + 8 + 12 + 12 + 6 + 6 + 16 + 12 + 6 + 2  # bytes per Muon element (the module's list)
NESTEROV_BYTES = 12  # --muon-use-nesterov's lerp into a new tensor
NS_DTYPE = "bfloat16"  # --muon-fp32-matmul-prec medium: the iteration in bfloat16


@dataclass(frozen=True)
class Share:
    """One rank's part of the step: its Muon matrices (m, n), its Muon and Adam elements."""

    matrices: tuple[tuple[int, int], ...] = ()
    muon_elements: int = 0
    adam_elements: int = 0


def ns_matrices(tensor: WeightTensor, model: ModelConfig, tp: int, options: MuonOptions) -> tuple[tuple[int, int], ...]:
    """The matrices one tensor (one of its `count`) is orthogonalized as: () for an Adam tensor; QKV's Q, K and V parts
    with `split_qkv` (heads / kv-heads of head_dim rows each, on this tp rank)."""
    if not tensor.matrix:
        return ()
    rows, cols = tensor.shape
    if tensor.name == QKV and options.split_qkv:
        if model.attention_gate:  # Megatron-core: "split_qkv not supported for gated attention yet"
            raise PipesimError("Muon's split QKV with an attention output gate is not supported (Megatron-core's "
                               "attention.py); give --muon-no-split-qkv")
        q = model.attention_width // tp
        kv = model.kv_width // tp
        return ((q, cols), (kv, cols), (kv, cols))
    return ((rows, cols),)


@lru_cache(maxsize=1 << 14)
def ns_seconds(rows: int, cols: int, steps: int, profile: DeviceProfile) -> float:
    """Seconds of the Newton-Schulz iteration on one rows x cols matrix: its `steps` steps' three GEMMs (the two
    addmm accumulating into their bfloat16 input)."""
    m, n = min(rows, cols), max(rows, cols)
    step = (gemm_time(m, m, n, NS_DTYPE, profile).seconds
            + gemm_time(m, m, m, NS_DTYPE, profile, c_bytes=4).seconds
            + gemm_time(m, n, m, NS_DTYPE, profile, c_bytes=4).seconds)
    return steps * step


def deal(tensors: list[WeightTensor], ranks: int) -> list[list[WeightTensor]]:
    """LayerWiseDistributedOptimizer.shard_params: the tensors (each of `count` expanded) sorted by size, stably,
    dealt to `ranks` ranks in ping-pong order."""
    single = [replace(t, count=1) for t in tensors for _ in range(t.count)]
    single.sort(key=lambda t: t.numel)
    loop = list(range(ranks)) + list(range(ranks))[::-1]
    out: list[list[WeightTensor]] = [[] for _ in range(ranks)]
    for i, t in enumerate(single):
        out[loop[i % len(loop)]].append(t)
    return out


def _share(tensors: list[WeightTensor], model: ModelConfig, tp: int, options: MuonOptions) -> Share:
    """The part of a rank holding `tensors` (each `count` times)."""
    matrices: list[tuple[int, int]] = []
    muon = adam = 0
    for t in tensors:
        parts = ns_matrices(t, model, tp, options)
        matrices += parts * t.count
        if parts:
            muon += t.numel * t.count
        else:
            adam += t.numel * t.count
    return Share(tuple(matrices), muon, adam)


def shares(tensors: list[WeightTensor], model: ModelConfig, tp: int, options: MuonOptions, *, dp: int,
           edp: int) -> tuple[list[Share], list[Share]]:
    """Each rank's dense part and each rank's expert part: every tensor on every rank under `muon` (one share each),
    the ping-pong deal over dp x cp (dense) and edp (routed experts) under `dist_muon`."""
    out = []
    for group, ranks in (([t for t in tensors if not t.expert], dp), ([t for t in tensors if t.expert], edp)):
        owned = deal(group, ranks) if options.distributed else [group]
        out.append([_share(own, model, tp, options) for own in owned])
    return out[0], out[1]


@dataclass(frozen=True)
class MuonStage:
    """One stage's Muon step: its slowest rank's seconds and the largest optimizer state a rank keeps (bytes)."""

    seconds: float
    state_bytes: int
    pass_bytes: int  # the slowest parts' memory-bound passes (HBM bytes read and written)


def muon_stage(tensors: list[WeightTensor], model: ModelConfig, tp: int, options: MuonOptions, *, dp: int, edp: int,
               precision: Precision, profile: DeviceProfile) -> MuonStage:
    """The stage's step and state: the slowest dense part plus the slowest expert part, the largest of each state
    (the two deals are independent: an upper bound by at most one tensor's share)."""
    seconds, nbytes = 0.0, 0
    groups = shares(tensors, model, tp, options, dp=dp, edp=edp)
    for group in groups:
        slowest, share = max(((share_seconds(s, options, precision, profile), s) for s in group),
                             key=lambda timed: timed[0])
        seconds += slowest
        nbytes += sum(share_pass_bytes(share, options, precision))
    return MuonStage(seconds, largest_state(groups, precision), nbytes)


def largest_state(groups: tuple[list[Share], list[Share]], precision: Precision) -> int:
    """Bytes: the largest dense share's optimizer state plus the largest expert share's (`shares`' two groups)."""
    return sum(max(share_state_bytes(s, precision) for s in group) for group in groups if group)


def muon_state_bytes(tensors: list[WeightTensor], model: ModelConfig, tp: int, options: MuonOptions, *, dp: int,
                     edp: int, precision: Precision) -> int:
    """The stage's `muon_stage(...).state_bytes` without timing anything (the planner's memory bound)."""
    return largest_state(shares(tensors, model, tp, options, dp=dp, edp=edp), precision)


def share_pass_bytes(share: Share, options: MuonOptions, precision: Precision) -> tuple[int, ...]:
    """HBM bytes of each memory-bound pass of one rank's part: the Muon passes over its Muon elements, then Adam's
    passes over the rest."""
    per = MUON_PASS_BYTES + (NESTEROV_BYTES if options.nesterov else 0)
    passes = (share.muon_elements * per,) if share.muon_elements else ()
    return passes + (tuple(share.adam_elements * p.bytes_per_param for p in optimizer_passes(
        precision, loss_scaling=False)) if share.adam_elements else ())


def share_seconds(share: Share, options: MuonOptions, precision: Precision, profile: DeviceProfile) -> float:
    """Seconds of one rank's part: its matrices' iterations and its memory-bound passes."""
    ns = sum(ns_seconds(m, n, options.ns_steps, profile) for m, n in share.matrices)
    return ns + sum(memory_bound_time(b, profile).seconds for b in share_pass_bytes(share, options, precision))


def share_state_bytes(share: Share, precision: Precision) -> int:
    """Optimizer state of one rank's part: master and momentum per Muon element, master and moments per Adam one."""
    master = precision.master_bytes
    return share.muon_elements * (master + 4) + share.adam_elements * precision.optimizer_bytes


__all__ = ["MUON_PASS_BYTES", "NESTEROV_BYTES", "MuonStage", "Share", "deal", "largest_state", "muon_stage",
           "muon_state_bytes", "ns_matrices", "ns_seconds", "share_pass_bytes", "share_seconds", "share_state_bytes",
           "shares"]
