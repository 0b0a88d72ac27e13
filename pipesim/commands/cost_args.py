"""`--cost` mode's rule: one rank's seconds given by hand, so no flag that sizes a model or switches its kernels
may stand beside it (each would be ignored: the seconds are not computed)."""

from __future__ import annotations

import argparse

from pipesim.commands.common import given_model_flags
from pipesim.errors import PipesimError


def refuse_model_flags(args: argparse.Namespace) -> None:
    """--cost gives one rank's seconds: a model, its sizes or its kernels' switches beside it would be ignored."""
    given = [f"--{n.replace('_', '-')}" for n in ("model", "model_config") if getattr(args, n, None) is not None]
    given += [flag for flag, _ in given_model_flags(args)]
    given += [f"--{n.replace('_', '-')}" for n in ("attention", "fp8_impl") if getattr(args, n, None) is not None]
    switches = {"eager_rmsnorm": "--eager-rmsnorm", "act_fp8_store": "--activation-func-fp8-input-store",
                "use_precision_aware_optimizer": "--use-precision-aware-optimizer",
                "first_last_layers_bf16": "--first-last-layers-bf16", "moe_enable_deepep": "--moe-enable-deepep"}
    given += [flag for dest, flag in switches.items() if getattr(args, dest, False)]
    if getattr(args, "kernel_fusion", None) is not None:
        given.append("--compile" if args.kernel_fusion else "--no-kernel-fusion")
    for dest, plain, flag in (("moe_token_dispatcher_type", "alltoall", "--moe-token-dispatcher-type"),
                              ("cuda_graph_impl", "none", "--cuda-graph-impl")):
        if getattr(args, dest, plain) != plain:
            given.append(flag)
    if given:
        raise PipesimError(f"{given[0]} needs a model, but --cost gives the seconds: drop one")


__all__ = ["refuse_model_flags"]
