"""One Gated DeltaNet mixer (the linear attention of Qwen3-Next and Qwen3.5) as Megatron-core trains it: its sizes,
its parameters on one tp rank, its kernels per F, I and W, and what it keeps for its backward.

Read from NVIDIA/Megatron-LM @ d98e8a64dd, megatron/core/ssm/gated_delta_net/common.py (_GDNBase) and gdn.py
(GatedDeltaNet, the "gdn" / deprecated "gated_delta_net" experimental attention variant, spec in
megatron/core/models/gpt/experimental_attention_variant_module_specs.py), and from the kernels it calls,
fla-org/flash-linear-attention @ 0315a70ea5 (fla/ops/gated_delta_rule/chunk.py, fla/modules/convolution.py,
fla/modules/l2norm.py). The mixer runs: in_proj (TELayerNormColumnParallelLinear, its fused norm the layer's
pre-norm, the caller's) to [q, k, v, z, beta, alpha]; FLA's causal_conv1d + SiLU over q, k, v (conv_bias False:
the default, no caller passes it); l2norm of q and k; q and k repeated to the Hv value heads (GQA); the gates
g = -exp(A_log) softplus(alpha + dt_bias) and sigmoid(beta) (_compute_gates); chunk_gated_delta_rule in chunks of
64 (gdn.py's chunk_size, FLA's); the gated norm (TENorm over Dv, then times silu(z)); out_proj (TERowParallelLinear).
Tensor parallelism splits heads (transformer_config.py asserts Hk % (tp cp) == 0 and Hv % (tp cp) == 0, and
Hv % Hk == 0); every parameter but the norm's weight over Dv (whole on every rank) is split.

The delta rule's tensor-core work is written as FLA's chunked GEMMs per chunk of C tokens and local value head:
forward (beta K) K^T (C x C by Dk), the WY triangular inverse (counted as one C x C x C product), W = A (beta K)
and U = A (beta V), the recurrence V_new = U - W S and S += K^T V_new (S: Dk x Dv), the output Q S, Q K^T and
(Q K^T o M) V_new: 2 C (C (3 Dk + 2 Dv + C) + 3 Dk Dv) FLOPs. Backward (chunk_gated_delta_rule_bwd recomputes W, U,
V_new and the states) 23 GEMMs: 8 of C^2 Dk, 5 of C^2 Dv, 2 of C^3, 8 of C Dk Dv, 2 C (C (8 Dk + 5 Dv + 2 C)
+ 8 Dk Dv) FLOPs, 2.6x the forward at Dk = Dv = 2 C. C x C products are counted full-square, as pipesim counts
attention. Megatron's gdn_layer_flops (megatron/training/training.py) counts the rule as 8 Hv Dv^2 per token.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from pipesim.errors import PipesimError
from pipesim.model.kernel_types import (
    Gemm,
    Kernel,
    MemoryBound,
    PieceKernels,
    dgrad_gemms,
    forward_gemms,
    wgrad_gemms,
)
from pipesim.model.scan_mixer import positive, projections, scan_chunks
from pipesim.model.tensor_types import SavedTensor, WeightTensor

STAT_BYTES = 4  # float32: the norms' rstd, the gate g and its chunk cumsum
BLOCK = "GDN"  # SavedTensor.block of everything the mixer keeps


@dataclass(frozen=True)
class GatedDeltaNet:
    """Sizes of a Gated DeltaNet mixer (Megatron-core's GatedDeltaNet; Hugging Face qwen3_next's linear_* keys)."""

    key_heads: int  # Hk: linear_num_key_heads
    value_heads: int  # Hv: linear_num_value_heads (a multiple of Hk)
    key_dim: int = 128  # Dk: linear_key_head_dim
    value_dim: int = 128  # Dv: linear_value_head_dim
    conv_kernel: int = 4  # linear_conv_kernel_dim
    chunk: int = 64  # the chunked kernel's chunk size (FLA's default)

    def __post_init__(self) -> None:
        for f in fields(self):
            positive(f"the Gated DeltaNet's {f.name}", getattr(self, f.name))
        if self.value_heads % self.key_heads:  # transformer_config.py: linear_num_value_heads % ..._key_heads == 0
            raise PipesimError(f"the Gated DeltaNet's {self.value_heads} value heads are not a multiple of its "
                               f"{self.key_heads} key heads")

    @property
    def qk_width(self) -> int:
        """Hk Dk: the width of q and of k (Megatron's qk_dim)."""
        return self.key_heads * self.key_dim

    @property
    def v_width(self) -> int:
        """Hv Dv: the width of v, of z and of the rule's output (Megatron's v_dim)."""
        return self.value_heads * self.value_dim

    @property
    def in_proj_width(self) -> int:
        """in_proj's outputs: q, k, v, z, beta and alpha (Megatron's in_proj_dim)."""
        return 2 * self.qk_width + 2 * self.v_width + 2 * self.value_heads

    @property
    def conv_channels(self) -> int:
        """What conv1d runs over: q, k and v (Megatron's conv_dim)."""
        return 2 * self.qk_width + self.v_width


def check_gdn_split(mixer: GatedDeltaNet, tp: int) -> None:
    """PipesimError unless tp splits the mixer as Megatron-core does: transformer_config.py asserts
    linear_num_key_heads % (tp cp) == 0 and linear_num_value_heads % (tp cp) == 0 (cp: the caller's); Hv is a
    multiple of Hk, so Hk % tp implies the other."""
    positive("tp", tp)
    if mixer.key_heads % tp or mixer.value_heads % tp:
        raise PipesimError(f"tp {tp} does not split the Gated DeltaNet's {mixer.key_heads} key heads and "
                           f"{mixer.value_heads} value heads (Megatron-core asserts both % tp == 0)")


def gdn_tensors(mixer: GatedDeltaNet, hidden: int, tp: int = 1) -> list[WeightTensor]:
    """The mixer's parameters on one tp rank as common.py builds them: in_proj [W / t, h] and out_proj [h, v / t]
    (bias False), conv1d weight [C / t, 1, K] (conv_bias False), dt_bias and A_log [Hv / t] each (all
    tensor_model_parallel), and out_norm's weight [Dv] (TENorm over hidden_size=value_head_dim, RMSNorm: no bias;
    not split, whole on every rank). W = in_proj_width, C = conv_channels, K = conv_kernel."""
    positive("hidden", hidden)
    check_gdn_split(mixer, tp)
    m, heads = mixer, mixer.value_heads // tp
    return [WeightTensor("in_proj", (m.in_proj_width // tp, hidden)),
            WeightTensor("conv1d weight", (m.conv_channels // tp, 1, m.conv_kernel)),
            WeightTensor("dt_bias", (heads,)), WeightTensor("A_log", (heads,)),
            WeightTensor("gated norm weight", (m.value_dim,)),
            WeightTensor("out_proj", (hidden, m.v_width // tp))]


def gdn_params(mixer: GatedDeltaNet, hidden: int, tp: int = 1) -> int:
    """The mixer's trainable parameters on one tp rank (`gdn_tensors`'): (h W + C K + 2 Hv + v h) / t + Dv. NOT
    the layer's pre-norm (in_proj's fused norm, whole on every rank: the caller's)."""
    positive("hidden", hidden)
    check_gdn_split(mixer, tp)
    m = mixer
    split = hidden * m.in_proj_width + m.conv_channels * m.conv_kernel + 2 * m.value_heads + m.v_width * hidden
    return split // tp + m.value_dim


def _rule(mixer: GatedDeltaNet, tokens: int, tp: int, batch: int) -> tuple[list[Gemm], list[Gemm]]:
    """chunk_gated_delta_rule's (forward, backward) GEMMs on one rank, batched over chunks x local value heads."""
    m, c, dk, dv = mixer, mixer.chunk, mixer.key_dim, mixer.value_dim
    bh = scan_chunks(m.chunk, tokens, batch) * (m.value_heads // tp)
    fwd = [Gemm("GDN (beta K) K^T", c, c, dk, bh),  # chunk_scaled_dot_kkt_fwd
           Gemm("GDN WY triangular inverse", c, c, c, bh),  # solve_tril, full-square
           Gemm("GDN W = A (beta K)", c, dk, c, bh), Gemm("GDN U = A (beta V)", c, dv, c, bh),  # recompute_w_u_fwd
           Gemm("GDN V_new = U - W S", c, dv, dk, bh), Gemm("GDN S += K^T V_new", dk, dv, c, bh),  # ..._fwd_h
           Gemm("GDN Q S", c, dv, dk, bh), Gemm("GDN Q K^T", c, c, dk, bh),  # chunk_fwd_o
           Gemm("GDN (Q K^T o M) V_new", c, dv, c, bh)]
    bwd = [Gemm("GDN W = A (beta K) (recompute)", c, dk, c, bh), Gemm("GDN U = A (beta V) (recompute)", c, dv, c, bh),
           Gemm("GDN V_new = U - W S (recompute)", c, dv, dk, bh),
           Gemm("GDN S += K^T V_new (recompute)", dk, dv, c, bh),
           Gemm("GDN Q K^T (recompute)", c, c, dk, bh),  # chunk_bwd_dv_local
           Gemm("GDN dV_new (Q K^T o M)^T dO", c, dv, c, bh),
           Gemm("GDN dV_new += K dS", c, dv, dk, bh),  # chunk_gated_delta_rule_bwd_dhu
           Gemm("GDN dS += Q^T dO", dk, dv, c, bh), Gemm("GDN dS -= W^T dV_new", dk, dv, c, bh),
           Gemm("GDN dQ = dO S^T", c, dk, dv, bh), Gemm("GDN dP = dO V_new^T", c, c, dv, bh),  # chunk_bwd_dqkwg
           Gemm("GDN dQ += dP K", c, dk, c, bh), Gemm("GDN dK += dP^T Q", c, dk, c, bh),
           Gemm("GDN dK = V_new dS^T", c, dk, dv, bh), Gemm("GDN dW = dV_new S^T", c, dk, dv, bh),
           Gemm("GDN dA = dW (beta K)^T", c, c, dk, bh), Gemm("GDN d(beta K) = A^T dW", c, dk, c, bh),  # wy bwd
           Gemm("GDN d(beta V) = A^T dU", c, dv, c, bh), Gemm("GDN dA += dU (beta V)^T", c, c, dv, bh),
           Gemm("GDN dA through the inverse A^T dA", c, c, c, bh),
           Gemm("GDN dA through the inverse (.) A^T", c, c, c, bh),
           Gemm("GDN dK from dA K", c, dk, c, bh), Gemm("GDN dK from dA^T K", c, dk, c, bh)]
    return fwd, bwd


def gdn_kernels(mixer: GatedDeltaNet, hidden: int, tokens: int, tp: int, *, sp: bool, dtype_bytes: int,
                batch: int) -> PieceKernels:
    """One mixer's kernels for one microbatch on one rank: F, I (input-gradient GEMMs, the rule's backward with its
    recomputation, every elementwise backward), W (in_proj's and out_proj's weight gradients).

    `tokens` = b s / cp (all-gathered under sp: `sp` changes none of the mixer's kernels); `batch` = b sequences,
    each in chunks of C. Bytes per kernel (d = dtype_bytes, float32 stats): conv F 2 c d, B 3 c d (c = t C / t_p);
    l2norm over q and k F 2 e d + 4 r, B 3 e d + 4 r (e = 2 t qk / t_p, r = 2 t Hk / t_p rows); the copies into
    the rule's layout (query_key.contiguous(), q and k repeated to Hv heads, v and z .contiguous()) and their
    backward (the repeat's sum, torch.split's concatenation of qkv's and of in_proj output's gradients); the gates
    F t Hl (3 d + 4), B t Hl (4 d + 4), g's chunk cumsum F and B 8 t Hl; the gated norm F 3 ev d + 4 t Hl (x, z
    in, y out), B 5 ev d + 4 t Hl (ev = t v / t_p); with b > 1 the output's [b, s] to [s, b] .contiguous() copy F
    and B. Not here: the pre-norm, residual, tp collectives and gradient accumulation (the caller's); the
    parameters' gradient partial sums (conv1d, A_log, dt_bias, the norm's weight); the chunk kernels' own
    reads and writes of A, h and v_new (inside the GEMM kernels)."""
    check_gdn_split(mixer, tp)
    positive("hidden", hidden)
    positive("dtype_bytes", dtype_bytes)
    m, d = mixer, dtype_bytes
    in_proj, out_proj = projections(hidden, m.in_proj_width, m.v_width, tokens, tp)
    rule_f, rule_b = _rule(m, tokens, tp, batch)
    hl = m.value_heads // tp
    c, w = tokens * m.conv_channels // tp, tokens * m.in_proj_width // tp
    e, rows = 2 * tokens * m.qk_width // tp, 2 * tokens * m.key_heads // tp  # q and k: elements, l2norm rows
    er, ev = tokens * hl * m.key_dim, tokens * m.v_width // tp  # q (or k) per value head; v, z, the output
    copies = d * (2 * e + e + 2 * er + 4 * ev)  # query_key.contiguous(); repeat to Hv heads; v and z .contiguous()
    norm = 3 * ev * d + STAT_BYTES * tokens * hl  # read x and z, write y; one float32 rstd per token and head
    t_out = [MemoryBound("GDN output transpose", 2 * ev * d)] if batch > 1 else []
    t_grad = [MemoryBound("GDN output gradient transpose", 2 * ev * d)] if batch > 1 else []
    f: list[Kernel] = [
        *forward_gemms([in_proj]),
        MemoryBound("GDN conv1d + SiLU", 2 * c * d),  # read qkv, write silu(conv)
        MemoryBound("GDN q k v z layout copies", copies),
        MemoryBound("GDN q k l2norm", 2 * e * d + STAT_BYTES * rows),
        MemoryBound("GDN gates", tokens * hl * (3 * d + STAT_BYTES)),  # read alpha, beta; write g (f32), beta
        MemoryBound("GDN g chunk cumsum", 2 * STAT_BYTES * tokens * hl),
        *rule_f, MemoryBound("GDN gated RMSNorm", norm), *t_out, *forward_gemms([out_proj])]
    i: list[Kernel] = [
        *dgrad_gemms([out_proj]), *t_grad, MemoryBound("GDN gated RMSNorm backward", norm + 2 * ev * d),
        MemoryBound("GDN dg reverse chunk cumsum", 2 * STAT_BYTES * tokens * hl), *rule_b,
        MemoryBound("GDN gates backward", tokens * hl * (4 * d + STAT_BYTES)),  # read dg, dbeta, alpha, beta
        MemoryBound("GDN q k l2norm backward", 3 * e * d + STAT_BYTES * rows),
        MemoryBound("GDN layout copies backward", d * (2 * er + e + 2 * c + 2 * w)),  # repeat's sum; two concats
        MemoryBound("GDN conv1d + SiLU backward", 3 * c * d),  # read x, dy; write dx
        *dgrad_gemms([in_proj])]
    return PieceKernels(tuple(f), tuple(i), tuple(wgrad_gemms([in_proj, out_proj])))


def gdn_saved(mixer: GatedDeltaNet, hidden: int, tokens: int, tp: int, *, sp: bool,
              dtype_bytes: int) -> list[SavedTensor]:
    """What the mixer keeps for its backward per microbatch on one rank: in_proj's input (the rank's shard under
    sp; TE gathers it again); FLA's CausalConv1dFunction's x (q, k, v before the conv); l2norm's output and float32
    rstd (per token and q / k head); the gates' input alpha (their fused softplus recomputed); chunk_gated_delta_rule's
    save_for_backward: q and k repeated to the Hv value heads, v, g's float32 chunk cumsum, beta and the WY inverse
    A [t, Hv, C] in the dtype (the states h and v_new are recomputed); the gated norm's input (the rule's output) and
    float32 rstd per token and value head; z and the norm's output (silu(z)'s product); out_proj's input. With
    Megatron's "gdn_norm_out" recomputation the norm's rstd, its output and out_proj's input would go (not modelled:
    pipesim has no such module). Parameters the functions save are not activations. Not the pre-norm's input."""
    check_gdn_split(mixer, tp)
    positive("hidden", hidden)
    positive("tokens", tokens)
    positive("dtype_bytes", dtype_bytes)
    m, d, t = mixer, dtype_bytes, tokens
    hl = m.value_heads // tp
    ev, er = t * m.v_width // tp, t * hl * m.key_dim
    gathered = d * t * hidden
    return [SavedTensor("in_proj input", gathered // tp if sp else gathered, block=BLOCK),
            SavedTensor("conv1d input (q, k, v)", d * t * m.conv_channels // tp, block=BLOCK),
            SavedTensor("l2norm output (q, k)", d * 2 * t * m.qk_width // tp, block=BLOCK),
            SavedTensor("l2norm rstd", STAT_BYTES * 2 * t * m.key_heads // tp, block=BLOCK),
            SavedTensor("gates input (alpha)", d * t * hl, block=BLOCK),
            SavedTensor("delta rule q and k (per value head)", d * 2 * er, block=BLOCK),
            SavedTensor("delta rule v", d * ev, block=BLOCK),
            SavedTensor("delta rule g (chunk cumsum)", STAT_BYTES * t * hl, block=BLOCK),
            SavedTensor("delta rule beta", d * t * hl, block=BLOCK),
            SavedTensor("delta rule A (WY inverse)", d * t * hl * m.chunk, block=BLOCK),
            SavedTensor("gated RMSNorm input", d * ev, block=BLOCK),
            SavedTensor("gated RMSNorm rstd", STAT_BYTES * t * hl, block=BLOCK),
            SavedTensor("output gate z", d * ev, block=BLOCK),
            SavedTensor("gated RMSNorm output", d * ev, block=BLOCK),
            SavedTensor("out_proj input", d * ev, block=BLOCK)]


def gdn_flops(mixer: GatedDeltaNet, hidden: int, tokens: int, tp: int = 1, *, batch: int = 1) -> tuple[int, int, int]:
    """(F, I, W) FLOPs of the mixer's Gemm kernels on one rank (gdn_kernels' summed by phase). The linears
    2 t h W / t and 2 t v h / t (Megatron's gdn_layer_flops terms) in each phase; the rule over K chunks and
    Hl = Hv / t local value heads F 2 K C Hl (C (3 Dk + 2 Dv + C) + 3 Dk Dv), I 2 K C Hl (C (8 Dk + 5 Dv + 2 C)
    + 8 Dk Dv)."""
    check_gdn_split(mixer, tp)
    positive("hidden", hidden)
    m, c, dk, dv = mixer, mixer.chunk, mixer.key_dim, mixer.value_dim
    k, hl = scan_chunks(m.chunk, tokens, batch), m.value_heads // tp
    linears = 2 * tokens * hidden * (m.in_proj_width + m.v_width) // tp
    rule_f = 2 * k * c * hl * (c * (3 * dk + 2 * dv + c) + 3 * dk * dv)
    rule_b = 2 * k * c * hl * (c * (8 * dk + 5 * dv + 2 * c) + 8 * dk * dv)
    return linears + rule_f, linears + rule_b, linears


__all__ = ["GatedDeltaNet", "check_gdn_split", "gdn_flops", "gdn_kernels", "gdn_params", "gdn_saved", "gdn_tensors"]
