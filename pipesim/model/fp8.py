"""FP8 training as Megatron-core runs it through Transformer Engine: which tensors are FP8 and their bytes.

`--fp8-format {e4m3,hybrid}` turns FP8 on (hybrid: E4M3 forward, E5M2 gradients, TE's default) and
`--fp8-recipe {delayed,tensorwise,blockwise,mxfp8}` picks the scaling (Megatron-core core_v0.15.0,
megatron/training/arguments.py `_add_transformer_engine_args`; megatron/core/fp8_utils.py maps them onto TE's
DelayedScaling, Float8CurrentScaling, Float8BlockScaling and MXFP8BlockScaling). The model's parameters stay
in its dtype (bfloat16): TE keeps an FP8 copy of each linear weight beside them. Both FP8 formats are one byte
per element, so the format changes no time or memory here; the recipe does:

- delayed / tensorwise: one float32 scale per tensor; the cast computes the amax as it writes (delayed), or a
  separate amax pass over the input comes first (tensorwise: "current" scaling, TE's
  Float8CurrentScalingQuantizer: nvte_compute_amax, then nvte_quantize, transformer_engine/pytorch/csrc/
  quantizer.cpp @ v2.8).
- blockwise (DeepSeek-V3's): activations and gradients in 1 x 128 blocks, weights in 128 x 128 blocks, a float32
  scale per block (TE recipe Float8BlockScaling: x/grad_block_scaling_dim 1, w 2); blocks have a direction,
  so a tensor is quantised row-wise and column-wise: two FP8 copies and their scales.
- mxfp8 (Blackwell): 1 x 32 blocks with an E8M0 (one byte) scale, also in both directions.
- nvfp4 (Blackwell; Megatron-core's `--fp4-format e2m1 --fp4-recipe nvfp4`, TE's NVFP4BlockScaling,
  transformer_engine/common/recipe/__init__.py @ d0067d0da): E2M1 elements, half a byte each, in 1 x 16 blocks with
  an E4M3 (one byte) scale, plus one float32 scale per tensor, so every cast first finds the tensor's amax (a
  pass of its own, like current scaling); weights in 16 x 16 blocks; activations and gradients in both directions,
  the column-wise copy (the wgrad's operand) after a 16 x 16 random Hadamard transform, gradients stochastically
  rounded. TE's NVFP4Quantizer runs this as two kernels per tensor (transformer_engine/pytorch/csrc/quantizer.cpp
  @ d0067d0da: nvte_hadamard_transform_amax, one read for the row-wise amax and the transformed column-wise one,
  then nvte_quantize_with_hadamard_transform, one read writing both copies); weights' one amax pass and one cast.

Per-tensor (delayed / tensorwise) FP8 on Hopper has only TN GEMMs (TE's `nvte_is_non_tn_fp8_gemm_supported` is
false below sm_100): the dgrad and wgrad GEMMs need transposed FP8 copies, which TE's cast writes in the same
kernel (cast-transpose). Blackwell runs any layout, so one copy does (quantizer.cpp: `with_transpose =
columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported()`). That is the device's fact (`tn_only`), given by
pipesim.device.fp8_rates. Byte formulas: docs/cost_model.md, "FP8".

`--fp8-impl torchao` (torchtitan's float8 converter, its profile's) runs the same GEMMs through torchao's
Float8Linear instead (torchao/float8/float8_linear.py `matmul_with_hp_or_float8_args`): it keeps no FP8 weight copy
across microbatches (the weight is cast at each use, forward and dgrad), saves the linear's input in the dtype and
casts it again for the wgrad, and casts the output gradient once for the dgrad and once for the wgrad; each
tensorwise cast reads its tensor once more for the amax first (pipesim.model.fp8_kernels); under torch.compile
each tensorwise tensor is cast once for all its uses. Its recipes are
tensorwise, rowwise (a scale per row of each operand, along the GEMM's reduction: torchao's Float8LinearConfig
'rowwise', torchtitan's default float8 recipe; Transformer Engine has no such recipe) and, through the MX converter,
mxfp8.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.device.fp8_rates import FP4, FP4_RECIPES, FP8
from pipesim.errors import PipesimError

FP8_FORMATS = ("e4m3", "hybrid")  # Megatron-core's --fp8-format choices
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8", "rowwise")  # Megatron-core's choices, torchao's
FP4_FORMATS = ("e2m1",)  # Megatron-core's --fp4-format choices (transformer_config.py fp4)
# FP4_RECIPES: Megatron-core's --fp4-recipe choices, nvfp4 (its "custom" takes a user's quantizer: not timed),
# owned by pipesim.device.fp8_rates, whose figures give their GEMMs the FP4 tensor cores' peak
DEFAULT_RECIPE = "delayed"  # Megatron-core's --fp8-recipe default
FP8_IMPLS = ("te", "torchao")  # Transformer Engine's modules (Megatron-core, NeMo) or torchao's Float8Linear
TORCHAO_RECIPES = ("tensorwise", "rowwise", "mxfp8")  # torchao's dynamic scalings; its MX converter
TORCHAO_ONLY = ("rowwise",)  # recipes Transformer Engine does not have
# torchao's float8 gathers (torchtitan's float8 all-gather with TP, apply_tp; FSDP2's enable_fsdp_float8_all_gather:
# torchao/float8/config.py @ 36027d8 'only supports tensorwise scaling granularity'): tensorwise scaling only
FP8_GATHER_RECIPES = ("tensorwise",)
FP8_BYTES = 1  # bytes per FP8 element (E4M3 and E5M2 alike)
BLOCK_SCALED = ("blockwise", "mxfp8", "nvfp4")  # recipes whose tensors carry both directions and a scale per block
# elements per byte of scales, per direction: blockwise 4 B (float32) per 1 x 128 block, mxfp8 1 B (E8M0) per 1 x 32
# block: 1/32 either way; nvfp4 1 B (E4M3) per 1 x 16 block
SCALE_DIVISOR = {"blockwise": 32, "mxfp8": 32, "nvfp4": 16}
# weights: float32 per 128 x 128 block; mxfp8: 1 x 32; nvfp4: E4M3 per 16 x 16 block
WEIGHT_SCALE_DIVISOR = {"blockwise": 4096, "mxfp8": 32, "nvfp4": 256}
# Transformer Engine's NVFP4 switches a run turns off by its environment (NVTE_NVFP4_DISABLE_RHT,
# NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING, NVTE_NVFP4_DISABLE_2D_QUANTIZATION: transformer_engine/common/recipe/
# __init__.py @ d0067d0da NVFP4BlockScaling reads them): pipesim's flag --nvfp4-disable takes these names
NVFP4_SWITCHES = ("rht", "stochastic-rounding", "2d-quantization")
NVFP4_DISABLE_FLAG = "--nvfp4-disable"


@dataclass(frozen=True)
class Fp8Options:
    """An FP8 run's format and recipe (Megatron-core's --fp8-format and --fp8-recipe), checked on construction."""

    format: str = "hybrid"  # "e4m3" (everything E4M3) or "hybrid" (E4M3 forward, E5M2 gradients)
    recipe: str = DEFAULT_RECIPE  # "delayed", "tensorwise", "blockwise", "mxfp8" or (torchao) "rowwise"
    impl: str = "te"  # "te" (Transformer Engine) or "torchao" (torchtitan's float8 converter)
    # torchao under FSDP2 with --fp8-param-gather (its enable_fsdp_float8_all_gather): the weights reach the linears
    # already cast, gathered in FP8. Set by pipesim.job.Job from the job's flags, never typed.
    gathered: bool = False
    # NVFP4's switches turned off (NVFP4_SWITCHES, sorted): 2d-quantization off quantizes weights in 1 x 16 blocks
    # both ways (their scales 16 times the bytes); rht and stochastic-rounding off change no byte pipesim counts
    nvfp4_disabled: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.format not in FP8_FORMATS + FP4_FORMATS:
            raise PipesimError(f"unknown --fp8-format {self.format!r}; choose {', '.join(FP8_FORMATS)}")
        if self.recipe not in FP8_RECIPES + FP4_RECIPES:
            raise PipesimError(f"unknown --fp8-recipe {self.recipe!r}; choose {', '.join(FP8_RECIPES)}")
        if (self.format in FP4_FORMATS) != (self.recipe in FP4_RECIPES):
            raise PipesimError(f"--fp4-recipe {self.recipe} goes with --fp4-format {FP4_FORMATS[0]}, an FP8 recipe "
                               f"with --fp8-format, got format {self.format}")
        if self.impl not in FP8_IMPLS:
            raise PipesimError(f"unknown --fp8-impl {self.impl!r}; choose {', '.join(FP8_IMPLS)}")
        if self.gathered and self.impl != "torchao":
            raise PipesimError("FP8 weights gathered by FSDP2 are torchao's (enable_fsdp_float8_all_gather)")
        if self.impl == "torchao" and self.recipe not in TORCHAO_RECIPES:
            raise PipesimError(f"--fp8-impl torchao has no {self.recipe} recipe (torchao's float8 training scales "
                               f"{' or '.join(TORCHAO_RECIPES)}): give --fp8-recipe tensorwise")
        if self.nvfp4_disabled:
            unknown = [x for x in self.nvfp4_disabled if x not in NVFP4_SWITCHES]
            if unknown:
                raise PipesimError(f"unknown {NVFP4_DISABLE_FLAG} {unknown[0]!r}; choose {', '.join(NVFP4_SWITCHES)}")
            if not self.fp4:
                raise PipesimError(f"{NVFP4_DISABLE_FLAG} turns off Transformer Engine's NVFP4 switches: it needs "
                                   "--fp4-format e2m1")
            object.__setattr__(self, "nvfp4_disabled", tuple(x for x in NVFP4_SWITCHES if x in self.nvfp4_disabled))
        if self.impl == "te" and self.recipe in TORCHAO_ONLY:
            raise PipesimError(f"--fp8-recipe {self.recipe} is torchao's (Transformer Engine has no such recipe): "
                               "give --fp8-impl torchao")

    @property
    def caches_weights(self) -> bool:
        """Transformer Engine keeps each weight's FP8 copy for the step; torchao casts it at each use."""
        return self.impl == "te"

    @property
    def block_scaled(self) -> bool:
        return self.recipe in BLOCK_SCALED

    @property
    def fp4(self) -> bool:
        """NVFP4: the linears' GEMMs on the FP4 tensor cores, half a byte per element."""
        return self.recipe in FP4_RECIPES

    @property
    def gemm_dtype(self) -> str:
        """The dtype the linears' GEMMs run in (its peak and operand bytes): float4 under NVFP4, else float8."""
        return FP4 if self.fp4 else FP8

    @property
    def global_amax(self) -> bool:
        """Each cast first reads its tensor for one amax: current per-tensor scaling, torchao's rowwise (per row)
        and NVFP4's second-level float32 scale."""
        return self.recipe in ("tensorwise", "rowwise", "nvfp4")

    @property
    def tensor_scaled(self) -> bool:
        """One scale spans the whole tensor (current per-tensor scaling; NVFP4's second-level float32 scale), so a
        tensor quantized shard by shard before its all-gather needs its amax reduced over the shards first."""
        return self.recipe in ("tensorwise", "nvfp4")

    @property
    def amax_bytes(self) -> int:
        """Bytes of one quantization's amax reduction: a float32; NVFP4's two, its row-wise and its column-wise amax
        in one coalesced all-reduce (transformer_engine/pytorch/csrc/quantizer.cpp @ d0067d0da,
        NVFP4Quantizer::quantize_impl `allreduce_coalesced`)."""
        return 8 if self.fp4 else 4

    @property
    def keeps_projection_input(self) -> bool:
        """The attention projection keeps its bf16 input (flash attention's output, which flash keeps anyway) for its
        wgrad and casts it column-wise in the backward, instead of saving an FP8 copy: Megatron-core sets TE's
        save_original_input on linear_proj under every TE recipe but delayed scaling (NVIDIA/Megatron-LM 781e765818,
        2025-08-19, core_v0.15.0 on, with TE >= 2.6; NVFP4 with TE >= 2.7: megatron/core/transformer/attention.py)."""
        return self.impl == "te" and self.recipe != "delayed"

    @property
    def param_gather_flag(self) -> str:
        """Megatron-core's flag that keeps these linears' parameters quantized and gathers them so."""
        return "--fp4-param-gather" if self.fp4 else "--fp8-param-gather"

    @property
    def weight_scale_divisor(self) -> int:
        """Weight elements per byte of block scales: the recipe's weight blocks, NVFP4's 1 x 16 ones without 2D
        quantization (NVTE_NVFP4_DISABLE_2D_QUANTIZATION: each direction scaled like an activation)."""
        if self.recipe == "nvfp4" and "2d-quantization" in self.nvfp4_disabled:
            return SCALE_DIVISOR["nvfp4"]
        return WEIGHT_SCALE_DIVISOR[self.recipe]

    def report(self) -> dict[str, object]:
        """The options as --json reports them: `flags()` as keys in their own words (fp8_format, fp4_recipe, ...)."""
        flags = self.flags(with_switches=False)
        out: dict[str, object] = {flag.removeprefix("--").replace("-", "_"): value
                                  for flag, value in zip(flags[::2], flags[1::2], strict=True)}
        if self.nvfp4_disabled:
            out[NVFP4_DISABLE_FLAG.removeprefix("--").replace("-", "_")] = list(self.nvfp4_disabled)
        return out

    def flags(self, *, with_switches: bool = True) -> list[str]:
        """The command-line flags that give these options (Megatron-core's spelling, and pipesim's)."""
        if self.fp4:
            switches = [NVFP4_DISABLE_FLAG, *self.nvfp4_disabled] if self.nvfp4_disabled and with_switches else []
            return ["--fp4-format", self.format, "--fp4-recipe", self.recipe, *switches]
        return ["--fp8-format", self.format, "--fp8-recipe", self.recipe] + \
            (["--fp8-impl", self.impl] if self.impl != "te" else [])


def data_bytes(elements: int, fp8: Fp8Options) -> int:
    """Bytes of `elements` quantized elements without their scales: one each in FP8, half of one in NVFP4."""
    return elements // 2 if fp8.fp4 else FP8_BYTES * elements


def saved_bytes(elements: int, fp8: Fp8Options) -> int:
    """Bytes of one FP8 tensor kept in one direction (what TE saves of a linear's input for its wgrad): one byte per
    element (NVFP4: half), plus its block scales (1/32 byte per element with blockwise or mxfp8, 1/16 with nvfp4)."""
    return data_bytes(elements, fp8) + (elements // SCALE_DIVISOR[fp8.recipe] if fp8.block_scaled else 0)


def cast_write_bytes(elements: int, fp8: Fp8Options, *, tn_only: bool, transposed: bool = True) -> int:
    """Bytes the cast of an activation or gradient writes: the row-wise FP8 copy, the column-wise (transposed) one
    where a GEMM needs it (`transposed`: some later GEMM reads it; per-tensor recipes write it only on a TN-only
    device, block-scaled ones always) and block scales for each copy."""
    if fp8.block_scaled:
        copies = 2 if transposed else 1
        return copies * saved_bytes(elements, fp8)
    return FP8_BYTES * elements * (2 if transposed and tn_only else 1)


def weight_copy_bytes(params: int, fp8: Fp8Options, *, tn_only: bool) -> int:
    """Bytes of the FP8 copies TE keeps of `params` linear weights for a step (its weight workspace, cached across
    the microbatches, `is_first_microbatch`): the weight and, for dgrad, its transpose on a TN-only device; both
    directions with block scales under blockwise (128 x 128 blocks, float32), mxfp8 (1 x 32, one byte) and nvfp4
    (half a byte per element, 16 x 16 blocks of one byte: TE writes the transpose beside the row-wise copy)."""
    if fp8.block_scaled:
        return 2 * (data_bytes(params, fp8) + params // fp8.weight_scale_divisor)
    return FP8_BYTES * params * (2 if tn_only else 1)


def check_fp8_model(fp8: Fp8Options | None, dtype: str, kind: str) -> None:
    """PipesimError unless FP8 suits the model: a transformer (its linear layers run in FP8) with 16-bit
    parameters (TE's FP8 autocast keeps the parameters and the rest of the layer in bf16 or fp16)."""
    if fp8 is None:
        return
    flag = fp8.flags()[0]  # --fp8-format, or --fp4-format under NVFP4
    if kind != "gpt":
        raise PipesimError(f"{flag} needs a transformer (--model gpt or --model-config), not --model mlp")
    if dtype not in ("bfloat16", "float16"):
        raise PipesimError(f"{flag} needs 16-bit parameters (--dtype bfloat16), got {dtype}")


__all__ = ["BLOCK_SCALED", "DEFAULT_RECIPE", "FP4_FORMATS", "FP4_RECIPES", "FP8_BYTES", "FP8_FORMATS",
           "FP8_GATHER_RECIPES", "FP8_IMPLS", "FP8_RECIPES", "NVFP4_DISABLE_FLAG", "NVFP4_SWITCHES", "Fp8Options",
           "TORCHAO_ONLY", "TORCHAO_RECIPES", "cast_write_bytes", "check_fp8_model", "data_bytes", "saved_bytes",
           "weight_copy_bytes"]
