"""The GPU kernel and precision flags simulate, sweep and plan share (Megatron-core's spellings): context
parallelism's exchange, Transformer Engine's userbuffers, FP8, the main gradients' dtype and the fused cross-entropy,
each with the function that reads it."""

from __future__ import annotations

import argparse

from pipesim.comm.ub_overlap import UbConfig
from pipesim.device.fp8_rates import check_fp8_recipe
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.model.adam_states import MASTER_DTYPES, MOMENT_DTYPES, AdamStates
from pipesim.model.config import ModelConfig
from pipesim.model.cuda_graphs import CUDA_GRAPH_IMPLS, CUDA_GRAPH_SCOPES, CudaGraphs
from pipesim.model.fp8 import (
    DEFAULT_RECIPE,
    FP4_FORMATS,
    FP4_RECIPES,
    FP8_FORMATS,
    FP8_IMPLS,
    FP8_RECIPES,
    NVFP4_DISABLE_FLAG,
    NVFP4_SWITCHES,
    Fp8Options,
    check_fp8_model,
)
from pipesim.model.fsdp import FSDP_RESHARD
from pipesim.model.layer_precision import END_FLAG, FIRST_LAST_FLAG, START_FLAG, Bf16Layers
from pipesim.model.muon_options import OPTIMIZERS, MuonOptions, check_muon_framework, muon_options
from pipesim.model.options import ACT_FP8_STORE_FLAG, CP_COMM_TYPES, TRANSFORMER_IMPLS
from pipesim.model.piece_kernels import CE_IMPLS


def add_cp_comm_arg(group) -> None:
    """--cp-comm-type: how context parallelism moves K/V (simulate, sweep, plan), Megatron-core's flag."""
    group.add_argument("--cp-comm-type", choices=CP_COMM_TYPES, default=None,
                       help="with --cp: p2p, ring attention (K/V blocks passed round under the attention); all_gather, "
                            "K/V all-gathered before the attention and dK/dV reduce-scattered after it, blocking "
                            "(Llama 3's context parallelism); a2a, DeepSpeed-Ulysses' all-to-alls to head shards "
                            "and back (default --framework's: all_gather with torchtitan, else p2p)")


def add_ub_args(group) -> None:
    """--tp-comm-overlap / --tp-comm-overlap-cfg: Transformer Engine's userbuffers (simulate, sweep, plan)."""
    group.add_argument("--tp-comm-overlap", action="store_true", dest="tp_comm_overlap_ub",
                       help="GPU presets, tp > 1 with --sequence-parallel: each dense linear's all-gather and "
                            "reduce-scatter inside its own GEMM by Transformer Engine's userbuffers (ring exchange, "
                            "pipelined or bulk overlap, TE's defaults; pipesim.comm.ub_overlap), Megatron-core's flag")
    group.add_argument("--tp-comm-overlap-cfg", metavar="FILE", default=None,
                       help="with --tp-comm-overlap: Megatron-core's YAML of userbuffers settings per GEMM (method, "
                            "num_sm, num_splits, set_sm_margin, ...), as NeMo's tp_comm_overlap_cfg")


def ub_from_args(args: argparse.Namespace) -> UbConfig | None:
    """The userbuffers config of --tp-comm-overlap (None without it)."""
    cfg = getattr(args, "tp_comm_overlap_cfg", None)
    if not getattr(args, "tp_comm_overlap_ub", False):
        if cfg is not None:
            raise PipesimError("--tp-comm-overlap-cfg needs --tp-comm-overlap")
        return None
    return UbConfig.from_yaml(cfg) if cfg is not None else UbConfig()


def add_fp8_args(group) -> None:
    """--fp8-format / --fp8-recipe: FP8 linear layers through Transformer Engine (simulate, sweep, plan), in
    Megatron-core's spelling (megatron/training/arguments.py @ core_v0.15.0); `fp8_from_args` makes Fp8Options."""
    group.add_argument("--fp8-format", choices=FP8_FORMATS, default=None,
                       help="GPU presets: the linear layers' GEMMs in FP8 (hybrid: E4M3 forward, E5M2 gradients, "
                            "TE's training default; e4m3: both E4M3), parameters staying in --dtype; attention, "
                            "norms, the embedding and the output head stay bf16 (default off)")
    group.add_argument("--fp8-recipe", choices=FP8_RECIPES, default=None,
                       help=f"with --fp8-format: the scaling, Megatron-core's names (delayed, tensorwise: current "
                            f"per-tensor; blockwise: 1x128 / 128x128 blocks; mxfp8: Blackwell only; torchao's rowwise: "
                            f"a scale per row, --fp8-impl torchao only) "
                            f"(default {DEFAULT_RECIPE}; tensorwise with --fp8-impl torchao)")
    group.add_argument("--fp8-impl", choices=FP8_IMPLS, default=None,
                       help="with --fp8-format: te, Transformer Engine's modules (weights' FP8 copies cached for the "
                            "step, inputs saved in FP8); torchao, torchao's Float8Linear (weights cast at each use, "
                            "inputs saved in the dtype and cast again for the wgrad; with --compile each tensorwise "
                            "tensor cast once for all its uses) (default --framework's: torchao with torchtitan, "
                            "else te)")
    group.add_argument("--fp4-format", choices=FP4_FORMATS, default=None,
                       help="Blackwell presets: the linear layers' GEMMs in FP4 (E2M1) on the FP4 tensor cores, "
                            "through Transformer Engine, instead of FP8; the rest as --fp8-format (Megatron-core's "
                            "flag; not with --fp8-format)")
    group.add_argument("--fp4-recipe", choices=FP4_RECIPES, default=None,
                       help="with --fp4-format: nvfp4, TE's NVFP4BlockScaling (1x16 blocks with E4M3 scales and a "
                            "float32 scale per tensor, 16x16 blocks for weights, random Hadamard transforms on the "
                            "wgrad operands) (default nvfp4)")
    group.add_argument("--fp4-param-gather", action="store_true",
                       help="with --fp4-format and the distributed optimizer (--zero 1 or 2): the NVFP4 linears' "
                            "parameters kept in NVFP4 and all-gathered as packed NVFP4 bytes (Megatron-core's flag)")
    group.add_argument(NVFP4_DISABLE_FLAG, nargs="+", choices=NVFP4_SWITCHES, default=None, dest="nvfp4_disable",
                       metavar="SWITCH",
                       help=f"with --fp4-format: Transformer Engine's NVFP4 switches the run turns off by its "
                            f"environment (NVTE_NVFP4_DISABLE_RHT, _STOCHASTIC_ROUNDING, _2D_QUANTIZATION): "
                            f"{', '.join(NVFP4_SWITCHES)}; 2d-quantization scales the weights in 1 x 16 blocks both "
                            f"ways, the other two change no byte pipesim counts (docs/cost_model.md)")
    group.add_argument(FIRST_LAST_FLAG, action="store_true", dest="first_last_layers_bf16",
                       help="with --fp8-format or --fp4-format (not delayed scaling): the model's first and last "
                            "layers outside the FP8 autocast, their linears, saved inputs and parameters in bf16 "
                            "(Megatron-core's flag; docs/large_models.md)")
    group.add_argument(START_FLAG, type=int, default=None, dest="bf16_start", metavar="N",
                       help=f"with {FIRST_LAST_FLAG}: how many of the first layers (default 1)")
    group.add_argument(END_FLAG, type=int, default=None, dest="bf16_end", metavar="N",
                       help=f"with {FIRST_LAST_FLAG}: how many of the last layers (default 1)")


def fp8_from_args(args: argparse.Namespace) -> Fp8Options | None:
    """The Fp8Options of --fp8-format / --fp8-recipe (or --fp4-format / --fp4-recipe: NVFP4); None without either;
    one line for a recipe without its format or both formats at once."""
    fmt, recipe = getattr(args, "fp8_format", None), getattr(args, "fp8_recipe", None)
    fp4, fp4_recipe = getattr(args, "fp4_format", None), getattr(args, "fp4_recipe", None)
    if fp4 is not None or fp4_recipe is not None:
        if fmt is not None or recipe is not None:  # megatron/training/arguments.py refuses it too
            raise PipesimError("--fp4-format and --fp8-format cannot be used together: choose one")
        if fp4 is None:
            raise PipesimError(f"--fp4-recipe {fp4_recipe} needs --fp4-format e2m1 to turn FP4 on")
        if getattr(args, "fp8_impl", None) not in (None, "te"):
            raise PipesimError("--fp4-format runs Transformer Engine's NVFP4 linears: --fp8-impl torchao has none "
                               "in pipesim")
        return Fp8Options(fp4, fp4_recipe or FP4_RECIPES[0], "te",
                          nvfp4_disabled=tuple(getattr(args, "nvfp4_disable", None) or ()))
    if getattr(args, "nvfp4_disable", None):
        raise PipesimError(f"{NVFP4_DISABLE_FLAG} turns off Transformer Engine's NVFP4 switches: it needs --fp4-format "
                           "e2m1")
    if fmt is None:
        if recipe is not None:
            raise PipesimError(f"--fp8-recipe {recipe} needs --fp8-format (e4m3 or hybrid) to turn FP8 on")
        return None
    impl = getattr(args, "fp8_impl", None) or "te"
    return Fp8Options(fmt, recipe or (DEFAULT_RECIPE if impl == "te" else "tensorwise"), impl)


def bf16_layers_from_args(args: argparse.Namespace) -> Bf16Layers | None:
    """The Bf16Layers of --first-last-layers-bf16 and its counts; None without it; one line for a count alone."""
    start, end = getattr(args, "bf16_start", None), getattr(args, "bf16_end", None)
    if not getattr(args, "first_last_layers_bf16", False):
        for flag, value in ((START_FLAG, start), (END_FLAG, end)):
            if value is not None:
                raise PipesimError(f"{flag} {value} needs {FIRST_LAST_FLAG}")
        return None
    return Bf16Layers(*(value if value is not None else 1 for value in (start, end)))


def param_gather_from_args(args: argparse.Namespace, fp8: Fp8Options | None) -> bool:
    """Whether the quantized linears' parameters are kept and gathered quantized: --fp8-param-gather, or
    --fp4-param-gather under NVFP4 (Megatron-core's two flags, one Job field); one line for the wrong one."""
    fp8_gather, fp4_gather = getattr(args, "fp8_param_gather", False), getattr(args, "fp4_param_gather", False)
    fp4 = fp8 is not None and fp8.fp4
    if fp4_gather and not fp4:  # megatron/training/arguments.py's message
        raise PipesimError("--fp4-param-gather must be used together with --fp4-format")
    if fp8_gather and fp4:
        raise PipesimError("--fp8-param-gather with --fp4-format: NVFP4 parameters are gathered by "
                           "--fp4-param-gather (Megatron-core's flag)")
    return bool(fp8_gather or fp4_gather)


def add_grad_args(group) -> None:
    """--accumulate-allreduce-grads-in-fp32 / --grad-reduce-in-bf16: the main gradients' dtype (simulate, sweep,
    plan); None when neither is given (the dtype's default, pipesim.cost.model_costs.precision_of)."""
    grads = group.add_mutually_exclusive_group()
    grads.add_argument("--accumulate-allreduce-grads-in-fp32", dest="grad_fp32", action="store_const", const=True,
                       default=None,
                       help="16-bit models: float32 main gradients, accumulated and reduced over dp in float32, 4 "
                            "bytes per parameter instead of 2 (Megatron's flag; the default for bfloat16, as in "
                            "Megatron-LM and torchtitan; float16 keeps 16-bit gradients unless given)")
    grads.add_argument("--grad-reduce-in-bf16", dest="grad_fp32", action="store_const", const=False,
                       help="bfloat16 models: bfloat16 main gradients, accumulated and reduced over dp in bfloat16 "
                            "(Megatron's flag), instead of the float32 default")


def add_ce_fusion_args(g) -> None:
    """--cross-entropy-loss-fusion (Megatron-core's flag) and pipesim's --no-... to undo a profile's."""
    g.add_argument("--cross-entropy-loss-fusion", dest="ce_fusion", action="store_const", const=True, default=None,
                   help="GPU presets: Megatron-core's fused vocab-parallel cross-entropy (its 'native' "
                        "implementation: d + 20 bytes per logit forward, 8 + d backward instead of d + 36 and 12 + d) "
                        "(default --framework's: on with nemo, else off)")
    g.add_argument("--no-cross-entropy-loss-fusion", dest="ce_fusion", action="store_const", const=False,
                   help="GPU presets: the unfused cross-entropy even where --framework fuses it")
    g.add_argument("--transformer-impl", choices=TRANSFORMER_IMPLS, default=None,
                   help="GPU presets: whose linears (Megatron-core's flag): transformer_engine adds a biased QKV's "
                        "bias in its GEMM's epilogue and takes its gradient in the weight-gradient GEMM; local "
                        "(Megatron's own) runs both as separate kernels (default --framework's: transformer_engine "
                        "with megatron-core and nemo, else local)")
    g.add_argument("--cross-entropy-fusion-impl", dest="ce_impl", choices=CE_IMPLS, default="native",
                   help="with --cross-entropy-loss-fusion: Megatron-core's own fused kernels (native, default) or "
                        "Transformer Engine's Triton kernel (te: 3 d bytes per logit forward, 2 d backward)")


def add_act_fp8_store_arg(group) -> None:
    """--activation-func-fp8-input-store (Megatron-core's flag; simulate, sweep, plan)."""
    group.add_argument(ACT_FP8_STORE_FLAG, action="store_true", dest="act_fp8_store",
                       help="Megatron-core's: the fused SwiGLU saves its input for the backward in FP8 (E4M3, one "
                            "byte per element, cast back in the backward): the dense MLP's, the experts' and the "
                            "shared experts' gate and up outputs; plan: every candidate's (docs/large_models.md)")


def add_cuda_graph_args(group) -> None:
    """--cuda-graph-impl / --cuda-graph-scope (Megatron-core's flags; --cuda-graph-modules its newer name)."""
    group.add_argument("--cuda-graph-impl", choices=("none", *CUDA_GRAPH_IMPLS), default="none",
                       help="GPU presets: CUDA graphs as Megatron-core captures them (local: its own; "
                            "transformer_engine: TE's make_graphed_callables; full_iteration: the whole iteration); "
                            "they change the host launches pipesim charges a mixture-of-experts layer (default none)")
    group.add_argument("--cuda-graph-scope", "--cuda-graph-modules", dest="cuda_graph_scope", nargs="+",
                       choices=CUDA_GRAPH_SCOPES, default=None, metavar="MODULE",
                       help=f"with --cuda-graph-impl local or transformer_engine: the parts of each layer graphed "
                            f"({', '.join(CUDA_GRAPH_SCOPES)}; default the whole layer)")


def cuda_graphs_from_args(args: argparse.Namespace) -> CudaGraphs | None:
    """The CudaGraphs of --cuda-graph-impl / --cuda-graph-scope; None without graphs; one line for a scope alone."""
    impl, scope = getattr(args, "cuda_graph_impl", "none"), getattr(args, "cuda_graph_scope", None)
    if impl == "none":
        if scope:
            raise PipesimError(f"--cuda-graph-scope {' '.join(scope)} needs --cuda-graph-impl local or "
                               "transformer_engine")
        return None
    return CudaGraphs(impl, tuple(scope or ()))


def add_stack_kernel_args(f) -> None:
    """The training stack's kernel and sharding choices simulate, sweep and plan share (torchtitan's and
    Megatron-core's, in pipesim's spelling): FSDP2's resharding, FP8 parameter gathers, the eager RMSNorm, async TP,
    torch.compile or eager kernels; `pipesim.commands.setup_args.apply_switches` checks them against each other."""
    f.add_argument("--fsdp-reshard-after-forward", dest="fsdp_reshard", choices=FSDP_RESHARD, default="default",
                   help="with --zero 3: torchtitan's FSDP2 resharding: always frees each unit's gathered parameters "
                        "after its forward (gathered again for the backward), never keeps them, default frees them "
                        "only without pipelining; without pipelining FSDP2 also frees them and reduce-scatters the "
                        "gradients after every backward")
    f.add_argument("--fp8-param-gather", action="store_true",
                   help="with --fp8-format and the distributed optimizer (--zero 1 or 2): the FP8 linears' "
                        "parameters kept in FP8 and all-gathered in FP8, no separate FP8 copy (Megatron-core's "
                        "flag; NeMo's fp8_params); with --fp8-impl torchao and --zero 3: FSDP2 gathers them in FP8, "
                        "already cast (torchao's enable_fsdp_float8_all_gather)")
    f.add_argument("--eager-rmsnorm", action="store_true",
                   help="GPU presets: RMSNorm as eager PyTorch's ops, 6 kernels forward and 9 backward in float32 "
                        "(Hugging Face's LlamaRMSNorm, torchtitan's before torch.nn.RMSNorm, torch.nn.RMSNorm before "
                        "torch 2.9) instead of one fused kernel; torch.compile fuses it again")
    f.add_argument("--async-tp", action="store_true",
                   help="GPU presets, tp > 1 with --sequence-parallel and --compile: torchtitan's async tensor "
                        "parallelism, each sequence-parallel all-gather and reduce-scatter inside its matmul, chunk by "
                        "chunk over the copy engines (torch's micro-pipelining; pipesim.comm.ub_overlap)")
    f.add_argument("--dtensor-tp", action="store_true", default=None,
                   help="tp > 1 with --sequence-parallel: tensor parallelism as torch DTensor's parallel styles "
                        "(torchtitan's): each block's all-gathered input is saved for its weight gradients instead of "
                        "gathered again in the backward (Megatron's), and gathered in FP8 under --fp8-recipe "
                        "tensorwise (torchao's Float8ColwiseParallel) (default --framework's: on with torchtitan)")
    fusion = f.add_mutually_exclusive_group()
    fusion.add_argument("--compile", dest="kernel_fusion", action="store_const", const=True, default=None,
                        help="GPU presets: torch.compile's fused elementwise kernels (torchtitan's --compile.enable; "
                             "timed as Megatron's fused kernels) even where --framework runs eager PyTorch")
    fusion.add_argument("--no-kernel-fusion", dest="kernel_fusion", action="store_false", default=None,
                        help="GPU presets: eager PyTorch's one kernel per elementwise op instead of Megatron's fused "
                             "kernels (its --no-bias-gelu-fusion, --no-bias-swiglu-fusion, --no-bias-dropout-fusion, "
                             "--no-masked-softmax-fusion and --no-rope-fusion at once)")


def add_optimizer_args(group) -> None:
    """Megatron-core's precision-aware optimizer (simulate, sweep, plan): --use-precision-aware-optimizer and the
    dtypes of its master weights and moments (pipesim.model.adam_states); `adam_from_args` reads them."""
    group.add_argument("--use-precision-aware-optimizer", action="store_true",
                       help="with the distributed optimizer (--zero 1 or 2) and a 16-bit model: Adam's master weights "
                            "and moments in the dtypes below (Transformer Engine's FusedAdam; a bfloat16 model's "
                            "float32 master kept as its 16-bit remainder without FP8 or with delayed scaling), "
                            "Megatron-core's flag")
    group.add_argument("--main-params-dtype", choices=MASTER_DTYPES, default=None,
                       help="with --use-precision-aware-optimizer: the master weights' dtype (default fp32)")
    group.add_argument("--exp-avg-dtype", choices=MOMENT_DTYPES, default=None,
                       help="with --use-precision-aware-optimizer: Adam's first moment's dtype (default fp32)")
    group.add_argument("--exp-avg-sq-dtype", choices=MOMENT_DTYPES, default=None,
                       help="with --use-precision-aware-optimizer: Adam's second moment's dtype (default fp32)")
    group.add_argument("--optimizer", choices=OPTIMIZERS, default="adam",
                       help="Megatron-core's optimizer: adam (default), muon (every state on every data-parallel "
                            "rank) or dist_muon (whole tensors dealt to the data-parallel ranks, the parameters "
                            "all-gathered after the step); Muon's Newton-Schulz GEMMs are timed kernel by kernel")
    group.add_argument("--muon-num-ns-steps", type=int, default=None,
                       help="with --optimizer muon / dist_muon: Newton-Schulz steps (default 5)")
    group.add_argument("--muon-no-split-qkv", dest="muon_split_qkv", action="store_false",
                       help="with Muon: orthogonalize QKV whole (default: its Q, K and V parts apart)")
    group.add_argument("--muon-use-nesterov", action="store_true",
                       help="with Muon: Nesterov momentum (one more pass over the Muon tensors)")


def adam_from_args(args: argparse.Namespace) -> AdamStates | None:
    """The AdamStates of --use-precision-aware-optimizer (None without it); one line for a dtype given without it."""
    dtypes = {"main_params": getattr(args, "main_params_dtype", None), "exp_avg": getattr(args, "exp_avg_dtype", None),
              "exp_avg_sq": getattr(args, "exp_avg_sq_dtype", None)}
    if not getattr(args, "use_precision_aware_optimizer", False):
        given = [name for name, value in dtypes.items() if value is not None]
        if given:
            raise PipesimError(f"--{given[0].replace('_', '-')}-dtype needs --use-precision-aware-optimizer "
                               "(Megatron-core uses the optimizer dtypes only with it)")
        return None
    return AdamStates(**{name: value for name, value in dtypes.items() if value is not None})


def muon_from_args(args: argparse.Namespace) -> MuonOptions | None:
    """The MuonOptions of --optimizer (None for adam, the default); one line where --framework's stack has none."""
    muon = muon_options(getattr(args, "optimizer", "adam"), ns_steps=getattr(args, "muon_num_ns_steps", None),
                        split_qkv=getattr(args, "muon_split_qkv", True),
                        nesterov=getattr(args, "muon_use_nesterov", False))
    check_muon_framework(muon, getattr(args, "framework", None))
    return muon


def check_fp8_run(fp8: Fp8Options | None, model: ModelConfig | None, hardware: Hardware | None) -> None:
    """One line, before any work, unless FP8 suits the model (a 16-bit transformer) and the hardware (FP8 tensor
    cores running the recipe: pipesim.device.fp8_rates)."""
    if fp8 is None:
        return
    if model is None or hardware is None:
        raise PipesimError("--fp8-format needs a model on GPU hardware, not hand-given --cost")
    check_fp8_model(fp8, model.dtype, model.kind)
    check_fp8_recipe(hardware.device.family, fp8.recipe, hardware.device.name)
