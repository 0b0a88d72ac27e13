"""Typed switches the model cannot honour, refused: a transformer's kernel switches on the lecture's MLP (`--model
mlp`), whose layers pipesim times as their GEMMs alone (a fused elementwise kernel, a loss, an attention, a
weight-gradient accumulation, a graph or a DTensor layout has nothing to act on there), and float32 gradients asked of
a float32 model, whose gradients are float32 already; and `--seed`, which seeds `pipesim run`'s parameters and data,
where a simulation draws none; and the switches of the GPU kernel path on hardware that has none (a calibrated CPU
host). A --framework's own switches are not typed and stay accepted: a profile applies where it can."""

from __future__ import annotations

import argparse

from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.model.config import ModelConfig

NEEDS = "needs a transformer (--model gpt, moe or --model-config)"
SEED = ("--seed seeds `pipesim run`'s parameters and synthetic data; a simulation draws none (--jitter-seed seeds "
        "--jitter's draws)")


def typed_kernel_switches(args: argparse.Namespace) -> list[str]:
    """The transformer kernel switches the command line typed, as their flags (in the parser's order)."""
    given = ["--attention"] if getattr(args, "attention", None) is not None else []
    for dest, on, off in (("kernel_fusion", "--compile", "--no-kernel-fusion"),
                          ("dtensor_tp", "--dtensor-tp", None),
                          ("tp_comm_overlap", None, "--no-async-tensor-model-parallel-allreduce"),
                          ("grad_accum_fusion", None, "--no-gradient-accumulation-fusion"),
                          ("ce_fusion", "--cross-entropy-loss-fusion", "--no-cross-entropy-loss-fusion")):
        value = getattr(args, dest, None)
        if value is not None:
            given.append(on if value else off)
    if getattr(args, "cuda_graph_impl", "none") != "none":
        given.append("--cuda-graph-impl")
    if getattr(args, "transformer_impl", None) is not None:
        given.append("--transformer-impl")
    return [flag for flag in given if flag is not None]


# the typed switches that act on the GPU kernel path alone (pipesim.cost.kernel_costs, the host issue): nothing else
# reads them, so hardware without a GPU device family (a calibrated CPU host, a roofline) cannot honour them
KERNEL_PATH_ONLY = ("--compile", "--no-kernel-fusion", "--no-gradient-accumulation-fusion",
                    "--cross-entropy-loss-fusion", "--no-cross-entropy-loss-fusion", "--cuda-graph-impl",
                    "--transformer-impl", "--eager-rmsnorm")


def refuse_unhonoured(args: argparse.Namespace, model: ModelConfig | None, hardware: Hardware | None = None) -> None:
    """PipesimError naming the first typed switch `model` cannot honour (None: hand-given costs, cost_args' rule);
    a factory's model (--model MODULE:FACTORY) is timed from its own counts, where no kernel switch acts either;
    on `hardware` without a GPU device family, a switch of the kernel path alone (KERNEL_PATH_ONLY)."""
    if getattr(args, "seed", None) is not None:
        raise PipesimError(SEED)
    if model is None:
        return
    factory = getattr(args, "factory", None)  # simulate's --model MODULE:FACTORY (its placeholder model an MLP)
    given = typed_kernel_switches(args) if model.kind == "mlp" else []
    if given and factory:
        raise PipesimError(f"{given[0]} {NEEDS}, not --model {factory}: a factory's layers are timed from their "
                           "counted FLOPs and bytes")
    if given:
        raise PipesimError(f"{given[0]} {NEEDS}: pipesim times the MLP's layers as their GEMMs alone")
    if hardware is not None and not hardware.device.family:
        typed = typed_kernel_switches(args) + (["--eager-rmsnorm"] if getattr(args, "eager_rmsnorm", False) else [])
        off = [flag for flag in typed if flag in KERNEL_PATH_ONLY]
        if off:
            raise PipesimError(f"{off[0]} acts on GPU kernels: {hardware.name} has no GPU device family (use a GPU "
                               "preset)")
    if getattr(args, "grad_fp32", None) is True and model.dtype == "float32":
        raise PipesimError("--accumulate-allreduce-grads-in-fp32 needs a 16-bit model (--dtype bfloat16 or float16): "
                           "a float32 model's gradients are float32 already")


__all__ = ["KERNEL_PATH_ONLY", "refuse_unhonoured", "typed_kernel_switches"]
