"""From a model and a machine to per-stage seconds: FLOPs and bytes per layer, roofline per action.

Each stage is a list of pieces (MLP layers; or embedding, transformer blocks, head). A piece knows
its FLOPs for F, I (gradient wrt input) and W (gradient wrt weights), the bytes it moves, what it
stashes for backward and its parameters. The transformer's FLOPs, stash, parameters and tensor-
parallel collectives come from the model layer (pipesim/model/: recomputation, sequence and context
parallelism, flash attention, GQA, SwiGLU); the memory traffic that feeds the calibrated CPU timing
stays the estimate it was fitted with. See docs/cost_model.md and docs/large_models.md. What a stage does
(pieces, FLOPs, bytes, collectives) is pipesim/cost/stage_work.py; this module turns it into seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import accumulate

from pipesim.comm.expert_exchange import ExpertExchange
from pipesim.comm.tp_collective import TpCollective
from pipesim.cost.device_profiles import profile_of
from pipesim.cost.fp8_amax import amax_reductions
from pipesim.cost.fp8_costs import fp8_stage_costs, stage_fp8_expert_params, with_weight_casts
from pipesim.cost.host_issue import NO_HOST_ISSUE, stage_host_issue
from pipesim.cost.kernel_costs import StageSeconds, gpt_stage_seconds, mlp_stage_seconds
from pipesim.cost.muon_step import MuonStage, muon_stage
from pipesim.cost.shared_overlap import beside_exchanges, check_shared_overlap, shared_seconds
from pipesim.cost.stage_work import Work, gpt_stage_work, mlp_stage_work
from pipesim.cost.step_costs import StepCosts, ring_exchanges, step_costs
from pipesim.cost.table import CostTable, StageCosts
from pipesim.cost.tp_hiding import stage_tp_collectives
from pipesim.device.fp8_rates import check_fp8_recipe
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.job import Job
from pipesim.model.adam_states import AdamStates
from pipesim.model.config import ModelConfig, split_layers
from pipesim.model.flops import attention_core_flops
from pipesim.model.fp8 import Fp8Options
from pipesim.model.layer_kinds import StageLayers, stage_layers
from pipesim.model.memory import Precision, comm_buffer_bytes, named_precision
from pipesim.model.moe_layer import tokens_here
from pipesim.model.muon_options import MuonOptions
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import embedding_copy_params
from pipesim.model.weight_tensors import split_tensors

GiB = 2**30
DEFAULT_JOB = Job()  # one rank per stage, no option: what a bare call costs


def precision_of(model: ModelConfig, grad_fp32: bool | None = None, adam: AdamStates | None = None,
                 fp8: Fp8Options | None = None) -> str:
    """The training state's precision (a name pipesim.model.memory.named_precision reads): float32 training
    ("fp32"), else 16-bit mixed precision with 16-bit main gradients ("mixed") or float32 ones ("megatron":
    Megatron's --accumulate-allreduce-grads-in-fp32), with the precision-aware optimizer's states when `adam` is
    given (their bytes depend on the dtype and the FP8 recipe: pipesim.model.adam_states).

    grad_fp32 None: Megatron-LM's default, float32 main gradients for bfloat16 ("bfloat16 requires gradient
    accumulation and all-reduce to be done in fp32", megatron/training/arguments.py; torchtitan's FSDP reduces in
    float32 too) and 16-bit ones for float16; False is Megatron's --grad-reduce-in-bf16."""
    if model.dtype == "float32":
        return "fp32"
    if grad_fp32 is None:
        grad_fp32 = model.dtype == "bfloat16"
    base = "megatron" if grad_fp32 else "mixed"
    if adam is None:
        return base
    return f"{base}+{adam.tag(dtype=model.dtype, fp8_recipe=fp8.recipe if fp8 is not None else None)}"


@dataclass(frozen=True)
class ParallelCosts:
    """A CostTable plus what the job's tensor, data and context parallelism add around it."""

    table: CostTable  # per-stage seconds (already divided across tp) and bytes
    job: Job  # the job the costs were built for: dp, tp, cp, ZeRO, the transformer's and comm options
    # (stage, "F"|"B"|"I"|"W") -> the tp collectives inside that action: blocking (beside None), or beside a GEMM
    # whose SMs they share (a fused backward on the kernel path; pipesim.comm.overlap_interference)
    tp_collectives: dict[tuple[int, str], tuple[TpCollective, ...]]
    dp_grad_bytes: tuple[int, ...]  # per stage: gradient bytes all-reduced across dp at step end
    layers_per_stage: tuple[int, ...]  # MLP layers / transformer blocks per stage (0: unknown)
    dtype_bytes: int = 4  # bytes per parameter value (to count parameters from param_bytes)
    # the memory model (pipesim.cost.rank_memory): exact parameters per stage, how the state is held, buffers
    param_counts: tuple[int, ...] = ()  # parameters per stage on one tp rank (empty: param_bytes / dtype_bytes)
    precision: str = "fp32"  # a name pipesim.model.memory.named_precision reads
    comm_buffer_bytes: int = 0  # P2P / collective buffers every rank holds at once (an estimate)
    step: StepCosts | None = None  # per-stage DP collectives and optimizer seconds (pipesim.cost.step_costs)
    # (stage, "F"|"I"|"B"|"W") -> ring attention's K/V hops inside that action (pipesim.cost.step_costs.ring_exchanges)
    cp_exchanges: dict = field(default_factory=dict)
    # (stage, "F"|"I"|"B"|"W") -> seconds that action gains when it runs wholly beside a data-parallel collective,
    # whose NCCL channels hold SMs its GEMMs lose (kernel path with a channel figure; empty: such overlap is free)
    sm_share: dict = field(default_factory=dict)
    # (stage, "F"|"I"|"B"|"W") -> the expert-parallel all-to-alls inside that action (pipesim.comm.expert_exchange)
    ep_exchanges: dict = field(default_factory=dict)
    expert_param_counts: tuple[int, ...] = ()  # per stage, of param_counts: the routed experts' (ZeRO over edp)
    fp8_weight_bytes: tuple[int, ...] = ()  # per stage: FP8 copies of its linear weights (empty: no FP8)
    # per stage, of param_counts: the FP8 linears' parameters, kept in FP8 (--fp8-param-gather; empty otherwise)
    fp8_param_counts: tuple[int, ...] = ()
    # per stage, of param_counts: an embedding copy a rank holding a first stage too shares (embedding_copy_params)
    embedding_copy_counts: tuple[int, ...] = ()
    # per stage under --optimizer muon / dist_muon: the largest optimizer state a rank keeps of it (bytes; empty: Adam's
    # states, from the counts)
    muon_state_bytes: tuple[int, ...] = ()


def model_costs(model: ModelConfig, num_stages: int, microbatches: int, hw: Hardware, job: Job = DEFAULT_JOB, *,
                layer_split: list[int] | None = None) -> ParallelCosts:
    """Per-stage costs of `model` cut into `num_stages` stages (chunks) on `hw` under `job` (checked here, once).

    Durations: on a device with a `family` (GPU presets), each kernel timed from its shape
    (pipesim.cost.kernel_costs; the job's `kernels.fusion`: Megatron's fused elementwise kernels, else eager
    PyTorch's), and with `kernels.tp_comm_overlap` a fused backward's input-gradient collectives carry
    the GEMM they hide behind (TpCollective.beside); each microbatch's gradients are added into
    main_grad inside the wgrad GEMMs with `kernels.grad_accum_fusion`, else by separate kernels
    (pipesim.model.grad_accumulation), in float32 with `kernels.grad_fp32` (also the dp reduction's and the
    memory's gradient bytes: precision "megatron"); otherwise the roofline at compute_efficiency. The job's
    sp, cp, recompute, attention: the transformer's options (pipesim.model.options.LayerOptions); zero: the
    ZeRO stage of the data-parallel state (memory; its timing: "step").
    """
    if not isinstance(num_stages, int) or isinstance(num_stages, bool) or num_stages < 1:
        raise PipesimError(f"stages must be a positive integer, got {num_stages!r}")
    b = job.microbatch_size(model, microbatches)  # every check against the model
    opts = job.layer_options(model)
    if job.fp8 is not None:  # FP8 tensor cores, and a recipe Transformer Engine runs there (one line otherwise)
        check_fp8_recipe(hw.device.family, job.fp8.recipe, hw.device.name)
    tp, dp, kernels = job.dims.tp, job.dims.dp_cp, job.kernels  # dp: the dense gradients' replicas (dp x cp)
    if kernels.ub is not None and not hw.device.family:  # userbuffers ride on GEMMs the kernel path times
        raise PipesimError(f"--tp-comm-overlap times each GEMM kernel by kernel: {hw.name} has no GPU device family "
                           "(use a GPU preset)")
    if job.comm.moe_shared_expert_overlap:
        check_shared_overlap(model, hw, opts)
    if (model.hybrid or model.linear_attention) and not hw.device.family:  # no CPU fit or executor op count
        what = "a hybrid model's Mamba layers are" if model.hybrid else "linear attention (Gated DeltaNet) is"
        raise PipesimError(f"{what} timed kernel by kernel: {hw.name} has no GPU device family (use a GPU preset)")
    split = split_layers(model.layers, num_stages, layer_split)
    mixes = stage_layers(model, split)  # each stage's layers by kind (pipesim.model.layer_kinds)
    # per stage: its layers --first-last-layers-bf16 keeps in bf16; the FP8 parts are the rest
    bf16 = _bf16_layers_per_stage(model, split, job)
    if model.window_size is not None or model.nope_every:  # variant layers: kernel by kernel, all in the one part
        _check_variant(model, hw, bf16)
    bf16_opts = job.bf16_layer_options(model) if any(k.layers for k in bf16) else None
    fp8_mixes = [mix.minus(k) for mix, k in zip(mixes, bf16, strict=True)]
    fp8_memory, fp8_seconds, fp8_counts = fp8_stage_costs(model, b, opts, hw, fp8_mixes) if opts else ((), (), ())
    fp8_params = fp8_counts if job.fp8_param_gather else ()  # kept and gathered in FP8
    # of those, the routed experts': gathered over the expert-data-parallel group with their state
    fp8_experts = tuple(stage_fp8_expert_params(model, b, opts, hw.device.family, mix) for mix in fp8_mixes) \
        if fp8_params and model.moe is not None else ()
    d = model.dtype_bytes
    precision = precision_of(model, kernels.grad_fp32, job.adam_states, job.fp8)
    recipe = job.fp8.recipe if job.fp8 is not None else None  # whose FP8 GEMM figures a hiding GEMM is timed on
    stages: list[StageCosts] = []
    collectives: dict[tuple[int, str], tuple[TpCollective, ...]] = {}
    grads: list[int] = []
    counts: list[int] = []
    exchanges: dict[tuple[int, str], tuple] = {}
    shared: dict[tuple[int, str], float] = {}
    if opts is None:
        boundary = b * model.hidden * d  # bytes
        buffers = 2 * boundary if num_stages > 1 else 0
    else:  # with sp the boundary is already split over tp; with cp each rank holds s / cp tokens
        boundary = opts.seq_sharded(b * opts.local_seq(model) * model.hidden * d)
        buffers = comm_buffer_bytes(model, b, opts, dp=dp, zero=job.zero, precision=named_precision(precision))
    experts: list[int] = []
    ep_exchanges: dict[tuple[int, str], tuple[ExpertExchange, ...]] = {}
    grad_bytes = named_precision(precision).grad_bytes
    for s, layers in enumerate(split):
        last = s == num_stages - 1
        # the stage's parts, each (its work, its kernel seconds, the FP8 recipe its GEMMs run): the layers in FP8
        # with the embedding, head and MTP modules, then the bf16 layers (--first-last-layers-bf16)
        parts: list[tuple[Work, StageSeconds | None, str | None]] = []
        for part_opts, mix, ends in ((opts, fp8_mixes[s], True), (bf16_opts, bf16[s], False)):
            if mix.layers == 0 and not ends:
                continue
            if opts is None:
                part = mlp_stage_work(model, b, mix.layers, tp, first=s == 0)
            else:
                part = gpt_stage_work(model, b, mix, first=s == 0 and ends, last=last and ends, opts=part_opts,
                                      executor_ops=hw.host is not None)
            part_timed = _kernel_seconds(model, b, mix, hw, part_opts, tp, first=s == 0 and ends, last=last and ends,
                                         fused=kernels.fusion, grad_fusion=kernels.grad_accum_fusion,
                                         grad_bytes=grad_bytes, ce_fusion=kernels.cross_entropy)
            parts.append((part, part_timed, recipe if part_opts is opts else None))
        for part, part_timed, part_recipe in parts:  # each part's collectives hide behind its own GEMMs
            for key, colls in stage_tp_collectives(s, part, part_timed, part_recipe, kernels, model.dtype, hw).items():
                collectives[key] = collectives.get(key, ()) + colls
        for kind, colls in amax_reductions(job.fp8, fp8_mixes[s].layers if opts is not None else 0,
                                           first_stage=s == 0).items():  # delayed scaling's, over the whole stage
            collectives[(s, kind)] = collectives.get((s, kind), ()) + colls
        work, timed = parts[0][0], parts[0][1]
        for part, part_timed, _ in parts[1:]:
            work.absorb(part)
            timed = timed.plus(part_timed) if timed is not None and part_timed is not None else timed
        if timed is None and mixes[s].moe_layers and hw.host is None:  # a calibrated CPU host: its roofline, as dense
            raise PipesimError(f"mixture-of-experts layers are timed kernel by kernel: {hw.name} has no GPU device "
                               "family (use a GPU preset)")
        if timed is None:
            fwd, inp, wgt = (hw.compute_time(work.flops[k], work.moved[k], model.dtype, k, work.ops[k])
                             for k in "FIW")
        else:  # the kernels' seconds plus the per-action (and per-op) overheads of the cost equation
            fwd, inp, wgt = (t + hw.compute_time(0.0, 0.0, model.dtype, k, work.ops[k])
                             for t, k in zip(timed.phases(), "FIW"))
        # a MoE layer's launches and waits (a calibrated CPU host's ops are in its equation)
        host = stage_host_issue(model, opts, mixes[s].moe_layers, hw.host_launch) \
            if timed is not None and opts is not None else NO_HOST_ISSUE
        fwd, inp, wgt = (t + gap for t, gap in zip((fwd, inp, wgt), host.waits, strict=True))
        issue = host.issue
        rerun = _split_rerun(hw, model.dtype, work) if timed is None and s > 0 else 0.0
        if s == 0:  # no gradient leaves the first stage: a split I has nothing to send, W runs the whole backward
            inp, wgt = 0.0, inp + wgt
            issue = (issue[0], 0.0, issue[1] + issue[2])
        if timed is not None and dp > 1:
            _add_sm_share(shared, s, timed)
        param_bytes = round(work.param_count * d)
        counts.append(round(work.param_count))
        stages.append(StageCosts(forward=fwd, backward_input=inp, backward_weight=wgt,
                                 boundary_bytes=0 if last else boundary,
                                 activation_bytes=round(work.activation_bytes), param_bytes=param_bytes,
                                 flops_forward=work.flops["F"], weight_ops=work.ops["W"],
                                 backward_ops=work.ops["I"] + work.ops["W"],
                                 recompute_bytes=round(work.recompute_bytes), host_seconds=issue,
                                 split_rerun=rerun))
        grads.append(param_bytes if dp > 1 else 0)
        experts.append(round(work.expert_params))
        if opts is not None and work.ep_exchanges["F"]:  # with the shared experts' seconds beside them, overlapped
            beside = shared_seconds(model, b, opts, kernels.fusion, hw.device.family, hw.device.kernels) \
                if job.comm.moe_shared_expert_overlap else None
            _add_exchanges(ep_exchanges, s, model, b, opts, work, beside)
        if opts is not None and opts.cp > 1:
            _add_ring(exchanges, s, model, b, opts, layers, hw, timed)
    muon = muon_stages(model, split, job, hw, opts, named_precision(precision)) \
        if job.muon is not None else ()
    return ParallelCosts(table=CostTable(tuple(stages)), job=job, tp_collectives=collectives,
                         dp_grad_bytes=tuple(grads), layers_per_stage=tuple(split), dtype_bytes=d,
                         param_counts=tuple(counts), precision=precision, comm_buffer_bytes=buffers,
                         cp_exchanges=exchanges, sm_share=shared, ep_exchanges=ep_exchanges,
                         expert_param_counts=tuple(experts) if model.moe is not None else (),
                         fp8_weight_bytes=fp8_memory, fp8_param_counts=fp8_params,
                         embedding_copy_counts=tuple(embedding_copy_params(model, tp, first=s == 0,
                                                                           last=s == num_stages - 1)
                                                     for s in range(num_stages)),
                         step=with_weight_casts(_step(counts, job, hw=hw, precision=precision,
                                                      loss_scaling=model.dtype == "float16",
                                                      experts=experts if model.moe is not None else (),
                                                      fp8_params=fp8_params, fp8_experts=fp8_experts,
                                                      muon=muon), fp8_seconds),
                         muon_state_bytes=tuple(m.state_bytes for m in muon))


def check_muon_device(muon: MuonOptions | None, hw: Hardware) -> None:
    """One line unless Muon's step can be timed on `hw`: its GEMMs and passes kernel by kernel need a GPU family."""
    if muon is not None and not hw.device.family:
        raise PipesimError(f"--optimizer {muon.name} is timed on a transformer's tensors kernel by kernel: {hw.name} "
                           "has no GPU device family (use a GPU preset)")


def muon_stages(model: ModelConfig, split: list[int], job: Job, hw: Hardware, opts: LayerOptions | None,
                precision: Precision) -> tuple[MuonStage, ...]:
    """Each stage's Muon step (pipesim.cost.muon_step) from its tensors (pipesim.model.weight_tensors)."""
    assert job.muon is not None
    if opts is None:
        raise PipesimError(f"--optimizer {job.muon.name} is timed on a transformer's tensors kernel by kernel: give "
                           "--model gpt or --model-config")
    check_muon_device(job.muon, hw)
    profile = profile_of(hw.device.family, hw.device.kernels)
    return tuple(muon_stage(tensors, model, opts.tp, job.muon, dp=job.dims.dp_cp, edp=job.dims.edp,
                            precision=precision, profile=profile)
                 for tensors in split_tensors(model, opts, split))


def _step(counts: list[int], job: Job, *, hw: Hardware, precision: str, loss_scaling: bool,
          experts: list[int] | tuple[()] = (), fp8_params: tuple[int, ...] = (),
          fp8_experts: tuple[int, ...] = (), muon: tuple[MuonStage, ...] = ()) -> StepCosts | None:
    """The optimizer step and ZeRO's collectives, on device presets (or when --zero is asked for). A calibrated
    CPU host predicts the pipeline span its validation measures (pipesim/calibration): nothing is added there.
    `loss_scaling`: float16 trains under a loss scale (Megatron's grad scaler), whose unscale is a pass of its own."""
    if hw.host is not None and job.zero == 0 and job.muon is None:
        return None
    return step_costs(counts, job, hw=hw, precision=precision, loss_scaling=loss_scaling, experts_per_stage=experts,
                      fp8_per_stage=fp8_params, fp8_experts_per_stage=fp8_experts, muon_stages=muon)


def _check_variant(model: ModelConfig, hw: Hardware, bf16: list[StageLayers]) -> None:
    """A model with sliding-window or NoPE layers: timed kernel by kernel (a GPU preset) or as the executor runs them
    on a calibrated CPU host (its masked SDPA: the whole square, pipesim.cost.stage_work), its layers in one
    precision."""
    what, verb = ("sliding-window attention", "is") if model.window_size is not None else \
        ("NoPE layers (nope_every)", "are")
    if not hw.device.family and hw.host is None:
        raise PipesimError(f"{what} {verb} timed kernel by kernel or on a calibrated CPU host: {hw.name} has neither a "
                           "GPU device family nor a [host] (use a GPU preset or local-cpu)")
    if any(k.layers for k in bf16):
        raise PipesimError(f"--first-last-layers-bf16 with {what} is not modelled")


def _bf16_layers_per_stage(model: ModelConfig, split: list[int], job: Job) -> list[StageLayers]:
    """Per stage (chunk, in model order): its layers --first-last-layers-bf16 keeps in bf16, by kind; none everywhere
    without it."""
    if job.bf16_layers is None or model.kind != "gpt":
        return [StageLayers()] * len(split)
    return [job.bf16_layers.in_chunk(model, start, n) for start, n in zip(accumulate([0, *split]), split)]


def _add_exchanges(out: dict, stage: int, model: ModelConfig, b: int, opts: LayerOptions, work: Work,
                   beside: tuple[float, float, float, float] | None = None) -> None:
    """The stage's all-to-alls keyed like its tp collectives (the backward's in B and I; W on stage 0), each kind
    once with the number of layers doing it; `beside`: the shared experts' seconds beside them
    (pipesim.cost.shared_overlap)."""
    moe = model.moe
    assert moe is not None
    tokens = tokens_here(model, b, opts)

    def grouped(colls) -> tuple[ExpertExchange, ...]:
        counts: dict[str, int] = {}
        for c in colls:
            counts[c.what] = counts.get(c.what, 0) + 1
        return tuple(ExpertExchange(what, tokens, model.hidden, moe.top_k, moe.experts, model.dtype_bytes,
                                    moe.load_factor(), n, moe.groups, moe.group_topk or 0)
                     for what, n in counts.items())

    keyed = {"F": grouped(work.ep_exchanges["F"])}
    if work.ep_exchanges["I"]:
        backward = grouped(work.ep_exchanges["I"])
        keyed |= {"W" if stage == 0 else "I": backward, "B": backward}
    for kind, exchanges in keyed.items():
        out[(stage, kind)] = beside_exchanges(exchanges, beside, kind) if beside is not None else exchanges


def _kernel_seconds(model: ModelConfig, b: int, mix: StageLayers, hw: Hardware, opts: LayerOptions | None, tp: int,
                    *, first: bool, last: bool, fused: bool, grad_fusion: bool = True, grad_bytes: int = 0,
                    ce_fusion: str = "unfused") -> StageSeconds | None:
    """The stage's kernel seconds on the hardware's device family; None without one (the roofline path)."""
    family = hw.device.family
    if not family:
        return None
    if opts is None:
        return mlp_stage_seconds(model, b, mix.layers, tp, first=first, family=family, kernels=hw.device.kernels)
    return gpt_stage_seconds(model, b, mix, opts, first=first, last=last, fused=fused, family=family,
                             kernels=hw.device.kernels, grad_fusion=grad_fusion, grad_bytes=grad_bytes,
                             ce_fusion=ce_fusion)


def _split_rerun(hw: Hardware, dtype: str, work: Work) -> float:
    """Seconds a split W of the stage adds on a calibrated CPU host, where the executor's checkpoint re-runs full
    recomputation's forward in W as in I (Work.split_rerun), charged by the host's equation as W work; 0 elsewhere
    (on a GPU preset pipesim times the stacks users run there, not this executor)."""
    rr = work.split_rerun
    if hw.host is None or not (rr["flops"] or rr["ops"]):
        return 0.0
    alone = hw.compute_time(work.flops["W"], work.moved["W"], dtype, "W", work.ops["W"])
    return hw.compute_time(work.flops["W"] + rr["flops"], work.moved["W"] + rr["moved"], dtype, "W",
                           work.ops["W"] + rr["ops"]) - alone


def _add_sm_share(out: dict, stage: int, timed: StageSeconds) -> None:
    """The seconds each action of the stage gains beside a data-parallel collective (its kernels' `beside` less
    their time alone); the first stage's I runs inside its W, as its costs put it. Nothing when they are equal."""
    f, i, w = (b - a for a, b in zip((timed.F, timed.I, timed.W), timed.beside))
    if stage == 0:
        i, w = 0.0, i + w
    for kind, extra in (("F", f), ("I", i), ("W", w), ("B", i + w)):
        if extra > 0:
            out[(stage, kind)] = extra


def _add_ring(out: dict, stage: int, model: ModelConfig, b: int, opts: LayerOptions, layers: int,
              hw: Hardware, timed: StageSeconds | None = None) -> None:
    """Ring attention's hops of a stage, keyed like the tp collectives (its backward in B and I; W on stage 0).

    The hops hide behind the attention kernels: their seconds from the kernel path when the device
    has a family, else the attention FLOPs at the cost equation's rates."""
    if timed is not None and "flash attention" in timed.gemms:
        forward, backward = timed.gemms["flash attention"], timed.gemms["flash attention backward"]
    else:
        core = attention_core_flops(model, b, opts, causal=True)  # what a causal kernel computes
        rates = hw.cost_equation(model.dtype).flop_rates  # FLOP/s of F, I, W work
        forward, backward = core.F / rates[0], core.I / rates[1]
    ring = ring_exchanges(model, b, opts, layers=layers, attention_forward=forward, attention_backward=backward)
    if "F" in ring:
        out[(stage, "F")] = ring["F"]
    if "I" in ring:
        out[(stage, "W" if stage == 0 else "I")] = out[(stage, "B")] = ring["I"]


def uniform_costs(num_stages: int, spec: dict[str, float], boundary_bytes: int = 0,
                  job: Job = DEFAULT_JOB) -> ParallelCosts:
    """Hand-given costs (`parse_cost_spec` output: seconds of F, I, W), the same on every stage, for `job` (its
    communication options and pipeline size; hand-given costs know no model, so no other option)."""
    table = CostTable.uniform(num_stages, spec["F"], spec["I"], spec["W"], boundary_bytes=boundary_bytes)
    if "FB" in spec:  # seconds of an overlapped forward + backward (OVERLAP_F_B)
        table = replace(table, overlap_given=spec["FB"])
    return ParallelCosts(table=table, job=job, tp_collectives={}, dp_grad_bytes=(0,) * num_stages,
                         layers_per_stage=(0,) * num_stages)


__all__ = ["DEFAULT_JOB", "ParallelCosts", "check_muon_device", "model_costs", "muon_stages", "precision_of",
           "uniform_costs"]
