"""The flags of what to simulate against (hardware, --nodes, --cost, links, dp/tp/cp/ep/etp, recomputation, sequence
parallelism, attention kernel, ZeRO, the layer split), shared by `simulate` and `sweep`."""

from __future__ import annotations

import argparse

from pipesim.comm.comm_options import DEFAULT_DEEPEP_SMS, CommOptions
from pipesim.comm.ub_overlap import UbConfig
from pipesim.commands.arg_types import bounded_int, positive_float, positive_int
from pipesim.commands.common import model_config
from pipesim.commands.cost_args import refuse_model_flags, refuse_without_links
from pipesim.commands.kernel_args import (
    adam_from_args,
    add_act_fp8_store_arg,
    add_ce_fusion_args,
    add_cp_comm_arg,
    add_cuda_graph_args,
    add_fp8_args,
    add_grad_args,
    add_optimizer_args,
    add_stack_kernel_args,
    add_ub_args,
    bf16_layers_from_args,
    check_fp8_run,
    cuda_graphs_from_args,
    fp8_from_args,
    muon_from_args,
    param_gather_from_args,
    ub_from_args,
)
from pipesim.commands.model_switches import refuse_unhonoured
from pipesim.commands.split_args import add_split_args, split_rule, typed_split
from pipesim.cost.device_profiles import profile_of
from pipesim.cost.table import parse_cost_spec
from pipesim.cost.zb_auto_costs import parse_memory_limit
from pipesim.errors import PipesimError
from pipesim.frameworks import DEFAULTS, PROFILES, resolve
from pipesim.hardware.machine import Hardware
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.kernel_switches import KernelSwitches
from pipesim.model.config import ModelConfig
from pipesim.model.options import ATTENTION, RECOMPUTE
from pipesim.model.recompute_modules import RECOMPUTE_MODULES
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.sim_setup import DEFAULT_HARDWARE, SimSetup, on_gpus


def add_setup_args(parser: argparse.ArgumentParser) -> None:
    """--hardware, --nvlink-domain, --nodes, --cost, --boundary-bytes, --activation-bytes, --comm, --dp, --tp, --cp,
    --ep, --etp, --layer-split, --recompute, --sequence-parallel, --attention, --zero (model flags separately)."""
    g = parser.add_argument_group("costs and machine")
    g.add_argument("--hardware", metavar="PRESET|FILE",
                   help=f"hardware preset or TOML file (default {DEFAULT_HARDWARE} with a model; none with --cost)")
    g.add_argument("--nodes", type=positive_int, default=None, metavar="N",
                   help="N nodes of the hardware's kind joined by its family's network (e.g. dgx-a100: 8x HDR "
                        "200 Gb/s per node; dgx-h100: 8x NDR 400 Gb/s); default the hardware's own")
    add_domain_arg(g)
    add_power_limit_arg(g)
    g.add_argument("--cost", metavar="SPEC",
                   help="hand-given seconds per microbatch for one rank's share of the model: F=1,B=2 or "
                        "F=1,I=1,W=1 (with v chunks per rank each chunk takes 1/v); FB=2.5 adds the seconds of an "
                        "overlapped forward + backward (OVERLAP_F_B, dualpipev; default F + B)")
    g.add_argument("--boundary-bytes", type=int, default=0, metavar="BYTES",
                   help="with --cost: bytes of each activation/gradient message (default 0)")
    g.add_argument("--activation-bytes", type=int, default=0, metavar="BYTES",
                   help="with --cost: bytes stashed per in-flight microbatch (default 0)")
    g.add_argument("--comm", choices=("links", "none"), default=None,
                   help="links: transfers hold the links for latency + bytes/bandwidth; none: free "
                        "(default links when hardware is known)")
    g.add_argument("--dp", type=positive_int, default=1, help="data-parallel replicas per stage (default 1)")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel shards per stage (default 1)")
    g.add_argument("--cp", type=positive_int, default=1,
                   help="context-parallel ranks per stage: each holds seq / cp tokens, ring attention (default 1)")
    add_cp_comm_arg(g)
    g.add_argument("--ep", type=positive_int, default=1, metavar="N",
                   help="expert-parallel ranks: experts sharded over N ranks (Megatron-core's "
                        "--expert-model-parallel-size); ep x etp must divide tp x cp x dp (default 1)")
    g.add_argument("--etp", type=positive_int, default=None, metavar="N",
                   help="tensor parallelism inside each expert (--expert-tensor-parallel-size; default --tp)")
    g.add_argument("--layer-split", type=_split_list, default=None, metavar="N,N,...",
                   help="layers per stage, one entry per chunk (p x v with interleaved or V placements), e.g. "
                        "3,2,2,1; a transformer's first and last entries may be 0 (only the embedding / head) "
                        "(default: even split, earlier stages take the remainder)")
    add_split_args(g)
    g.add_argument("--memory-limit", metavar="BYTES|Nx", default=None,
                   help="zb-auto / zb-2p: activations each rank may hold, in bytes (8GB, 7.5GiB) or as a multiple "
                        "of 1F1B's (2x); their order is rebuilt for the costs (default 1x for zb-auto, 2x zb-2p)")
    g.add_argument("--ilp", type=float, nargs="?", const=10.0, default=None, metavar="SECONDS", dest="ilp_time_limit",
                   help="zb-auto / zb-2p: also search the order by the Zero Bubble paper's ILP (HiGHS) for up to "
                        "SECONDS, warm-started by the heuristic, where p and m are small enough")
    f = parser.add_argument_group("memory and recomputation (transformer)")
    f.add_argument("--recompute", choices=RECOMPUTE, default="none",
                   help="activation recomputation, Megatron's meanings: selective re-runs the attention core, "
                        "full each layer's forward (default none)")
    f.add_argument("--recompute-modules", nargs="+", default=None, metavar="MODULE",
                   help="with --recompute selective: Megatron-core's submodules to recompute, "
                        f"{', '.join(RECOMPUTE_MODULES)} (docs/large_models.md; default core_attn)")
    add_act_fp8_store_arg(f)
    f.add_argument("--sequence-parallel", action="store_true",
                   help="sequence parallelism over the tp ranks (norm/dropout activations split; all-gather + "
                        "reduce-scatter instead of all-reduce)")
    f.add_argument("--attention", choices=ATTENTION, default=None,
                   help="attention kernel: flash stores no s x s scores, flash2 is FlashAttention-2 (PyTorch SDPA's "
                        "flash backend; slower than cuDNN / FlashAttention-3 on Hopper) (default flash on GPU "
                        "hardware at 16 bits, eager on CPUs and in float32)")
    f.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                   help="ZeRO stage over dp: 1 shards optimizer states (Megatron's distributed optimizer), 2 "
                        "gradients too, 3 parameters too (FSDP) (default --framework's, else 0: plain DDP)")
    add_stack_kernel_args(f)
    add_optimizer_args(f)
    f.add_argument("--no-async-tensor-model-parallel-allreduce", dest="tp_comm_overlap", action="store_false",
                   default=None,
                   help="GPU presets: the backward TP all-reduce / reduce-scatter of the input gradient blocks "
                        "instead of running under the weight-gradient GEMM (Megatron's flag of that name)")
    f.add_argument("--no-gradient-accumulation-fusion", dest="grad_accum_fusion", action="store_false",
                   default=None,
                   help="GPU presets: each microbatch's weight gradients written by their GEMM, then added into "
                        "the step's main_grad by a separate kernel, instead of the GEMM accumulating into it "
                        "(Megatron's flag of that name; its 2021 code, NAR21's runs, had no fusion)")
    add_ce_fusion_args(f)
    add_grad_args(f)
    add_ub_args(f)
    add_fp8_args(f)
    add_cuda_graph_args(f)
    add_comm_args(parser)


def add_comm_args(parser: argparse.ArgumentParser) -> None:
    """--scatter-gather, --overlap-grad-reduce, --ddp-bucket-size, --blocking-p2p (pipesim.comm.comm_options; simulate,
    sweep, plan)."""
    c = parser.add_argument_group("framework communication (Megatron-LM's options)")
    c.add_argument("--framework", choices=tuple(PROFILES), default=None,
                   help="a training stack's switches at once, each read from its source (docs/frameworks.md): "
                        + "; ".join(f"{p.name}: {p.summary}" for p in PROFILES.values())
                        + ". A flag given beside it wins (default: pipesim's own behaviour, the executor's)")
    c.add_argument("--scatter-gather", action="store_true", default=None,
                   help="with tp > 1 and no sequence parallelism each tp rank sends 1/t of a pipeline message over "
                        "its own link and the receiving tp ranks all-gather it (Megatron's default "
                        "scatter_gather_tensors_in_pipeline; --no-scatter-gather-tensors-in-pipeline turns it off "
                        "there) (default off: one rank sends the whole message, as pipesim's executor)")
    c.add_argument("--overlap-grad-reduce", action="store_true", default=None,
                   help="reduce each stage's data-parallel gradients in buckets as its last backward produces "
                        "them, overlapped with it (Megatron's flag; default off: one collective after it)")
    c.add_argument("--ddp-bucket-size", type=positive_int, default=None, metavar="PARAMS",
                   help="with --overlap-grad-reduce: parameters per gradient bucket (Megatron's flag; default "
                        "Megatron's max(40M, 1M x dp))")
    c.add_argument("--overlap-param-gather", action="store_true", default=None,
                   help="with the distributed optimizer (--zero 1/2) and --overlap-grad-reduce: the updated "
                        "parameters' all-gather runs before each chunk's first forward of the next step, overlapped "
                        "with the forwards before it, instead of after the optimizer (Megatron's flag)")
    c.add_argument("--overlap-p2p-communication", dest="overlap_p2p_comm", action="store_true", default=None,
                   help="with --blocking-p2p: an interleaved schedule's sends do not hold their rank (Megatron-core's "
                        "flag, on by default there and honoured by its interleaved schedule only)")
    c.add_argument("--no-overlap-p2p-communication", dest="overlap_p2p_comm", action="store_false", default=None,
                   help="an interleaved schedule's sends hold their rank, over --framework's overlap (Megatron-core's "
                        "flag: with --blocking-p2p, each waits for its bytes)")
    c.add_argument("--overlap-p2p-communication-warmup-flush", dest="overlap_p2p_warmup_flush", action="store_true",
                   help="with --overlap-p2p-communication: the interleaved schedule's warm-up and flush sends do not "
                        "hold their rank either (Megatron-core's flag, default off: they wait on their sends)")
    c.add_argument("--blocking-p2p", action="store_true", default=None,
                   help="each pipeline SEND holds its rank until its bytes have arrived, as Megatron's "
                        "p2p_communication does without --overlap-p2p-communication (batch_isend_irecv, wait, "
                        "torch.cuda.synchronize) (default off: the send overlaps the rank's next work, as "
                        "pipesim's executor and torch.distributed.pipelining)")
    m = parser.add_argument_group("mixture-of-experts token dispatch (Megatron-core's options)")
    m.add_argument("--moe-token-dispatcher-type", choices=("alltoall", "flex"), default="alltoall",
                   help="alltoall: NCCL all-to-all of each token's k copies; flex: the flex dispatcher, whose backend "
                        "--moe-flex-dispatcher-backend names (Megatron's allgather dispatcher is not modelled) "
                        "(default alltoall)")
    m.add_argument("--moe-flex-dispatcher-backend", choices=("deepep", "hybridep"), default=None,
                   help="with flex: DeepEP's kernels (one copy per destination rank, forwarded over NVLink across "
                        "nodes) or NVIDIA's Hybrid-EP (the same bytes, fewer SMs, one host wait per dispatch; "
                        "docs/moe.md) (default deepep)")
    m.add_argument("--moe-hybridep-num-sms", type=positive_int, default=None, metavar="N",
                   help="SMs Hybrid-EP's dispatch and combine kernels hold (default Hybrid-EP's own: 24 inside one "
                        "NVLink domain, 8 across domains)")
    m.add_argument("--moe-enable-deepep", action="store_true",
                   help="Megatron-core before 0.16's spelling of --moe-flex-dispatcher-backend deepep")
    m.add_argument("--moe-shared-expert-overlap", action="store_true",
                   help="the shared experts on a side stream beside the alltoall dispatcher's all-to-alls (Megatron's "
                        "flag: FC1 beside the dispatch, FC2 beside the combine, their gradients beside the backward's)")
    m.add_argument("--moe-deepep-num-sms", type=positive_int, default=DEFAULT_DEEPEP_SMS, metavar="N",
                   help=f"SMs DeepEP's kernels hold while they run, which the GEMMs beside them lose "
                        f"(default {DEFAULT_DEEPEP_SMS}, Megatron's)")


def comm_options_from_args(args: argparse.Namespace) -> CommOptions:
    """The CommOptions of the flags; one line naming the flags that disagree (flex needs its backend and back)."""
    flex = args.moe_token_dispatcher_type == "flex"
    backend = args.moe_flex_dispatcher_backend or ("deepep" if args.moe_enable_deepep else None)
    if backend is not None and not flex:
        raise PipesimError("--moe-flex-dispatcher-backend / --moe-enable-deepep need --moe-token-dispatcher-type flex")
    dispatcher = (backend or "deepep") if flex else "alltoall"  # deepep: Megatron's default flex backend
    return CommOptions(args.scatter_gather, args.overlap_grad_reduce, args.ddp_bucket_size, args.blocking_p2p,
                       moe_dispatcher=dispatcher, deepep_sms=args.moe_deepep_num_sms,
                       hybridep_sms=args.moe_hybridep_num_sms,
                       overlap_p2p_comm=args.overlap_p2p_comm, overlap_param_gather=args.overlap_param_gather,
                       overlap_p2p_warmup_flush=args.overlap_p2p_warmup_flush,
                       moe_shared_expert_overlap=args.moe_shared_expert_overlap)


def apply_framework(args: argparse.Namespace, *, keep: tuple[str, ...] = ()) -> argparse.Namespace:
    """Fill every framework switch the command line left out (None) from --framework's profile, else pipesim's
    default (pipesim.frameworks); `keep`: switches this command owns itself (plan's searched --zero). In place."""
    given = {k: getattr(args, k, None) for k in DEFAULTS}
    for k, v in resolve(given, getattr(args, "framework", None)).items():
        if k not in keep:
            setattr(args, k, v)
    return args


def apply_switches(args: argparse.Namespace, *, keep: tuple[str, ...] = ()) -> argparse.Namespace:
    """`apply_framework`, with the kernel flags that override a profile checked against what was typed (simulate,
    sweep, plan): --async-tp runs the backward collectives inside their matmuls (over a profile's blocking DTensor
    backward, never over a typed flag) and needs torch.compile; --eager-rmsnorm is what --compile fuses. In place."""
    if getattr(args, "async_tp", False):  # its backward collectives run inside their matmuls too
        if getattr(args, "tp_comm_overlap_ub", False):
            raise PipesimError("--async-tp is torch's overlap, --tp-comm-overlap Transformer Engine's: give one")
        if getattr(args, "tp_comm_overlap", None) is False:  # typed: a flag a user typed is never overridden
            raise PipesimError("--async-tp runs the backward collectives inside their matmuls: it cannot go with "
                               "--no-async-tensor-model-parallel-allreduce")
        args.tp_comm_overlap = True  # over the profile's (torchtitan's blocking DTensor backward)
    if getattr(args, "eager_rmsnorm", False) and args.kernel_fusion is True:  # --compile typed
        raise PipesimError("--eager-rmsnorm with --compile: torch.compile fuses the norm into one kernel each way")
    apply_framework(args, keep=keep)
    if getattr(args, "async_tp", False) and args.kernel_fusion is False:
        raise PipesimError("--async-tp needs torch.compile (--compile): torchtitan's async TP is a compiler pass")
    return args


def kernel_switches(args: argparse.Namespace) -> KernelSwitches:
    """The KernelSwitches of the kernel flags (simulate, sweep, plan), after `apply_switches` filled the framework's:
    torchtitan's async TP as the ring-exchange overlap it is timed as, else TE's userbuffers when asked for."""
    return KernelSwitches(args.kernel_fusion, args.tp_comm_overlap, args.grad_accum_fusion, args.grad_fp32,
                          UbConfig.torch_async_tp() if args.async_tp else ub_from_args(args), ce_fusion=args.ce_fusion,
                          ce_impl=args.ce_impl, eager_rmsnorm=args.eager_rmsnorm, dtensor_tp=args.dtensor_tp,
                          cuda_graphs=cuda_graphs_from_args(args),
                          te_linear=getattr(args, "transformer_impl", None) == "transformer_engine")


def sim_job(args: argparse.Namespace, model: ModelConfig | None, hardware: Hardware | None) -> Job:
    """The Job of simulate's and sweep's flags (its pp: each schedule's), with the main gradients' dtype checked
    against `model` (None: hand-given costs) and the attention kernel decided for the hardware."""
    apply_switches(args)
    dims = ParallelDims(dp=args.dp, tp=args.tp, cp=args.cp, ep=args.ep, etp=args.etp)
    fp8 = fp8_from_args(args)
    job = Job(dims, recompute=args.recompute, sp=args.sequence_parallel,
              attention=args.attention, zero=args.zero, comm=comm_options_from_args(args),
              kernels=kernel_switches(args),
              recompute_modules=tuple(args.recompute_modules or ()), fp8=fp8,
              cp_comm=args.cp_comm_type, fsdp_reshard=args.fsdp_reshard,
              fp8_param_gather=param_gather_from_args(args, fp8), adam_states=adam_from_args(args),
              act_fp8_store=args.act_fp8_store, bf16_layers=bf16_layers_from_args(args), muon=muon_from_args(args))
    job.check_gradients(model)
    check_fp8_run(job.fp8, model, hardware)
    return job.resolve_attention(on_gpus(hardware), model)


def _split_list(text: str) -> list[int]:
    """`0,2,2,0` -> [0, 2, 2, 0]: layers per chunk (>= 0; split_layers says which may be 0)."""
    return [bounded_int(t, 0) for t in text.split(",") if t.strip()]


def add_domain_arg(group) -> None:
    """--nvlink-domain G (simulate, sweep, plan)."""
    group.add_argument("--nvlink-domain", type=positive_int, default=None, metavar="G",
                       help="the job fills G GPUs of each node's NVLink domain before the next node's (gb200-nvl72: "
                            "Slurm's --segment trays x 4, e.g. 64 of a rack's 72; default all of them)")


def add_power_limit_arg(group) -> None:
    """--power-limit W (simulate, sweep, plan)."""
    group.add_argument("--power-limit", type=positive_float, default=None, metavar="W",
                       help="GPU presets: the GPUs capped at W watts (nvidia-smi -pl), their tensor clock "
                            "interpolated between the boards the family's datasheet rates (H100: the 400 W NVL, "
                            "the 700 W SXM; docs/gpu_model.md)")


def capped(hardware: Hardware, watts: float) -> Hardware:
    """`hardware` at `watts`, checked now so that a limit the family cannot honour is refused in one line."""
    out = hardware.with_power_limit(watts)
    profile_of(out.device.family, out.device.kernels)
    return out


def setup_from_args(args: argparse.Namespace) -> SimSetup:
    """Turn the shared flags into a SimSetup (loads the hardware, parses --cost; sim_job applies --framework)."""
    if args.boundary_bytes < 0 or args.activation_bytes < 0:
        raise PipesimError("--boundary-bytes and --activation-bytes must be >= 0")
    cost = parse_cost_spec(args.cost) if args.cost is not None else None
    if cost is not None:  # the seconds are given: a model's flags would size nothing
        refuse_model_flags(args)
    elif args.boundary_bytes or args.activation_bytes:  # a model's own sizes are its messages and activations
        flag = "--boundary-bytes" if args.boundary_bytes else "--activation-bytes"
        raise PipesimError(f"{flag} sizes --cost's stages; a model's messages and activations come from the model")
    hw_name = args.hardware or (None if cost is not None else DEFAULT_HARDWARE)
    hardware = load_hardware(hw_name) if hw_name else None
    if args.nvlink_domain is not None:
        if hardware is None:
            raise PipesimError("--nvlink-domain needs --hardware (or a model, costed on the default hardware)")
        hardware = hardware.with_domain(args.nvlink_domain)
    if args.nodes is not None:
        if hardware is None:
            raise PipesimError("--nodes needs --hardware (or a model, costed on the default hardware)")
        hardware = hardware.with_nodes(args.nodes)
    if args.power_limit is not None:
        if hardware is None:
            raise PipesimError("--power-limit needs --hardware (or a model, costed on the default hardware)")
        hardware = capped(hardware, args.power_limit)
    comm = (args.comm or "links") == "links" and hardware is not None
    if cost is not None:
        refuse_without_links(args, comm)
    model = None if cost is not None else model_config(args)
    refuse_unhonoured(args, model, hardware)  # typed switches the model (or the hardware) has nothing for
    split = tuple(args.layer_split) if args.layer_split else None
    if split and cost is not None:
        raise PipesimError("--layer-split needs a model (--model), not --cost")
    typed = typed_split(args)  # before --framework fills its switches
    job = sim_job(args, model, hardware)
    return SimSetup(hardware, model, cost, args.boundary_bytes, args.activation_bytes, comm, job, layer_split=split,
                    split_rule=split_rule(args, typed, model, explicit=split is not None),
                    memory_limit=parse_memory_limit(args.memory_limit) if args.memory_limit else None,
                    ilp_time_limit=ilp_seconds(args))


def ilp_seconds(args) -> float | None:
    """--ilp SECONDS, checked (positive; only zb-auto and zb-2p are searched)."""
    seconds = getattr(args, "ilp_time_limit", None)
    if seconds is not None and not seconds > 0:
        raise PipesimError(f"--ilp takes a positive number of seconds, got {seconds:g}")
    return seconds
