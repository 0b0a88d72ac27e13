"""Seconds of a stage's kernels on a GPU device profile: the kernel path of pipesim/cost/model_costs.py.

A piece's kernels (pipesim/model/layer_kernels.py) are timed one by one on the hardware's device family
(pipesim/device/: gemm_time with tile and wave quantisation, flash_attention_time, memory_bound_time)
and summed per F, I and W. The planner prices thousands of configurations, so GEMM times are cached
by shape and a piece's times by (model, microbatch, options, fusion, family, measured figures: a
hardware file's `[device.kernels]`, which replace the family's profile figures: pipesim.cost.device_profiles).
Also kept: each
named GEMM's seconds, which the tensor-parallel collectives of a fused backward hide behind
(Megatron's async all-reduce / reduce-scatter of the input gradient under the weight-gradient GEMM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from pipesim.cost.device_profiles import fp8_profile_of, profile_of
from pipesim.device.fp8_rates import QUANTIZED, check_fp8_recipe
from pipesim.device.gemm import gemm_time
from pipesim.device.kernels import flash_attention_time, memory_bound_time
from pipesim.device.profile import DeviceProfile
from pipesim.errors import PipesimError
from pipesim.hardware.machine import KernelFigures
from pipesim.model.config import ModelConfig
from pipesim.model.eager_norm import with_eager_rmsnorm
from pipesim.model.fp8_kernels import fp8_layer_kernels, scale_update_bytes
from pipesim.model.grad_accumulation import accumulate_gradients
from pipesim.model.kernel_types import FlashAttention, Gemm, Kernel, PieceKernels
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.layer_kinds import StageLayers, kind_options
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import (
    embedding_params,
    head_params,
    is_moe_layer,
    mtp_embedding_params,
    mtp_projection_params,
)
from pipesim.model.piece_kernels import embedding_kernels, head_kernels, mlp_layer_kernels, mtp_kernels
from pipesim.model.weight_tensors import layer_params

# the linear a collective's `overlaps` text names (pipesim.model.layer_collectives) -> the GEMM names of
# pipesim.model.layer_kernels
LINEAR_NAMES = {"QKV": "QKV", "MLP up": "FC1", "head": "LM head", "Q": "Q", "Q up": "Q up", "KV up": "KV up",
                "MTP projection": "MTP projection", "in_proj": "in_proj"}
GRADIENT_SUFFIX = {"weight-gradient": "wgrad", "input-gradient": "dgrad"}


@dataclass(frozen=True)
class PieceSeconds:
    """Seconds of one piece's kernels per microbatch: F, I, W, and each GEMM's seconds by name."""

    F: float
    I: float  # noqa: E741 (the action's name in the IR)
    W: float
    gemms: tuple[tuple[str, float], ...] = ()  # (GEMM name, seconds)
    shapes: tuple[tuple[str, Gemm], ...] = ()  # (GEMM name, its shape): re-timed beside a collective
    # F, I, W with every GEMM on the SMs an NCCL collective leaves (sms - nccl_channels): the piece run beside a
    # data-parallel collective (pipesim.comm.overlap_interference's rule); equal to F, I, W without a channel figure
    beside: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def scaled(self, k: int) -> tuple[float, float, float]:
        return self.F * k, self.I * k, self.W * k


@lru_cache(maxsize=1 << 16)
def _gemm_seconds(m: int, n: int, k: int, batch: int, dtype: str, profile: DeviceProfile, c_bytes: int = 0,
                  sms: int | None = None) -> float:
    return gemm_time(m, n, k, dtype, profile, batch=batch, c_bytes=c_bytes, sms=sms).seconds


def kernel_seconds(kernel: Kernel, dtype: str, profile: DeviceProfile, sms: int | None = None,
                   fp8: DeviceProfile | None = None) -> float:
    """One kernel's seconds: a GEMM by its shape and flash attention (causal) by its grid, each on `sms` SMs (default
    all), the rest by its bytes. An FP8 GEMM (`Gemm.dtype` "float8", NVFP4's "float4") is timed on `fp8`, the profile
    as FP8 GEMMs see it (pipesim.device.fp8_rates.Fp8Figures.gemm_profile)."""
    if isinstance(kernel, Gemm):
        if kernel.dtype in QUANTIZED:
            if fp8 is None:
                raise PipesimError(f"{kernel.name} is an FP8 GEMM: timing it needs the device's FP8 figures")
            return _gemm_seconds(kernel.m, kernel.n, kernel.k, kernel.batch, kernel.dtype, fp8, kernel.c_bytes, sms)
        return _gemm_seconds(kernel.m, kernel.n, kernel.k, kernel.batch, dtype, profile, kernel.c_bytes, sms)
    if isinstance(kernel, FlashAttention):
        return flash_attention_time(kernel.batch, kernel.seq, kernel.heads, kernel.head_dim, dtype, profile,
                                    kv_seq=kernel.kv_seq, kv_heads=kernel.kv_heads, causal=True,
                                    backward=kernel.backward, sms=sms, v_head_dim=kernel.v_head_dim,
                                    window=kernel.window).seconds
    return memory_bound_time(kernel.nbytes, profile).seconds


def piece_seconds(kernels: PieceKernels, dtype: str, profile: DeviceProfile,
                  fp8: DeviceProfile | None = None) -> PieceSeconds:
    """Sum of each phase's kernel seconds, and the seconds of every GEMM and attention kernel by name; `beside`:
    the phases with the GEMMs' tiles and flash attention's blocks on the SMs NCCL's channels leave (memory-bound
    kernels as alone: they stream at HBM bandwidth on fewer SMs). `fp8`: the profile FP8 GEMMs are timed on."""
    phases = [sum(kernel_seconds(k, dtype, profile, fp8=fp8) for k in ks) for ks in kernels.phases()]
    named = tuple((k.name, kernel_seconds(k, dtype, profile, fp8=fp8)) for ks in kernels.phases() for k in ks
                  if isinstance(k, (Gemm, FlashAttention)))
    shapes = tuple((k.name, k) for ks in kernels.phases() for k in ks if isinstance(k, Gemm))
    free = profile.sms - profile.nccl_channels
    beside = tuple(phases) if not profile.nccl_channels else tuple(
        sum(kernel_seconds(k, dtype, profile, free, fp8) for k in ks) for ks in kernels.phases())
    return PieceSeconds(*phases, gemms=named, shapes=shapes, beside=beside)


def _norms(kernels: PieceKernels, model: ModelConfig, opts: LayerOptions) -> PieceKernels:
    """The piece's kernels with its RMSNorms as eager PyTorch's ops under --eager-rmsnorm (pipesim.model.eager_norm)."""
    if opts.eager_rmsnorm and model.norm == "rmsnorm":
        return with_eager_rmsnorm(kernels, model.dtype_bytes)
    return kernels


def _accumulated(kernels: PieceKernels, model: ModelConfig, params: int, grad_fusion: bool,
                 grad_bytes: int) -> PieceKernels:
    """The piece's kernels with each microbatch's gradients added into main_grad (pipesim.model.grad_accumulation);
    the buffer holds the precision's gradients: `grad_bytes`, 0 for the model's dtype (pipesim.model.memory)."""
    d = model.dtype_bytes
    return accumulate_gradients(kernels, params, dtype_bytes=d, grad_bytes=grad_bytes or d, fused=grad_fusion)


@lru_cache(maxsize=4096)
def layer_seconds(model: ModelConfig, b: int, opts: LayerOptions, fused: bool, family: str,
                  kernels: KernelFigures | None = None, grad_fusion: bool = True,
                  grad_bytes: int = 0, moe: bool = False) -> PieceSeconds:
    """One block's seconds (`moe`: with the model's mixture of experts as its MLP)."""
    params = layer_params(model, opts, moe=moe)
    pk = _accumulated(_norms(fp8_layer(model, b, opts, fused, family, moe), model, opts), model, params, grad_fusion,
                      grad_bytes)
    return piece_seconds(pk, model.dtype, *layer_profiles(family, kernels, opts))


def layer_profiles(family: str, kernels: KernelFigures | None,
                   opts: LayerOptions) -> tuple[DeviceProfile, DeviceProfile | None]:
    """(the profile a layer's kernels are timed on, its attention's kernel chosen; the one its FP8 GEMMs are)."""
    fp8 = fp8_profile_of(family, kernels, opts.fp8.recipe) if opts.fp8 is not None else None
    profile = profile_of(family, kernels)
    return profile.with_flash2() if opts.attention == "flash2" else profile, fp8


def fp8_layer(model: ModelConfig, b: int, opts: LayerOptions, fused: bool, family: str,
              moe: bool = False) -> PieceKernels:
    """A layer's kernels, with its linears in FP8 and their casts (pipesim.model.fp8_kernels) under `opts.fp8`,
    after checking that the family runs the recipe (pipesim.device.fp8_rates: its FP8 tensor cores, its layouts)."""
    kernels = layer_kernels(model, b, opts, fused=fused, moe=moe)
    if opts.fp8 is None:
        return kernels
    figures = check_fp8_recipe(family, opts.fp8.recipe)
    return fp8_layer_kernels(kernels, opts.fp8, dtype_bytes=model.dtype_bytes, tn_only=figures.tn_only, tp=opts.tp,
                             sp=opts.sp, compiled=fused)


@lru_cache(maxsize=4096)
def fp8_update_seconds(model: ModelConfig, b: int, opts: LayerOptions, family: str, mix: StageLayers,
                       kernels: KernelFigures | None = None) -> float:
    """Seconds of delayed scaling's amax-history and scale update of a stage's FP8 tensors (its layers `mix`) in one
    forward (and as much in its backward): one fused memory-bound kernel per pass
    (pipesim.model.fp8_kernels.scale_update_bytes); 0 without FP8, with another recipe, or without layers."""
    if opts.fp8 is None or opts.fp8.recipe != "delayed" or mix.layers == 0:
        return 0.0
    nbytes = sum(n * scale_update_bytes(fp8_layer(model, b, kind_options(model, opts, kind), True, family,
                                                  kind.moe)) for kind, n in mix)
    return memory_bound_time(nbytes, profile_of(family, kernels)).seconds


@lru_cache(maxsize=4096)
def head_seconds(model: ModelConfig, b: int, opts: LayerOptions, family: str,
                 kernels: KernelFigures | None = None, grad_fusion: bool = True,
                 grad_bytes: int = 0, ce_fusion: str = "unfused") -> PieceSeconds:
    pk = _accumulated(_norms(head_kernels(model, b, opts, ce_fusion=ce_fusion), model, opts), model,
                      head_params(model, opts.tp), grad_fusion, grad_bytes)
    return piece_seconds(pk, model.dtype, profile_of(family, kernels))


@lru_cache(maxsize=4096)
def embedding_seconds(model: ModelConfig, b: int, opts: LayerOptions, family: str,
                      kernels: KernelFigures | None = None, grad_fusion: bool = True,
                      grad_bytes: int = 0) -> PieceSeconds:
    pk = _accumulated(embedding_kernels(model, b, opts), model, embedding_params(model, opts.tp), grad_fusion,
                      grad_bytes)
    return piece_seconds(pk, model.dtype, profile_of(family, kernels))


@lru_cache(maxsize=4096)
def mtp_seconds(model: ModelConfig, b: int, opts: LayerOptions, family: str, kernels: KernelFigures | None = None,
                grad_fusion: bool = True, grad_bytes: int = 0, holds_embedding: bool = False) -> PieceSeconds:
    """One multi-token-prediction module's own kernels (pipesim.model.piece_kernels.mtp_kernels), its gradients with
    the embedding copy's unless `holds_embedding` (the stage holds the first stage's embedding, or an earlier module
    carried the copy); its block and its pass through the head are `layer_seconds` and `head_seconds`."""
    params = mtp_projection_params(model, opts.tp) + mtp_embedding_params(model, opts.tp,
                                                                          holds_embedding=holds_embedding)
    pk = _accumulated(_norms(mtp_kernels(model, b, opts), model, opts), model, params, grad_fusion, grad_bytes)
    return piece_seconds(pk, model.dtype, profile_of(family, kernels))


@lru_cache(maxsize=4096)
def mlp_layer_seconds(b: int, hidden: int, dtype: str, dtype_bytes: int, tp: int, input_grad: bool,
                      family: str, kernels: KernelFigures | None = None) -> PieceSeconds:
    return piece_seconds(mlp_layer_kernels(b, hidden, dtype_bytes, tp, input_grad=input_grad), dtype,
                         profile_of(family, kernels))


def overlap_gemm(overlaps: str) -> str | None:
    """The GEMM name a collective's `overlaps` text (e.g. "W: QKV weight-gradient GEMM") hides behind, or None."""
    if not overlaps or ":" not in overlaps:
        return None
    words = overlaps.split(":", 1)[1].split()
    if len(words) < 3 or words[-1] != "GEMM" or words[-2] not in GRADIENT_SUFFIX:
        return None
    linear = LINEAR_NAMES.get(" ".join(words[:-2]))
    return f"{linear} {GRADIENT_SUFFIX[words[-2]]}" if linear else None


@dataclass(frozen=True)
class StageSeconds:
    """A stage's kernel seconds per microbatch (F, I, W) and the seconds of its named GEMMs (one piece's)."""

    F: float
    I: float  # noqa: E741 (the action's name in the IR)
    W: float
    gemms: dict[str, float]  # GEMM or attention kernel name -> seconds (a layer's, the head's)
    shapes: dict[str, Gemm] = field(default_factory=dict)  # GEMM name -> its shape (pipesim.comm.overlap_interference)
    beside: tuple[float, float, float] = (0.0, 0.0, 0.0)  # F, I, W beside an NCCL collective (PieceSeconds.beside)

    def phases(self) -> tuple[float, float, float]:
        """F's, I's and W's seconds, in that order."""
        return self.F, self.I, self.W

    def plus(self, other: StageSeconds) -> StageSeconds:
        """This part of a stage and `other` (its bf16 layers under --first-last-layers-bf16) together: seconds summed;
        a GEMM named in both keeps this part's seconds and shape (each part's collectives hide behind its own)."""
        beside = tuple(a + b for a, b in zip(self.beside, other.beside, strict=True))
        return StageSeconds(self.F + other.F, self.I + other.I, self.W + other.W, gemms={**other.gemms, **self.gemms},
                            shapes={**other.shapes, **self.shapes}, beside=(beside[0], beside[1], beside[2]))


def gpt_stage_seconds(model: ModelConfig, b: int, mix: StageLayers, opts: LayerOptions, *, first: bool, last: bool,
                      fused: bool, family: str, kernels: KernelFigures | None = None,
                      grad_fusion: bool = True, grad_bytes: int = 0, ce_fusion: str = "unfused") -> StageSeconds:
    """Embedding (first stage), the stage's layers `mix` (each kind timed once under its own options,
    pipesim.model.layer_kinds), head + cross-entropy and the multi-token-prediction modules (last stage); each piece's
    gradients added into main_grad in its W, inside the wgrad GEMMs when `grad_fusion`."""
    total = [0.0, 0.0, 0.0]
    beside = [0.0, 0.0, 0.0]
    gemms: dict[str, float] = {}
    shapes: dict[str, Gemm] = {}
    pieces = []
    if first:
        pieces.append((embedding_seconds(model, b, opts, family, kernels, grad_fusion, grad_bytes), 1))
    for kind, count in mix:
        pieces.append((layer_seconds(model, b, kind_options(model, opts, kind), fused, family, kernels, grad_fusion,
                                     grad_bytes, moe=kind.moe), count))
    if last:
        pieces.append((head_seconds(model, b, opts, family, kernels, grad_fusion, grad_bytes, ce_fusion), 1))
    for k in range(model.mtp_layers if last else 0):  # each module: its own kernels, a block, the head again
        moe = is_moe_layer(model, model.layers + k)
        pieces += [(mtp_seconds(model, b, opts, family, kernels, grad_fusion, grad_bytes, first or k > 0), 1),
                   (layer_seconds(model, b, opts, fused, family, kernels, grad_fusion, grad_bytes, moe=moe), 1),
                   (head_seconds(model, b, opts, family, kernels, grad_fusion, grad_bytes, ce_fusion), 1)]
    for piece, count in pieces:
        for slot, value in enumerate(piece.scaled(count)):
            total[slot] += value
            beside[slot] += piece.beside[slot] * count
        gemms.update(piece.gemms)
        shapes.update(piece.shapes)
    update = fp8_update_seconds(model, b, opts, family, mix, kernels)  # F and the backward (I)
    for slot in (0, 1) if update else ():
        total[slot] += update
        beside[slot] += update
    return StageSeconds(*total, gemms=gemms, shapes=shapes, beside=(beside[0], beside[1], beside[2]))


def mlp_stage_seconds(model: ModelConfig, b: int, layers: int, tp: int, *, first: bool, family: str,
                      kernels: KernelFigures | None = None) -> StageSeconds:
    """`layers` MLP layers; on the first stage the first layer computes no input gradient."""
    total = [0.0, 0.0, 0.0]
    beside = [0.0, 0.0, 0.0]
    for n in range(layers):
        piece = mlp_layer_seconds(b, model.hidden, model.dtype, model.dtype_bytes, tp, not (first and n == 0), family,
                                  kernels)
        for slot, value in enumerate(piece.scaled(1)):
            total[slot] += value
            beside[slot] += piece.beside[slot]
    return StageSeconds(*total, gemms={}, beside=(beside[0], beside[1], beside[2]))


__all__ = ["PieceSeconds", "StageSeconds", "fp8_layer", "fp8_update_seconds", "gpt_stage_seconds", "kernel_seconds",
           "layer_profiles", "mlp_stage_seconds", "mtp_seconds", "overlap_gemm", "piece_seconds"]
