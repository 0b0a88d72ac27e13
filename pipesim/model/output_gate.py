"""Qwen3-Next's gated attention: the attention's output times sigmoid(gate), the gate the query projection's second
half (Megatron-core's attention_output_gate; ModelConfig.attention_gate).

Megatron-core (megatron/core/transformer/attention.py @ d98e8a64dd, Attention._apply_output_gate) runs it eagerly:
`gate.contiguous()`, `x * torch.sigmoid(gate.float())`: a copy of the gate, its cast to float32, the sigmoid in
float32 and the product, whose float32 result the projection reads. Per element of the attention's output on this
rank (n = b s / cp x heads x head_dim / tp), d bytes the dtype's, the forward moves 2 d (copy), d + 4 (cast), 8
(sigmoid), d + 8 (product); autograd's backward the product's two gradients (reads its float32 gradient, x and the
sigmoid; writes two: 16 + d), the sigmoid's (12), the cast's (4 + d). The product keeps x and the float32 sigmoid.
The gate's weights are the QKV projection's (ModelConfig.qkv_width): its FLOPs and parameters are QKV's.
"""

from __future__ import annotations

from pipesim.model.config import ModelConfig
from pipesim.model.options import LayerOptions

SIGMOID_BYTES = 4  # float32


def qk_gate(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """Elements of the attention's output (and of its gate) on one rank for a microbatch of b sequences."""
    return b * opts.local_seq(model) * model.attention_width // opts.tp


def gate_forward_bytes(n: int, d: int) -> list[tuple[str, int]]:
    """The forward's eager kernels and their bytes."""
    f = SIGMOID_BYTES
    return [("attention output gate: copy", 2 * d * n), ("attention output gate: float cast", (d + f) * n),
            ("attention output gate: sigmoid", 2 * f * n), ("attention output gate: product", (d + 2 * f) * n)]


def gate_backward_bytes(n: int, d: int) -> list[tuple[str, int]]:
    """The backward's kernels (autograd's, in reverse) and their bytes."""
    f = SIGMOID_BYTES
    return [("attention output gate: product backward", (4 * f + d) * n),
            ("attention output gate: sigmoid backward", 3 * f * n),
            ("attention output gate: float cast backward", (f + d) * n)]


def gate_saved_bytes(n: int, d: int) -> list[tuple[str, int]]:
    """What the product keeps for its backward."""
    return [("attention output before the gate", d * n), ("attention output gate's sigmoid", SIGMOID_BYTES * n)]


__all__ = ["gate_backward_bytes", "gate_forward_bytes", "gate_saved_bytes", "qk_gate"]
