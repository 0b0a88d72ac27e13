"""The job: one training run's parallel layout and options, validated once and passed whole.

A `Job` is what the command line, a planner candidate or `executor.api.train` say about how a model
is trained: the rank layout (`ParallelDims`: pp, dp, tp, cp, and the experts' ep, etp), the transformer's options
(recomputation, sequence parallelism, attention kernel), the ZeRO stage, the framework's
communication switches (`CommOptions`) and the GPU kernel switches. It is frozen and hashable, so
the planner caches on it and the executor sends it to its workers as it is. Every range check is in
`__post_init__` and every divisibility check against a model in `check`, with the one-line messages
users get; the cost model, the simulator, the result and the executor read the options from here and
check nothing again. A new option is one field here and its one consumer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pipesim.comm.comm_options import CommOptions
from pipesim.errors import PipesimError
from pipesim.kernel_switches import KernelSwitches
from pipesim.model.adam_states import AdamStates, check_adam_states
from pipesim.model.config import ModelConfig
from pipesim.model.cuda_graphs import CudaGraphs
from pipesim.model.fp8 import FP8_GATHER_RECIPES, Fp8Options, check_fp8_model
from pipesim.model.fsdp import FsdpPolicy, check_reshard, fsdp_policy
from pipesim.model.layer_precision import Bf16Layers
from pipesim.model.memory import check_zero
from pipesim.model.muon_options import MuonOptions, check_muon
from pipesim.model.options import (
    ACT_FP8_STORE_FLAG,
    ATTENTION,
    LayerOptions,
    check_act_fp8_store,
    check_choices,
    check_cp_comm,
    check_tp_split,
)
from pipesim.model.piece_kernels import CE_IMPLS
from pipesim.model.recompute_modules import canonical_modules
from pipesim.parallel_dims import ParallelDims


@dataclass(frozen=True)
class Job:
    """How a model is trained: layout, layer options, ZeRO, communication and kernel switches."""

    dims: ParallelDims = field(default_factory=ParallelDims)  # pp outermost ... tp innermost (one owner)
    recompute: str = "none"  # "none", "selective" (attention core) or "full" (Megatron's meanings)
    sp: bool = False  # sequence parallelism over the tp ranks (Korthikanti et al. 2022)
    attention: str | None = None  # "flash" or "eager"; None: flash on GPUs at 16 bits (`resolve_attention`)
    zero: int = 0  # ZeRO stage of the data-parallel state (0: plain DDP)
    comm: CommOptions = field(default_factory=CommOptions)  # the framework's communication switches
    kernels: KernelSwitches = field(default_factory=KernelSwitches)
    # with recompute "selective": Megatron-core's --recompute-modules (pipesim.model.recompute_modules); () its
    # default, core_attn alone (kept canonical, so both spellings are one job)
    recompute_modules: tuple[str, ...] = ()
    fp8: Fp8Options | None = None  # Megatron-core's --fp8-format / --fp8-recipe (pipesim.model.fp8); None: no FP8
    cp_comm: str = "p2p"  # Megatron-core's --cp-comm-type (pipesim.model.options.CP_COMM_TYPES)
    # ZeRO 3: torchtitan's --parallelism.fsdp_reshard_after_forward (pipesim.model.fsdp): default, always, never
    fsdp_reshard: str = "default"
    # Megatron-core's --fp8-param-gather (--fp4-param-gather under NVFP4): the FP8 linears' parameters kept in FP8
    # and all-gathered in FP8 by the distributed optimizer (NeMo's fp8_params); pipesim.cost.fp8_costs
    fp8_param_gather: bool = False
    # Megatron-core's --use-precision-aware-optimizer with its dtypes (pipesim.model.adam_states); None: float32
    adam_states: AdamStates | None = None
    # Megatron-core's --activation-func-fp8-input-store: the fused SwiGLU keeps its input in FP8 for the backward
    act_fp8_store: bool = False
    # Megatron-core's --first-last-layers-bf16: the model's first and last layers outside the FP8 autocast
    # (pipesim.model.layer_precision); None: every layer in FP8 under --fp8-format
    bf16_layers: Bf16Layers | None = None
    # Megatron-core's --optimizer muon / dist_muon (pipesim.model.muon_options, pipesim.cost.muon_step); None: Adam
    muon: MuonOptions | None = None

    def __post_init__(self) -> None:
        if self.fp8 is not None and not isinstance(self.fp8, Fp8Options):
            raise PipesimError(f"a job's fp8 must be Fp8Options or None, got {type(self.fp8).__name__}")
        if not isinstance(self.dims, ParallelDims):
            raise PipesimError(f"a job's dims must be ParallelDims, got {type(self.dims).__name__}")
        # attention None: decided later (`resolve_attention`); one spelling of these messages with LayerOptions
        check_choices(self.sp, self.recompute, ATTENTION[0] if self.attention is None else self.attention)
        object.__setattr__(self, "recompute_modules", canonical_modules(self.recompute, self.recompute_modules))
        check_zero(self.zero, self.dims.dp)
        if not isinstance(self.comm, CommOptions) or not isinstance(self.kernels, KernelSwitches):
            raise PipesimError("a job's comm must be CommOptions and its kernels KernelSwitches")
        if self.kernels.cuda_graphs is not None:
            if not isinstance(self.kernels.cuda_graphs, CudaGraphs):
                raise PipesimError("a job's cuda_graphs must be CudaGraphs or None")
            self.kernels.cuda_graphs.check_recompute(self.recompute, self.recompute_modules)
        if self.kernels.ce_impl not in CE_IMPLS:
            raise PipesimError(f"unknown --cross-entropy-fusion-impl {self.kernels.ce_impl!r}; choose "
                               f"{' or '.join(CE_IMPLS)}")
        if self.kernels.ce_impl != "native" and not self.kernels.ce_fusion:
            raise PipesimError(f"--cross-entropy-fusion-impl {self.kernels.ce_impl} needs --cross-entropy-loss-fusion "
                               "(Megatron-core runs the unfused cross-entropy otherwise)")
        if self.kernels.ub is not None:
            if not self.kernels.tp_comm_overlap:
                raise PipesimError(f"{self.kernels.ub.flags()[0]} overlaps the backward collectives too: it cannot go "
                                   "with --no-async-tensor-model-parallel-allreduce (or a --framework that sets it)")
        check_cp_comm(self.cp_comm)
        check_reshard(self.fsdp_reshard)
        if self.fp8_param_gather and self.fp8 is None:
            raise PipesimError("--fp8-param-gather keeps the FP8 linears' parameters in FP8: it needs --fp8-format")
        torchao = self.fp8 is not None and self.fp8.impl == "torchao"
        if self.fp8_param_gather and torchao and self.fp8.recipe not in FP8_GATHER_RECIPES:
            raise PipesimError(f"--fp8-param-gather with --fp8-impl torchao is FSDP2's float8 all-gather, which "
                               f"takes tensorwise scaling only (torchao/float8/config.py), got --fp8-recipe "
                               f"{self.fp8.recipe}")
        if self.fp8_param_gather and torchao and self.zero != 3:
            raise PipesimError(f"--fp8-param-gather with --fp8-impl torchao is FSDP2's float8 all-gather "
                               f"(enable_fsdp_float8_all_gather): it needs --zero 3, got --zero {self.zero}")
        if self.fp8_param_gather and not torchao and self.zero not in (1, 2):  # megatron/training/arguments.py
            raise PipesimError(f"{self.param_gather_flag} needs the distributed optimizer (--zero 1 or 2), got --zero "
                               f"{self.zero}" + (" (Megatron-core turns it off under torch FSDP2 with Transformer "
                                                 "Engine 2; torchao's float8 gathers under FSDP2: --fp8-impl torchao)"
                                                 if self.zero == 3 else ""))
        check_adam_states(self.adam_states, zero=self.zero)
        if self.bf16_layers is not None:
            if not isinstance(self.bf16_layers, Bf16Layers):
                raise PipesimError(f"a job's bf16_layers must be Bf16Layers or None, got "
                                   f"{type(self.bf16_layers).__name__}")
            self.bf16_layers.check_recipe(self.fp8)
        if self.fsdp_reshard != "default" and self.zero != 3:
            raise PipesimError(f"--fsdp-reshard-after-forward {self.fsdp_reshard} needs FSDP's sharded parameters "
                               f"(--zero 3), got --zero {self.zero}")
        check_muon(self.muon, zero=self.zero, overlap_grad_reduce=self.comm.overlap_grad_reduce,
                   overlap_param_gather=self.comm.overlap_param_gather, precision_aware=self.adam_states is not None,
                   fp8_param_gather=self.fp8_param_gather)
        if self.comm.overlap_param_gather and not self.gathers_parameters and (self.zero == 3 or self.dims.dp_cp > 1):
            raise PipesimError(f"--overlap-param-gather needs the distributed optimizer's parameter all-gather "
                               f"(--zero 1 or 2, or --optimizer dist_muon), got --zero {self.zero}")

    @property
    def gathers_parameters(self) -> bool:
        """The optimizer all-gathers the updated parameters after its step (the module's `gathers_parameters`)."""
        return gathers_parameters(self.zero, self.muon)

    # the axes, as every consumer reads them
    @property
    def pp(self) -> int:
        return self.dims.pp

    @property
    def dp(self) -> int:
        return self.dims.dp

    @property
    def tp(self) -> int:
        return self.dims.tp

    @property
    def cp(self) -> int:
        return self.dims.cp

    @property
    def ep(self) -> int:
        return self.dims.ep

    @property
    def fsdp(self) -> FsdpPolicy | None:
        """ZeRO 3's resharding on this job's pp ranks (pipesim.model.fsdp); None under ZeRO 0-2."""
        return fsdp_policy(self.fsdp_reshard, self.dims.pp) if self.zero == 3 else None

    def with_pp(self, pp: int) -> Job:
        """The same job on `pp` pipeline ranks (a sweep's or a schedule's own p)."""
        return self if pp == self.dims.pp else replace(self, dims=replace(self.dims, pp=pp))

    def per_stage(self) -> Job:
        """The job as one stage's per-microbatch seconds see it: its tp, cp and layer and kernel options on one
        pipeline rank and one replica, without ZeRO (what per-stage cost caches key on). With experts (ep > 1 or
        etp given) dp, ep and etp stay too: etp x ep x edp = tp x cp x dp needs the stage's dp."""
        d = self.dims
        dims = ParallelDims(dp=d.dp, tp=d.tp, cp=d.cp, ep=d.ep, etp=d.etp) if d.has_experts else \
            ParallelDims(tp=d.tp, cp=d.cp)
        return replace(self, dims=dims, zero=0, fsdp_reshard="default", fp8_param_gather=False, adam_states=None,
                       muon=None, fp8=self.layer_fp8)

    @property
    def layer_fp8(self) -> Fp8Options | None:
        """The FP8 options a layer sees: torchao's weights arrive already cast when FSDP2 gathers them in FP8
        (--fp8-param-gather under ZeRO 3, torchao's enable_fsdp_float8_all_gather)."""
        if self.fp8 is not None and self.fp8_param_gather and self.zero == 3:
            return replace(self.fp8, gathered=True)
        return self.fp8

    def resolve_attention(self, gpu: bool, model: ModelConfig | None) -> Job:
        """The job with its attention kernel decided: flash on GPU hardware at 16 bits, eager on CPUs and in
        float32 (the models the CPU preset was calibrated with); a given kernel stays."""
        if self.attention is not None:
            return self
        flash = gpu and model is not None and model.dtype != "float32"
        return replace(self, attention="flash" if flash else "eager")

    @property
    def attention_kernel(self) -> str:
        return self.attention or "eager"

    @property
    def is_plain(self) -> bool:
        """No transformer option set: what hand-given costs (`--cost`) and the MLP admit."""
        return self.recompute == "none" and not self.sp and self.zero == 0 and self.dims.cp == 1

    def check_gradients(self, model: ModelConfig | None) -> None:
        """PipesimError unless the main gradients' dtype suits `model` (None: hand-given costs, no model):
        --grad-reduce-in-bf16 only for bfloat16. The commands ask it before building anything."""
        if self.kernels.grad_fp32 is False and (model is None or model.dtype != "bfloat16"):
            raise PipesimError(f"--grad-reduce-in-bf16 needs a bfloat16 model (--dtype bfloat16), got "
                               f"{model.dtype if model is not None else 'no model'}")
        if self.adam_states is not None and (model is None or model.dtype not in ("bfloat16", "float16")):
            raise PipesimError(f"--use-precision-aware-optimizer lowers a 16-bit model's optimizer states, got "
                               f"{model.dtype if model is not None else 'no model'}")

    def check(self, model: ModelConfig, microbatches: int | None = None) -> None:
        """PipesimError (one line, with the numbers) unless `model` and its batch split under this job: the
        one place each divisibility check against a model is made (the tp splits, LayerOptions.check's)."""
        self.check_gradients(model)
        check_fp8_model(self.fp8, model.dtype, model.kind)
        if self.muon is not None and model.dtype == "float16":
            raise PipesimError(f"--optimizer {self.muon.name} with a float16 model: Megatron-core's Muon runs bf16 or "
                               "float32 ('muon with fp16 is not supported')")
        if self.muon is not None and model.mtp_layers:
            raise PipesimError(f"--optimizer {self.muon.name} with multi-token-prediction modules is not modelled")
        if self.kernels.eager_rmsnorm and model.norm != "rmsnorm":
            raise PipesimError(f"--eager-rmsnorm needs a model with RMSNorm, got {model.norm}")
        if self.act_fp8_store:
            check_act_fp8_store(model, self.recompute, fused=self.kernels.fusion)
        if self.bf16_layers is not None:
            self.bf16_layers.check(model, self.dims.pp)
        if microbatches is not None:
            if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
                raise PipesimError(f"microbatches must be a positive integer, got {microbatches!r}")
            if model.batch % (self.dims.dp * microbatches):
                raise PipesimError(f"--batch {model.batch} does not split into dp({self.dims.dp}) x {microbatches} "
                                   "microbatches evenly")
        if self.kernels.ub is not None and (self.dims.tp == 1 or not self.sp):  # a planner drops it per candidate
            raise PipesimError(f"{self.kernels.ub.flags()[0]} needs tensor parallelism with --sequence-parallel "
                               "(Megatron-core: 'Tensor parallel communication/GEMM overlap can happen only when "
                               "sequence parallelism is enabled')")
        check_tp_split(model, self.dims.tp)  # before the layer options' own checks, as users have seen them
        self.check_experts(model)
        if self.fp8_param_gather and model.moe is not None and not self.fp8.caches_weights:
            raise PipesimError("--fp8-param-gather with --fp8-impl torchao and a mixture of experts is not modelled "
                               "(FSDP2's float8 all-gather of grouped experts)")
        if model.kind != "gpt":
            for flag, value, plain in (("--sequence-parallel", self.sp, False), ("--cp", self.dims.cp, 1),
                                       ("--recompute", self.recompute, "none")):
                if value != plain:
                    raise PipesimError(f"{flag} needs a transformer (--model gpt or --model-config), not --model mlp")
            return
        self.layer_options(model).check(model)  # (the tp splits again) seq by 2 cp; sp's seq by tp

    def check_experts(self, model: ModelConfig) -> None:
        """PipesimError unless the expert layout suits `model`: ep and a given etp need a mixture-of-experts model,
        ep divides its experts and etp (default tp) each expert's width (Megatron-LM's arguments.py checks ep); CUDA
        graphs over Mamba layers need a hybrid model's."""
        d, moe = self.dims, model.moe
        graphs = self.kernels.cuda_graphs
        if graphs is not None and "mamba" in graphs.scope and model.hybrid is None:
            raise PipesimError("--cuda-graph-scope mamba: the model has no Mamba layers (a hybrid model's)")
        if moe is None:
            for flag, value in (("--ep", d.ep if d.ep > 1 else None), ("--etp", d.etp),
                                ("--moe-token-dispatcher-type", "flex" if self.comm.moe_dispatcher != "alltoall"
                                 else None)):
                if value is not None:
                    raise PipesimError(f"{flag} {value} needs a mixture-of-experts model")
            return
        if moe.experts % d.ep:
            raise PipesimError(f"--ep {d.ep} does not divide the {moe.experts} experts")
        if moe.capacity_factor is not None and self.comm.moe_dispatcher == "deepep":  # transformer_config.py raises
            raise PipesimError("--moe-expert-capacity-factor (drop-and-pad) with DeepEP: Megatron-core's flex "
                               "dispatcher with the deepep backend does not support padding to capacity")
        if self.kernels.cuda_graphs is not None:
            self.kernels.cuda_graphs.check_moe(self.comm.moe_dispatcher, padded=moe.capacity_factor is not None)
        if moe.expert_ffn % d.expert_tp:
            flag = f"--etp {d.etp}" if d.etp is not None else f"--tp {d.tp} (--etp's default)"
            raise PipesimError(f"{flag} does not divide the expert width {moe.expert_ffn}")

    def microbatch_size(self, model: ModelConfig, microbatches: int) -> int:
        """Sequences per microbatch: batch / (dp x m), after `check`."""
        self.check(model, microbatches)
        return model.batch // (self.dims.dp * microbatches)

    @property
    def param_gather_flag(self) -> str:
        """Megatron-core's flag of `fp8_param_gather`: --fp4-param-gather under NVFP4, else --fp8-param-gather."""
        return self.fp8.param_gather_flag if self.fp8 is not None else "--fp8-param-gather"

    def layer_options(self, model: ModelConfig) -> LayerOptions | None:
        """The transformer layer's options under this job; None for the MLP."""
        if model.kind != "gpt":
            return None
        experts = {"ep": self.dims.ep, "etp": self.dims.expert_tp, "moe_dispatcher": self.comm.moe_dispatcher,
                   "cuda_graphs": self.kernels.cuda_graphs} if model.moe is not None else {}
        return LayerOptions(tp=self.dims.tp, sp=self.sp, cp=self.dims.cp, recompute=self.recompute,
                            attention=self.attention_kernel, recompute_modules=self.recompute_modules,
                            fp8=self.layer_fp8,
                            cp_comm=self.cp_comm, eager_rmsnorm=self.kernels.eager_rmsnorm,
                            dtensor_tp=self.kernels.dtensor_tp, act_fp8_store=self.act_fp8_store,
                            te_linear=self.kernels.te_linear, **experts)

    def flags(self) -> list[str]:
        """The command-line flags that give this job's options: the experts' --ep/--etp when set (the dense layout is
        given by --stages/--dp/--tp/--cp)."""
        out = ["--ep", str(self.dims.ep)] if self.dims.ep > 1 else []
        if self.dims.etp is not None:
            out += ["--etp", str(self.dims.etp)]
        if self.recompute != "none":
            out += ["--recompute", self.recompute]
        if self.recompute_modules:
            out += ["--recompute-modules", *self.recompute_modules]
        out += self.precision_flags()
        if self.sp:
            out.append("--sequence-parallel")
        if self.attention is not None:
            out += ["--attention", self.attention]
        if self.zero:
            out += ["--zero", str(self.zero)]
        out += self.fp8.flags() if self.fp8 is not None else []
        if self.cp_comm != "p2p":
            out += ["--cp-comm-type", self.cp_comm]
        return out + self.state_flags() + self.comm.flags() + self.kernels.flags()

    def precision_flags(self) -> list[str]:
        """Megatron-core's flags of the layers' precision switches, `act_fp8_store` and `bf16_layers`, where set (every
        export's one spelling)."""
        return ([ACT_FP8_STORE_FLAG] if self.act_fp8_store else []) + \
            (self.bf16_layers.flags() if self.bf16_layers is not None else [])

    def bf16_layer_options(self, model: ModelConfig) -> LayerOptions | None:
        """The options of a layer --first-last-layers-bf16 keeps out of FP8: the job's layer options without FP8
        (None for the MLP)."""
        opts = self.layer_options(model)
        return replace(opts, fp8=None) if opts is not None else None

    def state_flags(self) -> list[str]:
        """The flags of the model state's layout where set: FSDP2's resharding policy, Megatron-core's FP8 parameter
        gather and its precision-aware optimizer."""
        out = ["--fsdp-reshard-after-forward", self.fsdp_reshard] if self.fsdp_reshard != "default" else []
        out += [self.param_gather_flag] if self.fp8_param_gather else []
        out += self.adam_states.flags() if self.adam_states is not None else []
        return out + (self.muon.flags() if self.muon is not None else [])


def gathers_parameters(zero: int, muon: MuonOptions | None) -> bool:
    """Whether the optimizer all-gathers the updated parameters after its step, the gather --overlap-param-gather
    moves into DDP's buckets: the distributed optimizer's (ZeRO 1 or 2) and dist_muon's (LayerWiseDistributedOptimizer).
    One rule for the Job's check, the planner's candidates and the step's costs."""
    return zero in (1, 2) or (muon is not None and muon.distributed)


__all__ = ["Job", "gathers_parameters"]
