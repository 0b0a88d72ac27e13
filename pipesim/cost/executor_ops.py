"""Framework ops of the executor's pieces: what a calibrated CPU host charges per op (`per_op_overhead`), whose
eager dispatch makes a narrow model's many small ops dear. Counted as non-view aten ops of each piece in F, I and W
(tests/executor_helpers.OpCount; tests/test_executor_structure.py and tests/test_moe_executor.py tie them to the
executor); the GPT block's and the MLP layer's are the counts the CPU fit was made with.
"""

from __future__ import annotations

from pipesim.model.config import ModelConfig
from pipesim.model.moe import MoeConfig
from pipesim.model.options import LayerOptions

NO_OPS = (0, 0, 0)
MLP_LAYER_OPS = (2, 2, 1)  # framework ops of one MLP layer in F, I, W
GPT_BLOCK_OPS = (10, 10, 6)  # framework ops of one transformer block in F, I, W


# the executor's extra framework ops (F, I, W) over the GPT block's, per structure field (executor/transformer.py,
# counted as GPT_BLOCK_OPS is, non-view aten ops, by tests/test_executor_structure.py): RMSNorm as torch's composite
# (pow, mean, add, rsqrt, mul, mul) for the block's two norms, rotary embedding on q and k (mul, neg, cat, mul, add
# each; none on a NoPE layer), SwiGLU's, GeGLU's or squared ReLU's second op, QK-norm by kind, and no bias gradients
# without biases (4 linears) but QKV's with --add-qkv-bias;
# grouped-query attention adds none (torch's SDPA with enable_gqa), nor do heads of their own width. Additive to the
# op but for cases no bundled model has: QK-norm (either kind) beside a single key/value head runs one op fewer, and
# beside a partial rotation one forward op fewer.
STRUCTURE_OPS = {"rmsnorm": (10, 22, 2), "rope": (10, 10, 0), "gated": (1, 3, 0), "qk_layernorm": (3, 4, 2),
                 "qk_rmsnorm": (15, 24, 4), "no biases": (0, 0, -4), "qkv bias": (0, 0, 1),
                 # Llama 4's weightless L2 QK-norm (executor.transformer.qk_norms: RMSNorm's composite, no weight)
                 "qk_l2": (13, 22, 0),
                 # GPT-OSS's attention (executor.transformer.attention_core): a windowed layer's SDPA under a band
                 # mask; the sinks' own core (slice, scores, mask, concatenation, softmax, slice, product), with
                 # grouped-query heads their keys and values repeated (its band mask is there with or without a
                 # window)
                 "window": (3, 0, 0), "sinks": (10, 10, 2), "sinks_gqa": (0, 3, 0),
                 # a partial rotation (partial_rotary_factor < 1, executor.transformer.rotate): the rotated features
                 # sliced out and the rest concatenated back, on q and k
                 "partial_rope": (3, 8, 0),
                 # Gemma's post-norms on the attention's and the MLP's output (executor.transformer.post_norms), by
                 # kind: two LayerNorms, or two RMSNorms as torch's composite
                 "post_layernorm": (2, 2, 2), "post_rmsnorm": (12, 24, 4)}
EXPERT_GATED_OPS = (1, 3, 0)  # an expert's (or the shared experts') SwiGLU over its GeLU
# a routed expert's gate shape over SwiGLU's (executor.mlp.activate; MoeConfig.glu_clamp, glu_alpha, glu_offset): the
# two clamps, the sigmoid gain in place of silu, the offset's add; and the router's bias gradient
# (MoeConfig.router_bias)
GATE_OPS = {"clamp": (2, 8, 0), "alpha": (2, 4, 0), "offset": (1, 0, 0)}
ROUTER_BIAS_OPS = (0, 0, 1)
EMBED_ROPE_OPS = (-3, 0, -1)  # an embedding without the learned position table: one lookup, no add
EMBED_SCALE_OPS = (1, 0, 1)  # Gemma's sqrt(hidden) on the token embeddings (executor.models.Embed): a mul each way
HEAD_RMSNORM_OPS = (5, 11, 1)  # the final norm as RMSNorm's composite (one of the block's two)
EXPERT_NO_BIAS_OPS = (0, 0, -2)  # an expert without its two biases' gradients
RENORMALIZE_OPS = (2, 7, 0)  # the router's k weights divided by their sum (MoeConfig.renormalize): sum, div
# sigmoid scores (MoeConfig.score) divided by their sum (sum, add, div): the k weights when k > 1, and all E for the
# load-balancing loss's P (executor.experts); the sigmoid itself takes the softmax's place (no op more); the weight on
# the expert's input (MoeConfig.input_probs) takes the output's product's place
SIGMOID_NORM_OPS = (3, 7, 0)
# the load-balancing loss (MoeConfig.balance_loss, executor.experts): F the chosen experts scattered, counted, each
# token's counts, the product and its sum, the scale; I the autoscaler's gradient, two products and an add
BALANCE_OPS = (7, 4, 0)
# the router z-loss (MoeConfig.z_loss_coeff): F logsumexp, square, mean, scale; I its gradient through them
Z_LOSS_OPS = (4, 10, 0)
BOTH_LOSSES_OPS = (1, -1, 0)  # both losses: their sum (an add), one autoscaler gradient (a full_like fewer)
# Qwen2-MoE's sigmoid gate on the shared experts' output (MoeConfig.shared_gate, executor.experts.MoeMLP.shared_output):
# F the gate's mm, sigmoid, product; I the product's two gradients, the score's sum over h, sigmoid_backward, the
# input's mm and its add to the tokens' gradient; W the weight's mm
SHARED_GATE_OPS = (3, 6, 1)


def add_ops(*counts: tuple[int, int, int]) -> tuple[int, int, int]:
    """(F, I, W) op counts added phase by phase."""
    return tuple(sum(phase) for phase in zip(*counts, strict=True))


def structure_ops(model: ModelConfig, variant: bool = False) -> tuple[int, int, int]:
    """The executor's framework ops of one block beyond the GPT block's (STRUCTURE_OPS), in F, I, W; `variant`: the
    block is one of the model's variant layers (pipesim.model.layer_kinds): it attends over the model's window, or
    rotates nothing (a NoPE layer)."""
    sinks = model.attention_sinks
    windowed = variant and model.window_size is not None
    rope = model.positions == "rope" and not (variant and model.nope_every)
    on = [name for name, here in (
        ("rmsnorm", model.norm == "rmsnorm"), ("rope", rope),
        ("gated", model.activation != "gelu"),
        (f"qk_{model.norm}", model.qk_norm), ("qk_l2", model.qk_l2_norm), ("no biases", not model.biases),
        ("qkv bias", model.qkv_bias), (f"post_{model.norm}", model.post_norms),
        ("partial_rope", rope and model.rotary is not None and model.rotary.fraction < 1),
        ("window", windowed and not sinks), ("sinks", sinks),
        ("sinks_gqa", sinks and model.num_kv_heads != model.heads)) if here]
    return tuple(sum(STRUCTURE_OPS[name][k] for name in on) for k in range(3))


def executor_block_ops(model: ModelConfig, variant: bool = False) -> tuple[int, int, int]:
    """Framework ops of one dense block of the executor's transformer in F, I, W: GPT_BLOCK_OPS plus its structure's
    (`structure_ops`; `variant`: one of the model's windowed or NoPE layers). What a calibrated CPU host runs: its
    per-op overhead dominates a small model."""
    return add_ops(GPT_BLOCK_OPS, structure_ops(model, variant))


def gate_ops(moe: MoeConfig) -> tuple[int, int, int]:
    """A routed expert's gate-shape ops over SwiGLU's (GATE_OPS)."""
    on = [name for name, here in (("clamp", moe.glu_clamp is not None), ("alpha", moe.glu_alpha != 1.0),
                                  ("offset", moe.glu_offset != 0.0)) if here]
    return add_ops(NO_OPS, *(GATE_OPS[name] for name in on))


def executor_moe_block_ops(model: ModelConfig, opts: LayerOptions, variant: bool = False) -> tuple[int, int, int]:
    """Framework ops (non-view aten ops, GPT_BLOCK_OPS's count) of one block of the executor's MoE model
    (executor/experts.py) in F, I, W: 22, 22, 7 for attention, norms, router, top-k, permutation and combine, plus
    4 per local expert (E / ep) and 4 for a shared expert in each (and its gate's: SHARED_GATE_OPS), the router's
    losses' (BALANCE_OPS, Z_LOSS_OPS), the structure's (`structure_ops`: its attention and norms, each expert's
    activation and biases; `variant`: one of the model's windowed or NoPE layers), each routed expert's gate shape
    (`gate_ops`) and the router's bias; counted at ep 1 by tests/test_moe_executor.py and
    tests/test_executor_structure.py. What a calibrated CPU host runs: its per-op overhead dominates a small model."""
    moe = model.moe
    routed = moe.experts // opts.ep
    mlps = routed + (1 if moe.shared_experts else 0)
    # one MLP's share of the structure's ops, the dense MLP's in structure_ops as each expert's
    mlp = add_ops(EXPERT_GATED_OPS if model.activation != "gelu" else NO_OPS,
                  EXPERT_NO_BIAS_OPS if not model.biases else NO_OPS)
    attention = add_ops(structure_ops(model, variant), tuple(-n for n in mlp))  # and the norms
    ops = add_ops((22, 22, 7), attention, tuple(mlps * (4 + n) for n in mlp),
                  tuple(routed * n for n in gate_ops(moe)), ROUTER_BIAS_OPS if moe.router_bias else NO_OPS)
    ops = add_ops(ops, RENORMALIZE_OPS) if moe.renormalize else ops
    ops = add_ops(ops, SHARED_GATE_OPS) if moe.shared_gate and moe.shared_experts else ops
    sigmoid = moe.score == "sigmoid"
    ops = add_ops(ops, SIGMOID_NORM_OPS) if sigmoid and moe.top_k > 1 else ops
    ops = add_ops(ops, SIGMOID_NORM_OPS) if sigmoid and moe.balance_loss else ops
    ops = add_ops(ops, BALANCE_OPS) if moe.balance_loss else ops
    ops = add_ops(ops, Z_LOSS_OPS) if moe.z_loss_coeff else ops
    return add_ops(ops, BOTH_LOSSES_OPS) if moe.balance_loss and moe.z_loss_coeff else ops


__all__ = ["BALANCE_OPS", "BOTH_LOSSES_OPS", "EMBED_ROPE_OPS", "EMBED_SCALE_OPS", "EXPERT_GATED_OPS",
           "EXPERT_NO_BIAS_OPS", "GATE_OPS", "GPT_BLOCK_OPS", "HEAD_RMSNORM_OPS", "MLP_LAYER_OPS", "NO_OPS",
           "RENORMALIZE_OPS", "ROUTER_BIAS_OPS", "SHARED_GATE_OPS", "SIGMOID_NORM_OPS", "STRUCTURE_OPS", "Z_LOSS_OPS",
           "add_ops", "executor_block_ops", "executor_moe_block_ops", "gate_ops", "structure_ops"]
