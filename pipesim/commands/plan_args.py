"""`pipesim plan`'s search choices from its flags: the schedules, ZeRO stages, recomputations and sequence-parallel
choices (typed, else --framework's space, pipesim.plan.stack_space), and the Job every candidate shares."""

from __future__ import annotations

import argparse

from pipesim.commands.kernel_args import (
    adam_from_args,
    bf16_layers_from_args,
    fp8_from_args,
    muon_from_args,
    param_gather_from_args,
)
from pipesim.commands.setup_args import apply_switches, comm_options_from_args, kernel_switches
from pipesim.errors import PipesimError
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.op_recompute import OP
from pipesim.model.options import check_act_fp8_store
from pipesim.model.recompute_modules import canonical_modules, check_modules, effective_modules
from pipesim.plan.stack_space import RECOMPUTES, ZEROS, stack_space


def names_list(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def on_off(text: str) -> tuple[bool, ...]:
    words = names_list(text)
    if not words or any(w not in ("on", "off") for w in words):
        raise argparse.ArgumentTypeError(f"on, off or on,off; got {text!r}")
    return tuple(sorted({w == "on" for w in words}))


def cp_sizes(text: str) -> tuple[int, ...]:
    """--cp: positive context-parallel sizes, comma-separated."""
    try:
        out = tuple(sorted({int(t) for t in names_list(text)}))
    except ValueError:
        out = ()
    if not out or any(cp < 1 for cp in out):
        raise argparse.ArgumentTypeError(f"positive context-parallel sizes such as 1,2,4; got {text!r}")
    return out


def plan_modules(model: ModelConfig, recomputes: tuple[str, ...], modules: list[str] | None) -> tuple[str, ...]:
    """--recompute-modules for the plan's selective candidates, checked against the model once (PipesimError: one
    line): they need selective among --recompute."""
    if not modules:
        return ()
    if "selective" not in recomputes:
        raise PipesimError(f"--recompute-modules needs selective among --recompute, got {','.join(recomputes)}")
    out = canonical_modules("selective", modules)
    check_modules(model, effective_modules("selective", out))
    return out


def recompute_list(text: str) -> tuple[str, ...]:
    """The searched --recompute choices: Megatron's, and torchtitan's per-op policy (planned with --framework
    torchtitan, on the layouts pipesim.model.op_recompute models: one tp and cp rank)."""
    out = names_list(text)
    known = (*RECOMPUTES, OP)
    bad = [r for r in out if r not in known]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(known)}, got {text!r}")
    return out


def plan_choices(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...],
                                                     tuple[bool, ...]]:
    """(schedules, ZeRO stages, recomputations, sequence-parallel choices) to search: those typed, else
    --framework's space (pipesim.plan.stack_space), else pipesim's own; one line for a typed choice the framework
    cannot run."""
    space = stack_space(getattr(args, "framework", None))
    scheds = args.schedules or (space.schedule_names if space else ())
    zeros = args.zero or (space.zeros if space else ZEROS)
    recomputes = args.recompute or (space.recomputes if space else RECOMPUTES)
    offered = space.sequence_parallel if space else (True, False)
    sps = args.sequence_parallel or ((True,) if True in offered else offered)  # Megatron's practice: on
    if space is None:
        if OP in recomputes:
            raise PipesimError("--recompute op is torchtitan's per-op checkpointing: plan it with --framework "
                               "torchtitan")
        return scheds, zeros, recomputes, sps
    refusal = space.refusal(args.framework, schedule_names=scheds, zeros=zeros, recomputes=recomputes,
                            sequence_parallel=sps, cps=args.cp, cp_comm=args.cp_comm_type)
    if refusal:
        raise PipesimError(refusal)
    return scheds, zeros, recomputes, sps


def zero_list(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(t) for t in names_list(text))
    except ValueError:
        out = ()
    if not out or any(z not in (0, 1, 2, 3) for z in out):
        raise argparse.ArgumentTypeError(f"ZeRO stages are 0, 1, 2, 3; got {text!r}")
    return out


def shared_job(args: argparse.Namespace, model: ModelConfig) -> tuple[Job, tuple[str, ...], tuple[int, ...],
                                                                     tuple[str, ...], tuple[bool, ...]]:
    """(the Job every candidate shares, schedules, ZeRO stages, recomputations, sequence-parallel choices).

    The framework's switches and the kernel flags are applied as simulate applies them (`apply_switches`; ZeRO stays
    the plan's own). FSDP2's resharding policy needs ZeRO 3, --fp8-param-gather and the precision-aware optimizer the
    distributed optimizer (ZeRO 1 or 2), Megatron-core's Muon ZeRO 0: with any of them the plan searches those stages
    only, and a typed --zero outside them is refused in one line; a candidate without them (dp 1) runs without the
    option (`Candidate.job`)."""
    apply_switches(args, keep=("zero",))
    scheds, zeros, recomputes, sps = plan_choices(args)
    kernels = kernel_switches(args)
    graphs = kernels.cuda_graphs
    if graphs is not None and graphs.impl != "full_iteration" and "full" in recomputes:
        if args.recompute:  # typed: one line, as simulate says it
            graphs.check_recompute("full")
        recomputes = tuple(r for r in recomputes if r != "full")  # Megatron-core: full recompute needs full_iteration
    needs = {}
    if args.fsdp_reshard != "default":
        needs["--fsdp-reshard-after-forward " + args.fsdp_reshard] = (3,)
    fp8 = fp8_from_args(args)
    gather = param_gather_from_args(args, fp8)
    if gather:  # the distributed optimizer's (Megatron-core), or FSDP2's float8 all-gather (torchao)
        flag = fp8.param_gather_flag if fp8 is not None else "--fp8-param-gather"  # None: the Job refuses it
        needs[flag] = (3,) if fp8 is not None and fp8.impl == "torchao" else (1, 2)
    muon = muon_from_args(args)
    if muon is not None:  # Megatron-core's Muon runs without the distributed optimizer (dist_muon deals its own)
        needs[f"--optimizer {muon.name}"] = (0,)
    adam = adam_from_args(args)
    if adam is not None:
        needs["--use-precision-aware-optimizer"] = (1, 2)
    for flag, stages in needs.items():
        kept = tuple(z for z in zeros if z in stages)
        if not kept or (args.zero and kept != zeros):
            raise PipesimError(f"{flag} needs ZeRO {' or '.join(map(str, stages))} among the plan's --zero, got "
                               f"{','.join(map(str, zeros))}")
        zeros = kept
    if args.act_fp8_store:  # every candidate's layers: one line here, not one refusal per candidate
        for recompute in recomputes:
            check_act_fp8_store(model, recompute, fused=kernels.fusion)
    job = Job(attention=args.attention, comm=comm_options_from_args(args), zero=zeros[0] if needs else 0,
              kernels=kernels,
              fp8=fp8, cp_comm=args.cp_comm_type, fsdp_reshard=args.fsdp_reshard,
              fp8_param_gather=gather, adam_states=adam, act_fp8_store=args.act_fp8_store,
              bf16_layers=bf16_layers_from_args(args), muon=muon)
    job.check_gradients(model)
    return job, scheds, zeros, recomputes, sps
