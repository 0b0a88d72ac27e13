"""A layer's kernels under FP8: which GEMMs run in FP8, and the casts Transformer Engine adds around them.

TE runs the linear layers' three GEMMs in FP8: forward (fprop), input gradient (dgrad) and weight gradient
(wgrad) of QKV, the attention projection, the MLP's FC1 and FC2, the experts' grouped FC1 and FC2 and the shared
experts' (Megatron-core's TE spec: TELayerNormColumnParallelLinear, TERowParallelLinear, TEGroupedMLP), and latent
attention's linears. Everything else stays in the model's dtype: flash attention (TE's default DotProductAttention
is not FP8 unless --fp8-dot-product-attention), norms, softmax, the activations, the embedding, the router (a torch
linear) and the LM head (Megatron's output_layer is a tensor_parallel.ColumnParallelLinear, not a TE module:
megatron/core/models/gpt/gpt_model.py @ core_v0.15.0). Each FP8 GEMM reads one-byte operands and writes its
output in the model's dtype (bf16).

Per FP8 linear, per microbatch, the casts are memory-bound kernels (pipesim.model.fp8 gives their bytes):
- F: the input X cast to FP8 (read d, write FP8: with a transposed copy for the wgrad on a TN-only device, TE's
  fused cast-transpose); tensorwise first reads X once more for its amax. Under sequence parallelism the
  column-parallel linears' input (QKV, FC1, shared FC1) is cast on the rank's shard before the all-gather
  (TE's Linear: `with_input_all_gather_nccl`), and a per-tensor recipe casts it row-wise only (its all-gather
  takes no column-wise data), so W transposes the gathered copy (read 1, write 1 byte per element).
- I: the output gradient dY cast to FP8 for dgrad and wgrad alike (cast-transpose again).
- W: nothing more (the wgrad reads the saved FP8 input and the FP8 dY), except the attention projection's under every
  recipe but delayed scaling: it keeps its bf16 input (`Fp8Options.keeps_projection_input`), so F casts it row-wise
  only and W casts it column-wise (and, per tensor, reads it once more for the amax).
NVFP4 (`--fp4-format e2m1`) runs the same GEMMs as float4 and, per input and output gradient, an amax pass (the
row-wise amax and the Hadamard-transformed column-wise one) before a cast writing both directions.
The weights' casts are once per step, not per microbatch (TE caches them: `is_first_microbatch`, which
Megatron-core's schedules.py sets), so they are not here: `fp8_weight_params` counts what they cast.
"""

from __future__ import annotations

from dataclasses import replace

from pipesim.device.fp8_rates import FP8, QUANTIZED
from pipesim.model.fp8 import FP8_GATHER_RECIPES, Fp8Options, cast_write_bytes
from pipesim.model.kernel_types import Gemm, Kernel, MemoryBound, PieceKernels

FP8_LINEARS = frozenset({"QKV", "projection", "FC1", "FC2", "expert FC1", "expert FC2", "shared FC1",
                         "shared FC2", "Q", "Q down", "Q up", "KV down", "KV up",
                         # torchtitan's per-op checkpointing re-runs wk, wo and w3 (pipesim.model.op_recompute)
                         "K (recompute)", "projection (recompute)", "FC1 up half (recompute)",
                         # a hybrid model's Mamba mixer: TE's linears (pipesim.model.mamba_mixer); its scan stays in
                         # the dtype
                         "in_proj", "out_proj"})
GATHERED = frozenset({"QKV", "FC1", "shared FC1", "in_proj"})  # column-parallel linears whose input sp all-gathers


def _linear(name: str, suffix: str = "") -> str | None:
    """The FP8 linear a GEMM name belongs to ("FC1 dgrad" -> "FC1"), or None."""
    base = name.removesuffix(suffix) if suffix else name
    if suffix and base == name:
        return None
    return base if base in FP8_LINEARS else None


def _casts(what: str, elements: int, fp8: Fp8Options, d: int, *, tn_only: bool, transposed: bool) -> list[Kernel]:
    """The amax pass (tensorwise; torchao's rowwise, per row; nvfp4's, with the Hadamard-transformed copy's) and the
    cast of one bf16 tensor of `elements` to FP8 (NVFP4)."""
    out: list[Kernel] = []
    if fp8.global_amax:
        out.append(MemoryBound(f"{what} amax", d * elements))
    out.append(MemoryBound(f"{what} cast", d * elements + cast_write_bytes(elements, fp8, tn_only=tn_only,
                                                                           transposed=transposed)))
    return out


def fp8_layer_kernels(kernels: PieceKernels, fp8: Fp8Options, *, dtype_bytes: int, tn_only: bool, tp: int = 1,
                      sp: bool = False, compiled: bool = False) -> PieceKernels:
    """`kernels` (a layer's, pipesim.model.layer_kernels) with its linears' GEMMs in FP8 (output written in the
    model's dtype: c_bytes d unless an accumulating epilogue says otherwise) and the casts before them. `compiled`:
    torch.compile's fused kernels (torchao's casts are then Inductor's)."""
    if fp8.impl == "torchao":
        return torchao_layer_kernels(kernels, fp8, dtype_bytes=dtype_bytes, gathered_shard=tp if sp else 1,
                                     compiled=compiled)
    d = dtype_bytes
    gathered = sp and tp > 1

    def casts(k: Gemm) -> list[Kernel] | None:
        elements = k.batch * k.m * k.k  # X: tokens x inputs (all-gathered under sp); dgrad: dY, tokens x outputs
        if (name := _linear(k.name)) is not None:
            shard = gathered and name in GATHERED
            kept = name == "projection" and fp8.keeps_projection_input  # its wgrad casts the bf16 input again
            return _casts(f"{name} input", elements // tp if shard else elements, fp8, d, tn_only=tn_only,
                          transposed=(not shard or fp8.block_scaled) and not kept)
        if (name := _linear(k.name, " dgrad")) is not None:
            return _casts(f"{name} output gradient", elements, fp8, d, tn_only=tn_only, transposed=True)
        if (name := _linear(k.name, " wgrad")) is not None:
            if name == "projection" and fp8.keeps_projection_input:  # the kept bf16 input's column-wise copy alone
                return _casts("projection input (column-wise)", elements, fp8, d, tn_only=False, transposed=False)
            if gathered and name in GATHERED and tn_only and not fp8.block_scaled:
                return [MemoryBound(f"{name} input transpose", 2 * elements)]  # read 1, write 1 per element
            return []
        return None

    return _in_fp8(kernels, casts, d, fp8.gemm_dtype)


def torchao_layer_kernels(kernels: PieceKernels, fp8: Fp8Options, *, dtype_bytes: int,
                          gathered_shard: int = 1, compiled: bool = False) -> PieceKernels:
    """`kernels` with its linears' GEMMs in FP8 as torchao's Float8Linear runs them (`matmul_with_hp_or_float8_args`,
    torchao/float8/float8_linear.py): every operand cast at its use, row-wise, nothing cached. Forward: the input and
    the weight; dgrad: the output gradient and the weight; wgrad: the output gradient again and the input, saved in
    the dtype, again. Each tensorwise cast reads its tensor once for the amax first. Under DTensor's sequence
    parallelism the column-parallel inputs are cast on the rank's shard before the gather (`gathered_shard`: tp).
    `compiled` with tensorwise or rowwise scaling: torch.compile's casts instead (`compiled_tensorwise_kernels`,
    `compiled_rowwise_kernels`). Only tensorwise gathers in FP8: a rowwise input is gathered in the dtype and cast
    whole."""
    if fp8.recipe not in FP8_GATHER_RECIPES:
        gathered_shard = 1
    if compiled and fp8.recipe == "tensorwise":
        return compiled_tensorwise_kernels(kernels, fp8, dtype_bytes=dtype_bytes, gathered_shard=gathered_shard)
    if compiled and fp8.recipe == "rowwise":
        return compiled_rowwise_kernels(kernels, dtype_bytes=dtype_bytes)
    d = dtype_bytes

    def cast(what: str, elements: int) -> list[Kernel]:
        return _casts(what, elements, fp8, d, tn_only=False, transposed=False)

    def weight_cast(name: str, k: Gemm) -> list[Kernel]:
        """The weight operand (in x out; dgrad: out x in; per expert) cast at its use, unless FSDP2 gathered it in
        FP8 (`fp8.gathered`: torchao casts each shard before the gather, once per gather, 1/dp of this; not counted)."""
        return [] if fp8.gathered else cast(f"{name} weight", k.batch * k.n * k.k)

    def casts(k: Gemm) -> list[Kernel] | None:
        tokens = k.batch * k.m * k.k  # its activation operand: tokens x in (dgrad: tokens x out)
        if (name := _linear(k.name)) is not None:
            shard = gathered_shard if name in GATHERED else 1
            return cast(f"{name} input", tokens // shard) + weight_cast(name, k)
        if (name := _linear(k.name, " dgrad")) is not None:
            return cast(f"{name} output gradient", tokens) + weight_cast(name, k)
        if (name := _linear(k.name, " wgrad")) is not None:  # dW (in x out) = X^T dY, k = tokens
            return cast(f"{name} output gradient (wgrad)", k.batch * k.k * k.n) + \
                cast(f"{name} input (wgrad)", k.batch * k.k * k.m)
        return None

    return _in_fp8(kernels, casts, d)


def _in_fp8(kernels: PieceKernels, casts, d: int, gemm_dtype: str = FP8) -> PieceKernels:
    """`kernels` with each GEMM for which `casts(gemm)` gives a list (its casts, run before it) in FP8 (`gemm_dtype`:
    float4 under NVFP4), writing its output in the dtype (`d` bytes); a GEMM it gives None for stays as it is."""

    def phase(ks: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
        out: list[Kernel] = []
        for k in ks:
            before = casts(k) if isinstance(k, Gemm) else None
            if before is None:
                out.append(k)
                continue
            out += [*before, replace(k, dtype=gemm_dtype, c_bytes=k.c_bytes or d)]
        return tuple(out)

    return PieceKernels(phase(kernels.F), phase(kernels.I), phase(kernels.W))


def compiled_tensorwise_kernels(kernels: PieceKernels, fp8: Fp8Options, *, dtype_bytes: int,
                                gathered_shard: int = 1) -> PieceKernels:
    """torchao's tensorwise Float8Linear under torch.compile: one scale per tensor, so Inductor casts each activation
    and output gradient once, in one kernel that writes both the row-major copy its first GEMM reads and the
    column-major one the wgrad reads (saved from the forward), after one amax pass; the weight is read for its amax
    once in the forward and cast in the forward and again in the backward with the saved scale. Bytes per tensor of
    n elements: activation and output gradient 2n (amax) + 2n + 2n (cast), weight 2n + 3n + 3n: torchao's own model
    of the compiled recipe (torchao/testing/training/roofline_utils.py @ 36027d8, `get_tensor_memory_traffic_ovhd_s`
    without fusion into the producer; 'write twice in float8 (row-major and col-major)' @ eab345c). A column-parallel
    input gathered over tp in FP8 (`gathered_shard`) is cast on the shard in its row-major layout and the gathered
    copy transposed for the wgrad (read 1, write 1 byte per element)."""
    d = dtype_bytes

    def amax(what: str, n: int) -> MemoryBound:
        return MemoryBound(f"{what} amax", d * n)

    def weight(name: str, k: Gemm, *, first: bool) -> list[Kernel]:
        if fp8.gathered:  # FSDP2 gathered it in FP8: cast on the shard before the gather (not counted)
            return []
        n = k.batch * k.n * k.k
        return ([amax(f"{name} weight", n)] if first else []) + [MemoryBound(f"{name} weight cast", (d + 1) * n)]

    def casts(k: Gemm) -> list[Kernel] | None:
        n = k.batch * k.m * k.k  # its activation operand: tokens x in (dgrad: tokens x out)
        if (name := _linear(k.name)) is not None:
            shard = gathered_shard if name in GATHERED else 1
            if shard > 1:
                x = [amax(f"{name} input", n // shard), MemoryBound(f"{name} input cast", (d + 1) * n // shard),
                     MemoryBound(f"{name} input transpose", 2 * n)]
            else:
                x = [amax(f"{name} input", n), MemoryBound(f"{name} input cast (both layouts)", (d + 2) * n)]
            return x + weight(name, k, first=True)
        if (name := _linear(k.name, " dgrad")) is not None:
            dy = [amax(f"{name} output gradient", n),
                  MemoryBound(f"{name} output gradient cast (both layouts)", (d + 2) * n)]
            return dy + weight(name, k, first=False)
        return [] if _linear(k.name, " wgrad") is not None else None  # the wgrad reads the saved FP8 copies

    return _in_fp8(kernels, casts, d)


def compiled_rowwise_kernels(kernels: PieceKernels, *, dtype_bytes: int) -> PieceKernels:
    """torchao's rowwise Float8Linear under torch.compile: a scale per row along each GEMM's reduction, so a tensor
    read along its other axis (the input and output gradient in the wgrad, the weight in the dgrad) needs a cast of
    its own from a transposed copy in the dtype. torchao's model of the compiled recipe (torchao/testing/training/
    roofline_utils.py @ 36027d8, `get_tensor_memory_traffic_ovhd_s`, 'rowwise', no fusion into the producer): an
    activation or output gradient of n elements is cast row-wise while a transposed copy in the dtype is written
    (read d n, write n + d n), and that copy cast again for the wgrad (read d n, write n); the weight is cast
    row-wise for the forward (read d n, write n), transposed in the dtype for the dgrad (read d n, write d n) and
    cast again (read d n, write n). Per linear of M tokens, K in and N out at 2 bytes: 8 MK + 8 MN + 10 KN; the
    GEMMs at the family's FP8 rate, as torchao's roofline times them."""
    d = dtype_bytes

    def casts(k: Gemm) -> list[Kernel] | None:
        if (name := _linear(k.name)) is not None:
            x, w = k.batch * k.m * k.k, k.batch * k.n * k.k
            return [MemoryBound(f"{name} input cast (row-wise, transposed copy)", (2 * d + 1) * x),
                    MemoryBound(f"{name} weight cast (row-wise)", (d + 1) * w)]
        if (name := _linear(k.name, " dgrad")) is not None:
            dy, w = k.batch * k.m * k.k, k.batch * k.n * k.k
            return [MemoryBound(f"{name} output gradient cast (row-wise, transposed copy)", (2 * d + 1) * dy),
                    MemoryBound(f"{name} weight transpose", 2 * d * w),
                    MemoryBound(f"{name} weight cast (column-wise)", (d + 1) * w)]
        if (name := _linear(k.name, " wgrad")) is not None:  # dW (in x out) = X^T dY, k = tokens
            return [MemoryBound(f"{name} output gradient cast (column-wise)", (d + 1) * k.batch * k.k * k.n),
                    MemoryBound(f"{name} input cast (column-wise)", (d + 1) * k.batch * k.k * k.m)]
        return None

    return _in_fp8(kernels, casts, d)


def fp8_weight_params(kernels: PieceKernels) -> tuple[int, int]:
    """(parameters, weights) of the piece's FP8 linears, read off its FP8 wgrad GEMMs (k x n each, per expert)."""
    params = weights = 0
    for k in kernels.W:
        if isinstance(k, Gemm) and k.dtype in QUANTIZED:
            params += k.batch * k.m * k.n
            weights += 1
    return params, weights


def fp8_expert_params(kernels: PieceKernels) -> int:
    """Of `fp8_weight_params`' parameters, the routed experts' (their grouped FC1 and FC2, the local experts'), which
    the distributed optimizer shards and gathers over the expert-data-parallel group instead of dp."""
    return sum(k.batch * k.m * k.n for k in kernels.W
               if isinstance(k, Gemm) and k.dtype in QUANTIZED and k.name.startswith("expert "))


def scale_update_bytes(kernels: PieceKernels) -> int:
    """Bytes of delayed scaling's amax-history and scale update for the piece's FP8 tensors (input, weight and
    output gradient of each FP8 linear): the amax history (Megatron's --fp8-amax-history-len 1), the scale and
    its inverse, float32 each, read and written: 24 bytes per tensor. One fused kernel per forward and backward
    pass (TE's fused_amax_and_scale_update_after_reduction, run when Megatron's fp8 autocast around the whole
    block exits)."""
    return 3 * 24 * fp8_weight_params(kernels)[1]


__all__ = ["FP8", "FP8_LINEARS", "GATHERED", "compiled_rowwise_kernels", "compiled_tensorwise_kernels",
           "fp8_expert_params", "fp8_layer_kernels", "fp8_weight_params", "scale_update_bytes", "torchao_layer_kernels"]
