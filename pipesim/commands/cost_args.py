"""`--cost` mode's rule: one rank's seconds given by hand, so no flag that sizes a model or switches its kernels
may stand beside it (each would be ignored: the seconds are not computed), nor one that needs tp, cp or dp > 1 (which
need a model); and its messages' flags need links to act on."""

from __future__ import annotations

import argparse

from pipesim.commands.common import given_model_flags
from pipesim.commands.model_switches import typed_kernel_switches
from pipesim.errors import PipesimError

# (dest, flag) of switches that default to None, so that a typed one is told from --framework's: each acts on a
# model's layers (tp, cp, dp > 1 or the kernels), which --cost has not
TYPED_SWITCHES = (("cp_comm_type", "--cp-comm-type"), ("zero", "--zero"), ("scatter_gather", "--scatter-gather"),
                  ("overlap_grad_reduce", "--overlap-grad-reduce"))
# (dest, flag) of the flags that act on --cost's pipeline messages only where links carry them
MESSAGE_FLAGS = (("boundary_bytes", "--boundary-bytes"), ("blocking_p2p", "--blocking-p2p"),
                 ("overlap_p2p_comm", "--overlap-p2p-communication"), ("framework", "--framework"))


def refuse_model_flags(args: argparse.Namespace) -> None:
    """--cost gives one rank's seconds: a model, its sizes or its kernels' switches beside it would be ignored."""
    given = [f"--{n.replace('_', '-')}" for n in ("model", "model_config") if getattr(args, n, None) is not None]
    given += [flag for flag, _ in given_model_flags(args)]
    given += typed_kernel_switches(args)  # the attention, fusions, TP backward, gradient accumulation, graphs
    given += ["--fp8-impl"] if getattr(args, "fp8_impl", None) is not None else []
    switches = {"eager_rmsnorm": "--eager-rmsnorm", "act_fp8_store": "--activation-func-fp8-input-store",
                "use_precision_aware_optimizer": "--use-precision-aware-optimizer",
                "first_last_layers_bf16": "--first-last-layers-bf16", "moe_enable_deepep": "--moe-enable-deepep",
                "moe_shared_expert_overlap": "--moe-shared-expert-overlap"}
    given += [flag for dest, flag in switches.items() if getattr(args, dest, False)]
    given += [flag for dest, flag in TYPED_SWITCHES if getattr(args, dest, None) is not None]
    if getattr(args, "optimizer", "adam") != "adam":
        given.append("--optimizer")
    if getattr(args, "grad_fp32", None) is not None:  # one dest, two flags
        given.append("--accumulate-allreduce-grads-in-fp32" if args.grad_fp32 else "--grad-reduce-in-bf16")
    if getattr(args, "async_tp", False):
        given.append("--async-tp")
    if getattr(args, "tp_comm_overlap_ub", False):
        given.append("--tp-comm-overlap")
    if getattr(args, "moe_token_dispatcher_type", "alltoall") != "alltoall":
        given.append("--moe-token-dispatcher-type")
    if given:
        raise PipesimError(f"{given[0]} needs a model, but --cost gives the seconds: drop one")


def refuse_without_links(args: argparse.Namespace, links: bool) -> None:
    """--cost without links (no --hardware, or --comm none): its messages are free, so the flags that size or hold
    them would change nothing; `--comm links` without hardware has no links to give."""
    if getattr(args, "comm", None) == "links" and getattr(args, "hardware", None) is None:  # none: as without it
        raise PipesimError("--comm links needs --hardware with --cost (the links are the hardware's; without it the "
                           "messages are free)")
    if links:
        return
    given = [flag for dest, flag in MESSAGE_FLAGS if getattr(args, dest, None)]
    if given:
        raise PipesimError(f"{given[0]} acts on --cost's pipeline messages, which are free without links: give "
                           "--hardware (and not --comm none)")


__all__ = ["refuse_model_flags", "refuse_without_links"]
