"""What Megatron-core's grouped experts run beside their fused activation: a clamped GLU input (GPT-OSS) and a bias
on the experts' second linear (`add_bias_linear` experts), each as separate memory-bound kernels.

Read from TEGroupedMLP (megatron/core/transformer/moe/experts.py at NVIDIA/Megatron-LM b0cc2706dd, the Megatron-LM
of Megatron-Bridge v0.3.0, whose GPTOSSProvider sets activation_func_clamp_value 7.0, quick_gelu with
glu_linear_offset 1.0, bias_activation_fusion and add_bias_linear). Per routed token on the rank, f the expert's
width (a GLU's FC1 writes 2 f), h the hidden size, d the model's bytes per element:

- The clamp (`MoeConfig.glu_clamp`, transformers' `swiglu_limit`): weighted_bias_quick_geglu_impl
  (megatron/core/fusions/fused_bias_geglu.py) clamps the gate half from above and the linear half on both sides,
  two elementwise kernels that read and write f d each, and torch.cat joins them into a new tensor (reads and
  writes 2 f d) before the fused activation, which saves that copy for its backward: F 8 f d in 3 kernels. Autograd's
  backward runs each half's clamp backward (reads the gradient and the saved half, writes: 3 f d each) and the chunk's
  backward, a concatenation of the two gradients (4 f d): I 10 f d in 3 kernels. Under moe_act recomputation the
  forward's kernels run again (they are inside the checkpointed bias_act_func).
- The FC2 bias: the grouped FC2 returns its biases (skip_bias_add) and TEGroupedMLP._apply_bias adds each local
  expert's bias weighted by its tokens' routing probabilities one expert at a time, `t + b * p` over
  torch.split pieces, then torch.cat. The probabilities are in the model's dtype (the router's softmax is cast back:
  moe_utils.topk_softmax_with_capacity `.type_as(logits)`; Transformer Engine's fused router writes the logits'
  dtype), so every tensor is d bytes: b p writes h d, the add reads 2 h d and writes h d, the concatenation reads and
  writes h d: F 6 h d in 2 kernels per local expert and 1. Backward: the bias's gradient sum(g p) (the product reads
  and writes h d, its reduction reads h d: W 3 h d, 2 kernels per expert), the probabilities' gradient sum(g b)
  (3 h d, 2 kernels per expert) and the split's backward, a concatenation of the pieces' gradients (2 h d) and of the
  probabilities' (negligible bytes): I 5 h d in 2 kernels per expert and 2. The FC1's bias rides in its GEMM's
  epilogue (Transformer Engine's GroupedLinear), no kernel of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.model.kernel_types import MemoryBound

CLAMP = "expert GLU clamp"  # named "expert ...": inside the moe_act checkpoint (pipesim.model.layer_kernels)
BIAS = "weighted FC2 bias of the experts"  # outside it: after the checkpointed activation and the FC2
CLAMP_F, CLAMP_I = 8, 10  # bytes per routed token, per expert-width column and dtype byte
BIAS_F, BIAS_I, BIAS_W = 6, 5, 3  # bytes per routed token, per hidden column and dtype byte
CLAMP_LAUNCHES = 3  # forward (two clamps and the concatenation), and backward (two clamp backwards, the chunk's)


@dataclass(frozen=True)
class ExpertExtras:
    """The extra kernels of one MoE layer's experts on one rank: the clamp's (forward, input gradient) and the FC2
    bias's (forward, input gradient, weight gradient); each () when the layer has none."""

    clamp_f: tuple[MemoryBound, ...] = ()
    clamp_i: tuple[MemoryBound, ...] = ()
    bias_f: tuple[MemoryBound, ...] = ()
    bias_i: tuple[MemoryBound, ...] = ()
    bias_w: tuple[MemoryBound, ...] = ()


def expert_extras(routed: int, ffn: int, hidden: int, d: int, *, clamp: bool, bias: bool) -> ExpertExtras:
    """The clamp's kernels (`clamp`) and the FC2 bias's (`bias`) over `routed` tokens of experts `ffn` wide."""
    clamps = dict(clamp_f=(MemoryBound(CLAMP, CLAMP_F * routed * ffn * d),),
                  clamp_i=(MemoryBound(f"{CLAMP} backward", CLAMP_I * routed * ffn * d),)) if clamp else {}
    biases = dict(bias_f=(MemoryBound(BIAS, BIAS_F * routed * hidden * d),),
                  bias_i=(MemoryBound(f"{BIAS} backward", BIAS_I * routed * hidden * d),),
                  bias_w=(MemoryBound(f"{BIAS} gradient", BIAS_W * routed * hidden * d),)) if bias else {}
    return ExpertExtras(**clamps, **biases)


def extra_launches(local: int, *, clamp: bool, bias: bool) -> tuple[int, int, int]:
    """Kernel launches of the extras on a rank of `local` experts: (forward, whole backward, its weight gradients)."""
    forward = (CLAMP_LAUNCHES if clamp else 0) + (2 * local + 1 if bias else 0)
    weight = 2 * local if bias else 0
    backward = (CLAMP_LAUNCHES if clamp else 0) + (2 * local + 2 + weight if bias else 0)
    return forward, backward, weight


__all__ = ["BIAS", "CLAMP", "ExpertExtras", "expert_extras", "extra_launches"]
