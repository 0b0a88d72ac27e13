"""The shared experts' gate (`MoeConfig.shared_gate`): their output times sigmoid(x . w), w one row of h weights.

transformers' Qwen2MoeSparseMoeBlock (Qwen1.5-MoE, Qwen2-MoE; Qwen3-Next and Qwen3.5 keep it): `sigmoid(
shared_expert_gate(x)) * shared_expert(x)`, the gate an nn.Linear(h, 1, bias=False) on the MoE block's input.
Megatron-core builds it from core_v0.16.0 (TransformerConfig.moe_shared_expert_gate, the flag
--moe-shared-expert-gate; megatron/core/transformer/moe/shared_experts.py SharedExpertMLP.forward:
`F.linear(hidden_states, self.gate_weight)`, `torch.sigmoid`, `output * gate_score`) on the layer's input tokens,
under sequence parallelism the rank's shard, as the router reads them, after the shared experts' reduce-scatter.

Per MoE layer on n tokens of h (d bytes each): forward the gate's GEMV (a GEMM n x 1 x h), the sigmoid (read and
write n) and the product (read the n h output and the n scores, write n h); backward the product's two gradients
(the shared output's: read the incoming n h and the scores, write n h; the score's: read the incoming and the
shared output, write n), the sigmoid's (read the gradient and the output, write n), the GEMV's input gradient (an
outer product, a GEMM n x h x 1) and its weight gradient (h x 1 over n). The product keeps the shared output and
the score for its backward; the GEMV's input is the layer's MLP input, which the router keeps already. h parameters
per MoE layer, 2 n h FLOPs in each of F, I and W (pipesim.model.flops).
"""

from __future__ import annotations

from pipesim.model.kernel_types import Gemm, Kernel, MemoryBound

GATE = "shared gate"  # the kernels' and saved tensors' prefix


def gate_kernels(tokens: int, hidden: int, dtype_bytes: int) -> tuple[list[Kernel], list[Kernel], list[Kernel]]:
    """The gate's (F, I, W) kernels on `tokens` tokens of `hidden` (the module docstring's bytes)."""
    n, h, d = tokens, hidden, dtype_bytes
    f: list[Kernel] = [Gemm(GATE, n, 1, h), MemoryBound(f"{GATE} sigmoid", 2 * n * d),
                       MemoryBound(f"{GATE} product", (2 * n * h + n) * d)]
    i: list[Kernel] = [MemoryBound(f"{GATE} product backward", (4 * n * h + 2 * n) * d),
                       MemoryBound(f"{GATE} sigmoid backward", 3 * n * d), Gemm(f"{GATE} dgrad", n, h, 1)]
    w: list[Kernel] = [Gemm(f"{GATE} wgrad", h, 1, n)]
    return f, i, w


def gate_saved(tokens: int, hidden: int, dtype_bytes: int) -> tuple[tuple[str, int], ...]:
    """(name, bytes) of what the gate's product keeps for its backward: the shared experts' output and the scores."""
    return ((f"{GATE} product input (shared experts' output)", tokens * hidden * dtype_bytes),
            (f"{GATE} scores", tokens * dtype_bytes))


__all__ = ["GATE", "gate_kernels", "gate_saved"]
