"""The winner, three ways: the exact `pipesim simulate` command, Megatron-LM's arguments and a torchtitan TOML section
(pipesim.plan.torchtitan_export; names as each project spells them). Schedules a project lacks are said so in a
comment; so is context parallelism in the `pipesim run` command (the executor has none).
"""

from __future__ import annotations

import shlex

import schedules
from pipesim.ir import torch_csv
from pipesim.ir.schedule import Schedule
from pipesim.model.config import ModelConfig, split_layers
from pipesim.model.executor_scope import unbuilt_structure, unrun_expert_layout
from pipesim.model.fp8 import TORCHAO_ONLY
from pipesim.model.megatron_layout import LAYOUT, megatron_layout
from pipesim.model.moe_layer_freq import FLAG as FREQ
from pipesim.model.moe_layer_freq import megatron_pattern
from pipesim.model.op_recompute import OP
from pipesim.model.options import FUSED_ATTENTION
from pipesim.plan.space import Candidate, PlanRequest
from pipesim.plan.stack_space import MEGATRON_SCHEDULES

# stacks whose Megatron-LM is the 2021 code: full recomputation is --checkpoint-activations (NVIDIA/Megatron-LM @
# 46c74b4 megatron/arguments.py; bigscience-workshop/Megatron-DeepSpeed @ 119a0d2 the same), no distributed optimizer
MEGATRON_2021 = ("megatron-lm-2021", "deepspeed")
MEGATRON_LEGACY = (*MEGATRON_2021, "megatron-lm-2022")  # before Megatron-core's --pipeline-model-parallel-layout


def simulate_command(c: Candidate, model_flags: list[str], hardware_flags: list[str],
                     attention: str | None = None, grad_fp32: bool | None = None) -> list[str]:
    """argv of `pipesim simulate` for `c` (model and hardware flags as the plan was given them; `--attention`
    and the main gradients' flag when the plan was asked for them)."""
    argv = ["pipesim", "simulate", c.schedule, "--stages", str(c.p), "--microbatch-size", str(c.mbs),
            "--tp", str(c.tp), "--dp", str(c.dp)]
    if c.cp > 1:
        argv += ["--cp", str(c.cp)]
    if c.ep > 1:
        argv += ["--ep", str(c.ep)]
    if c.etp:
        argv += ["--etp", str(c.etp)]
    if c.v > 1:
        argv += ["--virtual", str(c.v)]
    argv += ["--recompute", c.recompute, "--zero", str(c.zero)]
    if c.modules:
        argv += ["--recompute-modules", *c.modules]
    if c.sp:
        argv.append("--sequence-parallel")
    if attention:
        argv += ["--attention", attention]
    return argv + grad_flags(grad_fp32) + model_flags + hardware_flags


def grad_flags(grad_fp32: bool | None) -> list[str]:
    """Megatron-LM's flag for the main gradients' dtype when one was chosen (None: the dtype's default)."""
    if grad_fp32 is None:
        return []
    return ["--accumulate-allreduce-grads-in-fp32"] if grad_fp32 else ["--grad-reduce-in-bf16"]


def run_command(c: Candidate, model_flags: list[str], *, per_node: int, nodes: int,
                split: list[int] | None = None) -> list[str]:
    """argv of `pipesim run` that trains `c` for real with NCCL: the same command on each of `nodes` nodes,
    `per_node` ranks each (torchrun's c10d rendezvous at a HOST:PORT every node reaches when nodes > 1). The
    executor keeps the whole optimizer state on every data-parallel rank: a ZeRO stage is a simulate figure;
    it has no context parallelism either, so `c.cp` is left out (`run_note` says so): pass per_node and nodes
    for the t x p x d ranks it runs, cp times fewer than the plan's GPUs. `split`: the layers per chunk the plan
    simulated, typed out where a split rule made them differ from the even split the executor takes by default."""
    argv = ["pipesim", "run", c.schedule, "--stages", str(c.p), "--microbatches", str(c.m), "--tp", str(c.tp),
            "--dp", str(c.dp)]
    if c.ep > 1:
        argv += ["--ep", str(c.ep)]
    if c.etp:
        argv += ["--etp", str(c.etp)]
    if c.v > 1:
        argv += ["--virtual", str(c.v)]
    argv += ["--recompute", "full" if c.recompute == OP else c.recompute]  # run_note says why
    if c.sp:
        argv.append("--sequence-parallel")
    if split is not None and split != split_layers(sum(split), len(split)):
        argv += ["--layer-split", ",".join(map(str, split))]
    argv += model_flags + ["--backend", "nccl", "--nproc", str(per_node)]
    if nodes > 1:
        argv += ["--nnodes", str(nodes), "--rdzv-endpoint", "HOST:29500"]
    return argv


def run_note(c: Candidate, model: ModelConfig | None = None, muon: str | None = None) -> str | None:
    """A `#` line for the run command when the winner uses what the executor lacks (latent attention, MTP,
    DeepSeek's routing, a tied head on DualPipe's two chains: it refuses them; experts split over tp, or routed
    unevenly by the cost model's assumption: it refuses those too; context parallelism: it runs without; torchtitan's
    per-op checkpointing: it runs full recomputation instead; `muon`, the plan's --optimizer muon | dist_muon: it
    steps SGD or Adam)."""
    notes = ["the executor has no per-op checkpointing: this runs full recomputation (torchtitan's op policy is a "
             "simulate figure)"] if c.recompute == OP else []
    if muon is not None:
        notes.append(f"the executor steps SGD or Adam (pipesim run --optimizer): --optimizer {muon}'s step is a "
                     "simulate figure")
    unbuilt = unbuilt_structure(model) if model is not None else []
    unrun = unrun_expert_layout(model.moe, expert_tp=c.etp or c.tp) \
        if model is not None and model.moe is not None else []
    two_chains = model is not None and model.tied_embeddings and schedules.build(c.schedule, c.p, c.m, c.v).chains > 1
    if unbuilt:
        notes.append(f"the executor does not build {', '.join(unbuilt)}: `pipesim run` refuses this model (simulate "
                     "it with the command above)")
    elif two_chains:
        notes.append(f"the executor ties the embedding and the head on schedules with one chain: `pipesim run` refuses "
                     f"{c.schedule} for this model (simulate it with the command above)")
    elif unrun:
        notes.append(f"the executor's experts do not run {'; '.join(unrun)}: `pipesim run` refuses this layout "
                     "(simulate it with the command above)")
    elif c.modules:
        notes.append(f"the executor's selective recomputation is the attention core's alone: --recompute-modules "
                     f"{' '.join(c.modules)} is a simulate figure")
    elif c.cp > 1:
        notes.append(f"the executor has no context parallelism: this runs cp {c.cp}'s layout without it, on "
                     f"{c.tp * c.p * c.dp} ranks that hold whole sequences, {c.cp}x the tokens per rank the plan "
                     "counted (it may not fit memory)")
    return "# " + "; ".join(notes) if notes else None


def exports_for(framework: str | None, muon: bool = False) -> tuple[str, ...]:
    """Which project exports a plan gives: its framework's own (torchtitan's TOML, or Megatron-LM's arguments for
    the Megatron stacks and Megatron-DeepSpeed), both without --framework; Megatron-LM's alone under Megatron-core's
    Muon (`muon`), which torchtitan does not run."""
    if muon:
        return ("megatron",)
    if framework is None:
        return ("megatron", "torchtitan")
    return ("torchtitan",) if framework == "torchtitan" else ("megatron",)


def command_line(argv: list[str]) -> str:
    return shlex.join(argv)


def megatron_args(c: Candidate, req: PlanRequest, attention: str | None = None) -> list[str]:
    """Megatron-LM (pretrain_gpt.py) arguments of `c`; a leading '#' line when Megatron lacks the schedule."""
    m = req.model
    out = []
    if c.schedule not in MEGATRON_SCHEDULES:
        runs = "interleaved 1F1B" if c.v > 1 else "1F1B"
        out.append(f"# Megatron-LM has no {c.schedule} schedule; the layout below runs as {runs} there")
    gemma = [what for what, on in (("GeGLU", m.activation == "geglu"), ("post-norms", m.post_norms),
                                   ("scaled embeddings", m.embedding_scale)) if on]
    if gemma:  # pipesim.model.gemma_layer: no pretrain_gpt.py flag builds them
        out.append(f"# pretrain_gpt.py has no flag for Gemma's {', '.join(gemma)}: Megatron-Bridge's "
                   "Gemma3ModelProvider builds the layer; the flags below carry over")
    if m.hybrid is not None:  # Megatron-LM's hybrid model (pipesim.model.hybrid): TransformerConfig's fields
        mixer = m.hybrid.mamba
        out.append(f"# a hybrid model: pretrain_hybrid.py with --hybrid-layer-pattern {m.hybrid.pattern} "
                   f"--mamba-num-heads {mixer.heads} --mamba-head-dim {mixer.head_dim} --mamba-state-dim "
                   f"{mixer.state} --mamba-num-groups {mixer.groups} --position-embedding-type none --squared-relu; "
                   "the flags below carry over")
    if m.linear_attention is not None:  # Megatron-core's GPT layer with the gated_delta_net variant
        mix = m.linear_attention.mixer
        out.append(f"# linear attention: --experimental-attention-variant gated_delta_net --linear-attention-freq "
                   f"{m.linear_attention.full_every} --linear-num-key-heads {mix.key_heads} --linear-num-value-heads "
                   f"{mix.value_heads} --linear-key-head-dim {mix.key_dim} --linear-value-head-dim {mix.value_dim} "
                   f"--linear-conv-kernel-dim {mix.conv_kernel} --attention-output-gate (Megatron-core's "
                   "TransformerConfig fields); the flags below carry over")
    rule = req.split_rule if req.split_rule.megatron else None  # the account-for flags (the plan's only Megatron rule)
    split = req.stage_split(c.chunks)
    even = split == [m.layers // c.chunks] * c.chunks  # Megatron's own default split
    layout = None  # every stage spelled out: the split pipesim simulated, where Megatron's flags give another
    if not even and rule is None:
        if req.framework in MEGATRON_LEGACY:
            out.append(f"# {m.layers} layers over {c.chunks} chunks: pipesim gives the remainder to the first chunks; "
                       "Megatron-LM splits unevenly only at the ends (--decoder-first/last-pipeline-num-layers)")
        else:  # Megatron-core >= 0.13 (NVIDIA/Megatron-LM 77732c3628)
            layout = megatron_layout(split, m.mtp_layers)
    out += ["--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.p)]
    if rule is not None:
        out += rule.flags()
    if layout is not None:
        out += [LAYOUT, f"'{layout}'"]  # quoted for the shell, as --moe-layer-freq's list
    if c.cp > 1:
        out += ["--context-parallel-size", str(c.cp)] + (["--cp-comm-type", req.job.cp_comm]
                                                         if req.job.cp_comm != "p2p" else [])
    if c.v > 1 and layout is None:  # a layout gives the chunks per rank itself
        if rule is not None:  # Megatron counts the slots itself: give it the chunks per rank
            out += ["--num-virtual-stages-per-pipeline-rank", str(c.v)]
        elif even:
            out += ["--num-layers-per-virtual-pipeline-stage", str(m.layers // (c.chunks))]
    out += ["--micro-batch-size", str(c.mbs), "--global-batch-size", str(m.batch), "--seq-length", str(m.seq)]
    if c.recompute == "selective":
        out += ["--recompute-granularity", "selective"]
        if c.modules:  # Megatron-core's flag (core_v0.13 on); its default is core_attn alone
            out += ["--recompute-modules", *c.modules]
    elif c.recompute == "full" and req.framework in MEGATRON_2021:
        out.append("--checkpoint-activations")
    elif c.recompute == "full":
        out += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    out += req.job.precision_flags()
    if c.sp:
        out.append("--sequence-parallel")
    if attention in FUSED_ATTENTION and req.framework in MEGATRON_2021:
        out.append("# pipesim timed flash attention, which the 2021 Megatron layers lack (plan with --attention eager)")
    elif attention in FUSED_ATTENTION:  # Transformer Engine's backend by name (v0.15.3's --use-flash-attn selects
        # nothing): cuDNN's fused attention (pipesim's flash figures), or FlashAttention-2 (flash2)
        out += ["--attention-backend", "flash" if attention == "flash2" else "fused"]
    out += grad_flags(req.job.kernels.grad_fp32)
    out += req.job.kernels.ce_flags()  # Megatron-core's names
    if req.job.fp8 is not None:  # Megatron-core's names (Transformer Engine's recipes; params stay bf16)
        recipe = req.job.fp8.recipe
        if recipe in TORCHAO_ONLY:
            out.append(f"# Megatron-core has no {recipe} recipe (torchao's): tensorwise, current scaling, is nearest")
            recipe = "tensorwise"
        out += req.job.fp8.flags(with_switches=False) if req.job.fp8.fp4 else \
            ["--fp8-format", req.job.fp8.format, "--fp8-recipe", recipe]
        out += [f"# in the environment: NVTE_NVFP4_DISABLE_{x.upper().replace('-', '_')}=1"
                for x in req.job.fp8.nvfp4_disabled]  # Transformer Engine's switches, not Megatron's flags
        if req.job.fp8.impl != "te":
            out.append("# pipesim timed torchao's float8 linears (--fp8-impl torchao); Megatron-core runs Transformer "
                       "Engine's")
    job = c.job(req.job)  # the candidate's options: a profile's overlaps and sharding only where they apply
    ub = job.kernels.ub  # userbuffers only with tp > 1 and sequence parallelism
    if ub is not None:  # Megatron-core's names
        out += ub.flags()
    if job.kernels.cuda_graphs is not None:  # Megatron-core's names
        out += job.kernels.cuda_graphs.flags()
    comm = job.comm  # an overlapped parameter gather only with the distributed optimizer
    if comm.overlap_grad_reduce:  # the same names in Megatron-LM (--ddp-bucket-size in parameters too)
        out.append("--overlap-grad-reduce")
        if comm.ddp_bucket_size is not None:
            out += ["--ddp-bucket-size", str(comm.ddp_bucket_size)]
        if comm.overlap_param_gather:
            out.append("--overlap-param-gather")
    out += _p2p_args(c, req)
    if job.fp8_param_gather:  # the distributed optimizer's FP8 (NVFP4) gather (the candidate's ZeRO 1 / 2)
        out.append(job.param_gather_flag)
    if job.adam_states is not None:  # Megatron-core's names
        out += job.adam_states.flags()
    if job.muon is not None:  # Megatron-core's --optimizer muon / dist_muon and its flags (core_v0.16.0 on)
        out += job.muon.flags()
    if c.schedule == "combined-1f1b":  # Megatron-core >= 0.14: interleaved 1F1B with the EP A2A overlap
        out.append("--overlap-moe-expert-parallel-comm")
    out += _moe_args(c, req)
    if c.zero == 1 and req.framework == "deepspeed":  # DeepSpeed's bf16 optimizer shards the fp32 state (ZeRO 1)
        out.append('# ZeRO 1 is DeepSpeed\'s: --deepspeed with a ds_config of "zero_optimization": {"stage": 1}')
    elif c.zero == 1:
        out.append("--use-distributed-optimizer")
    elif c.zero > 1:
        out.append(f"# ZeRO-{c.zero}: Megatron-LM's closest is --use-distributed-optimizer (ZeRO-1) or torch FSDP")
    return out


def _moe_args(c: Candidate, req: PlanRequest) -> list[str]:
    """Megatron-core's MoE arguments for a mixture-of-experts model (megatron/training/arguments.py's names): the
    experts, the layout, the all-to-all dispatcher pipesim times and the grouped GEMM it costs."""
    moe = req.model.moe
    if moe is None:
        return []
    out = ["--num-experts", str(moe.experts), "--moe-router-topk", str(moe.top_k), "--moe-ffn-hidden-size",
           str(moe.expert_ffn), "--expert-model-parallel-size", str(c.ep), "--expert-tensor-parallel-size",
           str(c.etp or c.tp)]
    out += req.job.comm.dispatcher_flags() or ["--moe-token-dispatcher-type", "alltoall"]
    if req.job.comm.moe_shared_expert_overlap:
        out.append("--moe-shared-expert-overlap")
    out.append("--moe-grouped-gemm")
    if moe.shared_experts:
        out += ["--moe-shared-expert-intermediate-size", str(moe.shared_experts * moe.shared_width)]
    if moe.shared_gate:  # Qwen2-MoE's sigmoid gate on it (Megatron-core >= 0.16)
        out.append("--moe-shared-expert-gate")
    if moe.dense_layers or moe.every > 1:
        out += [FREQ, f"'{megatron_pattern(moe.dense_layers, moe.every, req.model.layers)}'"]
    if moe.capacity_factor is not None:
        out += ["--moe-expert-capacity-factor", str(moe.capacity_factor), "--moe-pad-expert-input-to-capacity"]
        if moe.drop_policy != "probs":  # Megatron-core's default
            out += ["--moe-token-drop-policy", moe.drop_policy]
    if moe.score != "softmax":  # the router's scores (DeepSeek-V3's, Llama 4's sigmoid)
        out += ["--moe-router-score-function", moe.score]
    if moe.input_probs:  # Llama 4's weight on the expert's input
        out.append("--moe-apply-probs-on-input")
    if moe.expert_bias:  # DeepSeek-V3's routing-score bias, and its group-limited routing (the nodes a token reaches)
        out.append("--moe-router-enable-expert-bias")
    if moe.groups > 1:
        out += ["--moe-router-num-groups", str(moe.groups), "--moe-router-group-topk", str(moe.group_topk)]
    if moe.score == "softmax" and not moe.renormalize and not moe.expert_bias:  # Megatron-core's softmax follows
        out.append("--moe-router-pre-softmax")  # the top-k (renormalising) unless this flag: over every expert first
    if moe.balance_loss:  # Megatron-core's own flags (its defaults, aux_loss at 0, need none)
        out += ["--moe-router-load-balancing-type", moe.balance, "--moe-aux-loss-coeff", f"{moe.aux_loss_coeff:g}"]
    if moe.z_loss_coeff:
        out += ["--moe-z-loss-coeff", f"{moe.z_loss_coeff:g}"]
    return out


def _p2p_args(c: Candidate, req: PlanRequest) -> list[str]:
    """Megatron-core overlaps its interleaved schedule's steady-state sends by default (--no-overlap-p2p-communication
    turns it off: megatron/training/arguments.py, Megatron-LM v0.15.3) and waits on every other send (the warm-up's and
    the flush's too, unless --overlap-p2p-communication-warmup-flush, exported where given). An interleaved
    winner timed with held sends (--blocking-p2p without --overlap-p2p-communication) exports the flag that holds
    them; a 1F1B winner timed with free sends says Megatron cannot do that."""
    comm = req.job.comm
    if c.p == 1:
        return []
    if c.v > 1:
        if comm.blocks_sends(interleaved=True):
            return ["--no-overlap-p2p-communication"]
        return ["--overlap-p2p-communication-warmup-flush"] if comm.overlap_p2p_warmup_flush else []
    if comm.blocking_p2p:
        return []
    return ["# pipesim timed the pipeline sends as overlapping the next compute; Megatron-LM's 1F1B waits on each "
            "(plan with --blocking-p2p, or --framework megatron-core, for its timing)"]


def schedule_csv(schedule: Schedule) -> str:
    """The winner's schedule as torch.distributed.pipelining's compute-only CSV (one row per rank)."""
    return torch_csv.dumps(schedule)


def megatron_text(c: Candidate, req: PlanRequest, attention: str | None = None) -> str:
    """The arguments one flag (with its values: --recompute-modules takes several) per line, comments kept as
    lines."""
    lines: list[str] = []
    for a in megatron_args(c, req, attention):
        if a.startswith(("#", "--")) or not lines or lines[-1].startswith("#"):
            lines.append(a)
        else:
            lines[-1] += f" {a}"
    return "\n".join(lines)


__all__ = ["command_line", "exports_for", "grad_flags", "megatron_args", "megatron_text", "run_command", "run_note",
           "schedule_csv", "simulate_command"]
