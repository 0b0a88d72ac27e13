"""Software profiles (`--framework NAME`): the switches each training stack sets, read from its source.

Published step times hang on switches a user cannot be expected to know (blocking pipeline sends, the backward
TP all-reduce under the weight-gradient GEMM, fused gradient accumulation, bucketed gradient reduction, the
distributed optimizer's overlapped parameter gather, fp32 gradient reduction), and they decide 20-40 % of a
step. A profile names them once per stack, each with the repository path and version it was read from; a flag
given on the command line still wins over its profile (the switches stay for experts). docs/frameworks.md is
this table in prose.

Settings are keyed by the command line's argparse destinations (pipesim/commands/setup_args.py), so a profile is
exactly "these flags, typed for you".
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError

# The switches a profile may set, and pipesim's own default for each (the executor's behaviour).
DEFAULTS: dict[str, object] = {
    "scatter_gather": False,  # --scatter-gather
    "blocking_p2p": False,  # --blocking-p2p
    "overlap_p2p_comm": False,  # --overlap-p2p-communication
    "tp_comm_overlap": True,  # --no-async-tensor-model-parallel-allreduce turns it off
    "grad_accum_fusion": True,  # --no-gradient-accumulation-fusion turns it off
    "kernel_fusion": True,  # --no-kernel-fusion turns it off
    "ce_fusion": False,  # --cross-entropy-loss-fusion (Megatron-core's default: off)
    "overlap_grad_reduce": False,  # --overlap-grad-reduce
    "overlap_param_gather": False,  # --overlap-param-gather
    "zero": 0,  # --zero
    "grad_fp32": None,  # --accumulate-allreduce-grads-in-fp32 / --grad-reduce-in-bf16 (None: the dtype's default)
    "attention": None,  # --attention (None: flash on GPUs at 16 bits)
    "cp_comm_type": "p2p",  # --cp-comm-type (context parallelism's K/V exchange)
    "dtensor_tp": False,  # --dtensor-tp (tensor parallelism as DTensor's parallel styles)
    "fp8_impl": "te",  # --fp8-impl (whose FP8 linears: Transformer Engine's or torchao's)
    # --transformer-impl (Megatron-core's name): whose linears; "local" adds a biased QKV's bias by its own kernel
    "transformer_impl": "local",
    # torchtitan's layer split: the layers the embedding and the output weigh (pipesim.model.pipeline_split)
    "pipeline_parallel_first_stage_less_layers": 0,  # --pipeline-parallel-first-stage-less-layers
    "pipeline_parallel_last_stage_less_layers": 0,  # --pipeline-parallel-last-stage-less-layers
}


# How each switch's value is typed on the command line (docs/frameworks.md and the profiles' account in --json).
def flag_text(dest: str, value: object) -> str:
    """The flag(s) that give `value` to switch `dest` ('' where it is pipesim's default and has no flag)."""
    on_flags = {"scatter_gather": "--scatter-gather", "blocking_p2p": "--blocking-p2p",
                "overlap_p2p_comm": "--overlap-p2p-communication", "overlap_grad_reduce": "--overlap-grad-reduce",
                "overlap_param_gather": "--overlap-param-gather", "ce_fusion": "--cross-entropy-loss-fusion",
                "dtensor_tp": "--dtensor-tp"}
    off_flags = {"tp_comm_overlap": "--no-async-tensor-model-parallel-allreduce",
                 "grad_accum_fusion": "--no-gradient-accumulation-fusion", "kernel_fusion": "--no-kernel-fusion"}
    if dest in on_flags:
        return on_flags[dest] if value else ""
    if dest in off_flags:
        return "" if value else off_flags[dest]
    if dest == "grad_fp32":
        return {True: "--accumulate-allreduce-grads-in-fp32", False: "--grad-reduce-in-bf16"}.get(value, "")
    return "" if value is None else f"--{dest.replace('_', '-')} {value}"


@dataclass(frozen=True)
class Setting:
    """One switch of a profile and where its value was read."""

    dest: str  # a key of DEFAULTS
    value: object
    source: str  # repository, version and path (or paper section) the value comes from


@dataclass(frozen=True)
class FrameworkProfile:
    """A training stack's switches; `settings` leaves the others at pipesim's defaults."""

    name: str
    summary: str
    settings: tuple[Setting, ...]

    def __post_init__(self) -> None:
        unknown = [s.dest for s in self.settings if s.dest not in DEFAULTS]
        if unknown:
            raise PipesimError(f"framework profile {self.name}: unknown switches {', '.join(unknown)}")

    def flags(self) -> list[str]:
        """The profile typed out as flags (what `--framework NAME` stands for)."""
        return [t for t in (flag_text(s.dest, s.value) for s in self.settings) if t]

    def values(self) -> dict[str, object]:
        """Every switch: the profile's value, else pipesim's default."""
        return {**DEFAULTS, **{s.dest: s.value for s in self.settings}}


_MLM21 = "NVIDIA/Megatron-LM @ 46c74b4 (NAR21's code)"
_MCORE = "NVIDIA/Megatron-LM v0.15.3"
_NEMO = "NVIDIA/NeMo v2.2.0 (the nemo:25.02 container)"
_TITAN = "pytorch/torchtitan v0.2.2"
_MDS = "bigscience-workshop/Megatron-DeepSpeed @ 119a0d2 with microsoft/DeepSpeed's pipeline engine"

_MEGATRON_CORE = (
    Setting("blocking_p2p", True, f"{_MCORE} megatron/core/pipeline_parallel/p2p_communication.py: _communicate "
            "waits on every request (wait_on_reqs=True) and torch.cuda.synchronize() after batch_isend_irecv "
            "(batch_p2p_sync, default True)"),
    Setting("overlap_p2p_comm", True, f"{_MCORE} megatron/training/arguments.py: --no-overlap-p2p-communication "
            "(store_false: on by default); honoured by the interleaved schedule only (wait_on_reqs=not "
            "overlap_p2p_comm in send_forward_recv_forward / send_backward_recv_backward)"),
    Setting("tp_comm_overlap", True, f"{_MCORE} megatron/training/arguments.py: "
            "--no-async-tensor-model-parallel-allreduce is 'DEPRECATED. This flag is ignored.' (the backward TP "
            "collective always runs under the weight-gradient GEMM, megatron/core/tensor_parallel/layers.py)"),
    Setting("grad_accum_fusion", True, f"{_MCORE} megatron/training/arguments.py: --no-gradient-accumulation-fusion "
            "(store_false: fused by default, with TE or APEX installed)"),
    Setting("transformer_impl", "transformer_engine", "NVIDIA/Megatron-LM d98e8a64 megatron/core/transformer/"
            "transformer_config.py: transformer_impl defaults to 'transformer_engine'; attention.py builds linear_qkv "
            "with skip_bias_add=False, so Transformer Engine's linear adds its bias in the GEMM's epilogue and takes "
            "its gradient in the weight-gradient GEMM (NVIDIA/TransformerEngine d0067d0da transformer_engine/pytorch/"
            "module/layernorm_linear.py: general_gemm(..., bias=bias), and the wgrad's bias with grad=True)"),
)

# Megatron-LM's pipeline messages and attention kernel as NAR21 (2021) and KOR22 (2022) ran them
_MEGATRON_LM_PIPELINE = (
    Setting("blocking_p2p", True, f"{_MLM21} megatron/p2p_communication.py: batch_isend_irecv, wait on every "
            "request, torch.cuda.synchronize() (the same through 2022)"),
    Setting("scatter_gather", True, f"{_MLM21} megatron/arguments.py: scatter_gather_tensors_in_pipeline on by "
            "default (--no-scatter-gather-tensors-in-pipeline; the same through 2022)"),
)
_EAGER_ATTENTION = Setting("attention", "eager", "NAR21 section 4.2, KOR22: fused scale-mask-softmax, the s x s "
                           "scores materialised (flash attention came after both)")

PROFILES: dict[str, FrameworkProfile] = {p.name: p for p in (
    FrameworkProfile(
        "megatron-lm-2021",
        "Megatron-LM of NAR21 (2021): blocking sends, scatter/gather of pipeline messages, the backward TP "
        "all-reduce blocking, gradients added by a separate kernel, plain DDP without overlap, eager attention",
        _MEGATRON_LM_PIPELINE + (
            Setting("tp_comm_overlap", False, f"{_MDS} megatron/mpu/layers.py: ColumnParallelLinear is F.linear "
                    "under autograd after copy_to_tensor_model_parallel_region (the all-reduce blocks the backward)"),
            Setting("grad_accum_fusion", False, f"{_MDS}: no fused weight-gradient accumulation (Megatron-LM added "
                    "--gradient-accumulation-fusion later); its DDP adds each gradient into main_grad"),
            _EAGER_ATTENTION)),
    FrameworkProfile(
        "megatron-lm-2022",
        "Megatron-LM of KOR22 (2022-02 to 2022-09) in fp16: blocking sends, scatter/gather of pipeline messages, "
        "the backward TP all-reduce asynchronous, gradient accumulation fusion turned off without fp32 "
        "accumulation, eager attention",
        _MEGATRON_LM_PIPELINE + (
            Setting("grad_accum_fusion", False, "NVIDIA/Megatron-LM 83b1e42f30 (2022-02-13) megatron/arguments.py: "
                    "gradient_accumulation_fusion set to False unless --accumulate-allreduce-grads-in-fp32, until "
                    "07916bf245 (2022-09-27) 'Support gradient accumulation fusion in fp16'"),
            _EAGER_ATTENTION)),
    FrameworkProfile(
        "megatron-core",
        "Megatron-LM / Megatron-core's own defaults (pretrain_gpt.py): sends waited on except in the interleaved "
        "steady state, the backward TP collective under the weight-gradient GEMM, fused gradient accumulation; "
        "the distributed optimizer and gradient-reduce overlap are the user's flags (off by default)",
        _MEGATRON_CORE),
    FrameworkProfile(
        "nemo",
        "NeMo 2.0's Megatron recipes: megatron-core plus the recipes' distributed optimizer, bucketed gradient "
        "reduction overlapped with the backward, overlapped parameter gathers and float32 gradient reduction",
        _MEGATRON_CORE + (
            Setting("zero", 1, f"{_NEMO} nemo/collections/llm/recipes/optim/adam.py: OptimizerConfig("
                    "use_distributed_optimizer=True)"),
            Setting("overlap_grad_reduce", True, f"{_NEMO} nemo/collections/llm/recipes/llama3_70b.py trainer(): "
                    "DistributedDataParallelConfig(overlap_grad_reduce=True, ...)"),
            Setting("overlap_param_gather", True, f"{_NEMO} the same DistributedDataParallelConfig: "
                    "overlap_param_gather=True"),
            Setting("grad_fp32", True, f"{_NEMO} the same DistributedDataParallelConfig: grad_reduce_in_fp32=True"),
            Setting("ce_fusion", True, f"{_NEMO} nemo/collections/llm/gpt/model/base.py: GPTConfig("
                    "cross_entropy_loss_fusion=True), NemotronConfig the same (Megatron-core's default is False)"))),
    FrameworkProfile(
        "torchtitan",
        "torchtitan: torch.distributed.pipelining's sends (waited on later), DTensor tensor parallelism (its "
        "gathered inputs saved, FP8 gathers under tensorwise float8) without async TP, autograd's gradient "
        "accumulation, eager PyTorch kernels (no torch.compile), FSDP2 over every data-parallel rank with float32 "
        "gradient reduction, context parallelism's K/V shards all-gathered, the pipeline's layers split with the "
        "embedding and the output weighing one layer each",
        (Setting("tp_comm_overlap", False, f"{_TITAN} torchtitan/config/job_config.py: enable_async_tensor_parallel: "
                 "bool = False (DTensor's backward all-reduce waits in autograd)"),
         Setting("grad_accum_fusion", False, "autograd accumulates each microbatch's weight gradient into .grad with "
                 "a separate add (torch.autograd's AccumulateGrad)"),
         Setting("kernel_fusion", False, f"{_TITAN} torchtitan/config/job_config.py: Compile.enable: bool = False "
                 "(eager PyTorch: one kernel per elementwise op)"),
         Setting("zero", 3, f"{_TITAN} torchtitan/config/job_config.py: data_parallel_shard_degree: int = -1 "
                 "(FSDP2's fully_shard over every remaining rank)"),
         Setting("grad_fp32", True, f"{_TITAN} torchtitan/config/job_config.py: mixed_precision_reduce = "
                 "'float32'"),
         Setting("dtensor_tp", True, f"{_TITAN} torchtitan/models/llama3/infra/parallelize.py apply_tp: "
                 "PrepareModuleInput(Shard(1) -> Replicate()) before attention and feed_forward, ColwiseParallel "
                 "wq/wk/wv/w1/w3 (autograd saves the gathered input their matmuls read), and with float8 tensorwise "
                 "PrepareFloat8ModuleInput / Float8ColwiseParallel ('float8 all-gather with TP')"),
         Setting("fp8_impl", "torchao", f"{_TITAN} torchtitan/config/job_config.py: model.converters "
                 "'quantize.linear.float8' swaps nn.Linear for torchao's Float8Linear "
                 "(torchao/float8/float8_linear.py)"),
         Setting("cp_comm_type", "all_gather", f"{_TITAN} torchtitan/config/job_config.py: "
                 "context_parallel_rotate_method = 'allgather' (torch's _AllGatherRotater: the K/V shards "
                 "all-gathered once, beside the first block's attention)"),
         Setting("pipeline_parallel_first_stage_less_layers", 1, f"{_TITAN} torchtitan/config/job_config.py: "
                 "pipeline_parallel_first_stage_less_layers: int = 1 (the embedding weighs one layer in "
                 "torchtitan/distributed/pipeline_parallel.py generate_llm_fqn_per_model_part)"),
         Setting("pipeline_parallel_last_stage_less_layers", 1, f"{_TITAN} torchtitan/config/job_config.py: "
                 "pipeline_parallel_last_stage_less_layers: int = 1 (the norm and output weigh one layer)"))),
    FrameworkProfile(
        "deepspeed",
        "Megatron-DeepSpeed on DeepSpeed's pipeline engine: blocking sends, activations partitioned over the TP "
        "ranks between stages, the 2021 Megatron layers, ZeRO 1 with float32 gradients, reduction after the "
        "last backward; the engine's instruction order is a schedule, deepspeed-1f1b (schedules/deepspeed_1f1b.py)",
        (Setting("blocking_p2p", True, "microsoft/DeepSpeed deepspeed/runtime/pipe/p2p.py: send() asserts "
                 "async_op == False"),
         Setting("scatter_gather", True, "microsoft/DeepSpeed deepspeed/runtime/pipe/engine.py: is_pipe_partitioned "
                 "= is_model_parallel (activations partitioned over the TP ranks, all-gathered at the receiver)"),
         Setting("tp_comm_overlap", False, f"{_MDS} megatron/mpu/layers.py (the 2021 ColumnParallelLinear)"),
         Setting("grad_accum_fusion", False, f"{_MDS} (no fused weight-gradient accumulation)"),
         Setting("zero", 1, "microsoft/DeepSpeed deepspeed/runtime/bf16_optimizer.py: the bf16 optimizer shards "
                 "its fp32 state over dp (ZeRO 1)"),
         Setting("grad_fp32", True, "the same bf16_optimizer.py: fp32 gradient accumulation and reduction"))),
)}


def profile(name: str) -> FrameworkProfile:
    """The profile of `name`; one line listing the known ones otherwise."""
    if name not in PROFILES:
        raise PipesimError(f"--framework {name!r}: choose one of {', '.join(PROFILES)}")
    return PROFILES[name]


def resolve(given: dict[str, object], name: str | None) -> dict[str, object]:
    """Every switch's value: the command line's where given (not None), else the profile's, else pipesim's default.
    A flag a user typed always wins; `given` holds None for a switch left out."""
    base = profile(name).values() if name else dict(DEFAULTS)
    return {k: (given[k] if given.get(k) is not None else base[k]) for k in DEFAULTS}
