"""The papers' own units for `pipesim bench published` (bench/bench_published.py): each paper's FLOP count, the
unit conversions, and METRICS, the way a row's simulated JSON becomes its published figure's unit."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import schedules
from pipesim.commands.common import model_config
from pipesim.model.param_counts import embedding_params, model_params


def nar21_flops_per_iteration(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """NAR21 eq. 3 (counts the recompute pass): 96 B s l h^2 (1 + s/(6h) + V/(16 l h))."""
    return 96.0 * batch * seq * layers * hidden**2 * (1.0 + seq / (6.0 * hidden) + vocab / (16.0 * layers * hidden))


def palm_flops_per_token(params: int, layers: int, heads: int, head_dim: int, seq: int) -> float:
    """Model FLOPs per token of PaLM's MFU (Chowdhery et al. 2022, appendix B), which Llama 3 cites:
    6 N + 12 L H Q T (N parameters without the embedding table, L layers, H heads, Q head dim, T sequence; the full
    s x s attention square, no recomputation)."""
    return 6.0 * params + 12.0 * layers * heads * head_dim * seq


def palm_flops_per_iteration(args: argparse.Namespace) -> float:
    """palm_flops_per_token of the command's model x tokens per step (batch x seq)."""
    m = model_config(args)
    n = model_params(m) - embedding_params(m)  # the LM head stays: it is a matmul (torchtitan's count)
    return palm_flops_per_token(n, m.layers, m.heads, m.hidden // m.heads, m.seq) * m.batch * m.seq


def megatron_flops_per_iteration(args: argparse.Namespace) -> float:
    """Megatron-LM's `num_floating_point_operations` (megatron/training/training.py at core_v0.9.0, the count behind
    its MoE README's TFLOPS): 12 B s L h^2 ((1 + G/A + s/h) Q/h + (f/h) k g + V/(2 L h)), G key/value groups of A
    heads, Q = A x head dim, f the (expert) MLP width, k experts per token (1 dense), g 3/2 for SwiGLU, V the
    vocabulary; the full s x s attention square, no router or recomputation."""
    m = model_config(args)
    h, s = m.hidden, m.seq
    ffn, k = (m.moe.expert_ffn, m.moe.top_k) if m.moe is not None else (m.ffn_size, 1)
    gated = 1.5 if m.activation == "swiglu" else 1.0
    attention = (1 + m.num_kv_heads / m.heads + s / h) * (m.heads * m.head_dim / h)
    return 12.0 * m.batch * s * m.layers * h * h * (attention + ffn / h * k * gated + m.vocab / (2 * m.layers * h))


def megatron_core_flops_per_iteration(args: argparse.Namespace) -> float:
    """Megatron-core's `num_floating_point_operations` from core_v0.12.0 on (commit 8873b55d6a, "Fixes in number of
    floating-point operation estimates for MoE and attention layer"; the same at core_v0.14.0), the count behind
    current Megatron / ModelZoo TFLOPS: B s (12 L h (f_d g L_d/L + (f_e k + f_s) g L_m/L) + 12 L h^2 (1 + G/A
    + s/(2h)) Q/h + 6 h V): the causal half of the s x s square, dense (L_d) and MoE (L_m) layers apart, shared
    experts of width f_s. Standard attention without multi-token prediction only (ValueError otherwise)."""
    m = model_config(args)
    if m.mla is not None or m.mtp_layers:
        raise ValueError("megatron_core_flops_per_iteration: latent attention and MTP are not counted here")
    h, s, layers = m.hidden, m.seq, m.layers
    gated = 1.5 if m.activation == "swiglu" else 1.0
    if m.moe is None:
        mlp = m.ffn_size * gated
    else:
        moe_layers = m.moe.moe_layers(0, layers)
        shared = m.moe.shared_experts * (m.moe.shared_ffn or m.moe.expert_ffn)
        routed = m.moe.expert_ffn * m.moe.top_k
        mlp = gated * (m.ffn_size * (layers - moe_layers) + (routed + shared) * moe_layers) / layers
    attention = 12.0 * layers * h * h * (1 + m.num_kv_heads / m.heads + s / (2 * h)) * (m.heads * m.head_dim / h)
    return m.batch * s * (12.0 * layers * h * mlp + attention + 6.0 * h * m.vocab)


def tflops_per_gpu(flops: float, seconds: float, gpus: int) -> float:
    """TFLOP/s per GPU = FLOPs per iteration / (iteration seconds x GPUs) / 1e12."""
    return flops / (seconds * gpus) / 1e12


def tokens_per_gpu_second(batch: int, seq: int, seconds: float, gpus: int) -> float:
    """Tokens per second per GPU = batch x seq / (iteration seconds x GPUs): NeMo's and Megatron-Bridge's
    performance tables' unit, which needs no FLOP count (none to agree on for a mixture of experts)."""
    return batch * seq / (seconds * gpus)


def iteration_seconds(sim: dict) -> float:
    """The simulated step to the optimizer's end (`step_time`); `makespan` where the JSON has no step_time."""
    return float(sim.get("step_time", sim["makespan"]))


def without_optimizer(sim: dict) -> dict:
    """The same run with its step less the optimizer: the latest rank's end less that rank's optimizer seconds
    (JSON `ranks[].step_end`, `ranks[].optimizer`); unchanged where the JSON has no per-rank optimizer."""
    ranks = [r for r in sim.get("ranks", []) if "step_end" in r and "optimizer" in r]
    if not ranks:
        return sim
    return {**sim, "step_time": max(r["step_end"] - r["optimizer"] for r in ranks)}


def gpus(args: argparse.Namespace) -> int:
    return args.tp * args.stages * args.dp * args.cp


def layer_stage(args: argparse.Namespace) -> int:
    """The stage of --layer-split that holds the one layer (KOR22 Table 4 rows: 0,1,0)."""
    split = [int(n) for n in args.layer_split or []]  # parsed by the CLI into a list of ints
    if sorted(split) != [0] * (len(split) - 1) + [1]:
        raise ValueError(f"a layer-time row needs --layer-split with one stage of one layer, got {args.layer_split}")
    return split.index(1)


def middle_stage(args: argparse.Namespace) -> int:
    """The stage with index p // 2 of --stages (ZB24 Table 9 rows: the paper's profiled per-stage times, read on a
    stage with as many layers as every stage but the first and the last)."""
    virtual = args.virtual if args.virtual is not None else schedules.spec(args.name).default_virtual
    if virtual != 1:
        raise ValueError(f"a stage-time row needs one chunk per rank (stage = rank), got {virtual} for {args.name}")
    return args.stages // 2


def action_ms(sim: dict, stage: int, kind: str) -> float:
    """Milliseconds of the stage's one `kind` action (F, B, I or W) of microbatch 0. From the run's compute actions
    (`sim["actions"]`, which the bench keeps for a metric with `needs_actions`: a W, or a stage's action that waits
    on nothing, may lie off the critical path), else from its critical path (a 1-microbatch run's F and B are on
    it)."""
    name = f"{stage}{kind}0"
    where = "actions" if "actions" in sim else "critical path"
    spans = [a for a in sim.get("actions", sim["critical_path"]) if a["kind"] == "compute" and a["name"] == name]
    if len(spans) != 1:
        raise ValueError(f"the {where} has {len(spans)} actions named {name}")
    return (spans[0]["end"] - spans[0]["start"]) * 1e3


@dataclass(frozen=True)
class Metric:
    unit: str
    faster_is_higher: bool  # a throughput (True) or a time (False): the sign of the speed error
    convert: Callable[[dict, argparse.Namespace], float]
    needs_actions: bool = False  # reads an action perhaps off the critical path: its run keeps them all (--trace)


METRICS: dict[str, Metric] = {
    "tflops_per_gpu_nar21": Metric("TFLOP/s per GPU", True, lambda sim, a: tflops_per_gpu(
        nar21_flops_per_iteration(a.batch, a.seq, a.layers, a.hidden, a.vocab), iteration_seconds(sim), gpus(a))),
    "tflops_per_gpu_palm": Metric("TFLOP/s per GPU", True, lambda sim, a: tflops_per_gpu(
        palm_flops_per_iteration(a), iteration_seconds(sim), gpus(a))),
    "tflops_per_gpu_megatron": Metric("TFLOP/s per GPU", True, lambda sim, a: tflops_per_gpu(
        megatron_flops_per_iteration(a), iteration_seconds(sim), gpus(a))),
    "tflops_per_gpu_megatron_core": Metric("TFLOP/s per GPU", True, lambda sim, a: tflops_per_gpu(
        megatron_core_flops_per_iteration(a), iteration_seconds(sim), gpus(a))),
    "seconds_per_iteration": Metric("s per iteration", False, lambda sim, a: iteration_seconds(sim)),
    "tokens_per_sec_per_gpu": Metric("tokens/s per GPU", True, lambda sim, a: tokens_per_gpu_second(
        a.batch, a.seq, iteration_seconds(sim), gpus(a))),
    "layer_forward_ms": Metric("ms", False, lambda sim, a: action_ms(sim, layer_stage(a), "F")),
    "layer_backward_ms": Metric("ms", False, lambda sim, a: action_ms(sim, layer_stage(a), "B")),
    # ZB24 Table 9: T_F, T_B (input gradient, the split backward's I) and T_W of the stage p // 2
    "stage_forward_ms": Metric("ms", False, lambda sim, a: action_ms(sim, middle_stage(a), "F"), True),
    "stage_input_grad_ms": Metric("ms", False, lambda sim, a: action_ms(sim, middle_stage(a), "I"), True),
    "stage_weight_grad_ms": Metric("ms", False, lambda sim, a: action_ms(sim, middle_stage(a), "W"), True),
}
