"""Memory-bound (non-GEMM) work of a transformer layer: bytes each elementwise op reads and writes.

For timing on a GPU, where these ops run at HBM bandwidth, not at the tensor cores' rate. Each op
is counted unfused, as eager PyTorch runs it: forward reads its inputs and writes its output;
backward reads the output gradient and what it saved and writes the input gradient(s). A fused
kernel moves less; these are the upper figures. Parameter reads of the norms are left out (h
values against tokens x h). Flash attention's softmax lives inside its kernel (counted as FLOPs). Latent
attention adds an RMSNorm on each latent, rotates only the rope parts (the queries' and the one shared rotary key per
token), and assembles Q, K and V out of the up projections' outputs (pipesim.model.latent_attention). QK-norm
(`ModelConfig.qk_norm`, Qwen3) is a norm over head_dim on every query and every key head: one op on the queries and one
on the keys, costed as the other norms on their elements; Llama 4's weightless L2 norm (`qk_l2_norm`) moves the same
bytes (pipesim.model.llama4_attention), and its NoPE layers (LayerOptions.nope) rotate nothing. Gemma's post-norms
(`ModelConfig.post_norms`) are one more norm on each block's output (pipesim.model.gemma_layer); GeGLU moves SwiGLU's
bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipesim.model.activations import MASK_BYTES
from pipesim.model.config import ModelConfig
from pipesim.model.gemma_layer import post_norm_name
from pipesim.model.latent_layer import assembly_bytes, check_latent, rope_elements
from pipesim.model.op_recompute import OP
from pipesim.model.options import LayerOptions


def qk_norm_name(model: ModelConfig) -> str:
    """The QK-norm's kind in its ops' names: the model's norm (qk_norm) or "L2 norm" (qk_l2_norm)."""
    return "L2 norm" if model.qk_l2_norm else "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"


@dataclass(frozen=True)
class ElementwiseBytes:
    """Bytes moved to and from memory by one layer's elementwise ops on one rank, per microbatch."""

    forward: dict[str, int] = field(default_factory=dict)  # op -> bytes
    backward: dict[str, int] = field(default_factory=dict)  # op -> bytes (re-run forward ops: "recompute ...")

    @property
    def forward_total(self) -> int:
        return sum(self.forward.values())

    @property
    def backward_total(self) -> int:
        return sum(self.backward.values())


# The dense MLP's activation, as the elementwise ops that run it (one kernel each way per name)
ACTIVATION_OPS = {"gelu": ("GeLU",), "swiglu": ("SwiGLU",), "relu2": ("squared ReLU: ReLU", "squared ReLU: square"),
                  "geglu": ("GeGLU",)}
ALL_ACTIVATION_OPS = frozenset(name for names in ACTIVATION_OPS.values() for name in names)

def layer_elementwise_bytes(model: ModelConfig, b: int, opts: LayerOptions) -> ElementwiseBytes:
    """Softmax, norms, GeLU/SwiGLU, dropout, RoPE and residual adds of one layer, in bytes.

    Per op on n elements of d bytes: norm F 2nd, B 3nd; softmax F 2nd, B 3nd; GeLU F 2nd, B 3nd;
    SwiGLU (gate and up of n each) F 3nd, B 5nd; dropout F 2nd + n (mask), B 2nd + n; RoPE on Q and
    K F 2nd, B 2nd; residual add F 3nd, B 3nd (the two gradients summed). n follows tp, sp and cp
    as the tensors do (norms, dropout and residual adds run on every tp rank unless sp splits
    them). Recomputation re-runs forward ops in backward: all of them (full) or the eager
    attention core's softmax and dropout (selective), and the ops of a dense layer's other --recompute-modules
    (`_module_ops`: layernorm, mla_up_proj, mlp; a MoE layer's are pipesim.model.layer_kernels'). Latent
    attention: the Q and KV latents' norms (on n d_q and
    n d_c elements, split over tp under sp), RoPE on `rope_elements`, and the Q, K, V assembly (`assembly_bytes`,
    the same bytes in backward, where the gradients are split back). QK-norm: a norm on the rank's queries (n h_q / t
    elements) and one on its keys (n h_kv / t), F 2nd, B 3nd each, before RoPE (transformers' Qwen3Attention).
    """
    opts.check(model)
    d, t = model.dtype_bytes, opts.tp
    tokens = opts.local_seq(model) * b
    hidden = opts.seq_sharded(tokens * model.hidden)  # elements of the residual stream on this rank
    ffn = tokens * model.ffn_size // t
    fwd: dict[str, int] = {}
    bwd: dict[str, int] = {}
    core_ops: list[str] = []

    def op(name: str, f: int, bk: int, *, core: bool = False) -> None:
        fwd[name], bwd[name] = f, bk
        if core:
            core_ops.append(name)

    norm = "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"
    op(f"attention {norm}", 2 * hidden * d, 3 * hidden * d)
    if model.mla is not None:
        mla = check_latent(model, opts)
        for name, width in (("Q latent", mla.q_lora_rank), ("KV latent", mla.kv_lora_rank)):
            if width is not None:
                n = opts.seq_sharded(tokens * width)
                op(f"{name} {norm}", 2 * n * d, 3 * n * d)
        qk = rope_elements(model, b, opts)
        op("RoPE on Q and K", 2 * qk * d, 2 * qk * d)
        op("Q, K, V assembly", assembly_bytes(model, b, opts), assembly_bytes(model, b, opts))
    else:
        if model.qk_norm or model.qk_l2_norm:  # over head_dim, on the rank's query heads and its key heads
            for name, width in (("Q", model.attention_width), ("K", model.kv_width)):
                n = tokens * width // t
                op(f"{name} head {qk_norm_name(model)}", 2 * n * d, 3 * n * d)
        if model.positions == "rope" and not opts.nope:  # a NoPE layer rotates nothing
            qk = tokens * (model.attention_width + model.kv_width) // t
            op("RoPE on Q and K", 2 * qk * d, 2 * qk * d)
    if opts.attention == "eager":
        scores = b * (model.heads // t) * opts.local_seq(model) * model.seq
        op("softmax", 2 * scores * d, 3 * scores * d, core=True)
        if model.dropout:
            op("softmax dropout", 2 * scores * d + MASK_BYTES * scores, 2 * scores * d + MASK_BYTES * scores,
               core=True)
    if model.post_norms:  # Gemma's norm on the projection's output, before the residual add
        op(post_norm_name("attention", norm), 2 * hidden * d, 3 * hidden * d)
    if model.dropout:
        op("attention dropout", 2 * hidden * d + MASK_BYTES * hidden, 2 * hidden * d + MASK_BYTES * hidden)
    op("attention residual add", 3 * hidden * d, 3 * hidden * d)
    op(f"MLP {norm}", 2 * hidden * d, 3 * hidden * d)
    if model.gated:  # SwiGLU, GeGLU: gate and up read, their product written
        op(ACTIVATION_OPS[model.activation][0], 3 * ffn * d, 5 * ffn * d)
    elif model.activation == "relu2":  # Megatron-core's squared_relu, torch.pow(F.relu(x), 2): two kernels each way
        for name in ACTIVATION_OPS["relu2"]:
            op(name, 2 * ffn * d, 3 * ffn * d)
    else:
        op("GeLU", 2 * ffn * d, 3 * ffn * d)
    if model.post_norms:  # and on the MLP's output
        op(post_norm_name("MLP", norm), 2 * hidden * d, 3 * hidden * d)
    if model.dropout:
        op("MLP dropout", 2 * hidden * d + MASK_BYTES * hidden, 2 * hidden * d + MASK_BYTES * hidden)
    op("MLP residual add", 3 * hidden * d, 3 * hidden * d)
    rerun = list(fwd) if opts.recompute in ("full", OP) else []  # op: every elementwise op of the block again
    if opts.recompute == "selective":
        rerun = (core_ops if opts.recomputes("core_attn") else []) + _module_ops(model, opts, list(fwd), norm)
    for name in rerun:
        bwd[f"recompute {name}"] = fwd[name]
    return ElementwiseBytes(forward=fwd, backward=bwd)


def _module_ops(model: ModelConfig, opts: LayerOptions, ops: list[str], norm: str) -> list[str]:
    """Of a dense layer's ops `ops`, those its --recompute-modules other than core_attn re-run (pipesim.model
    .recompute_modules): layernorm latent attention's input norm (the others are fused into TE linears); mla_up_proj
    the latents' norms, RoPE and the Q, K, V assembly; mlp TE's fused pre-MLP norm and the activation."""
    names: set[str] = set()
    if opts.recomputes("layernorm") and model.mla is not None:
        names.add(f"attention {norm}")
    if opts.recomputes("mla_up_proj"):
        names |= {f"Q latent {norm}", f"KV latent {norm}", "RoPE on Q and K", "Q, K, V assembly"}
    if opts.recomputes("mlp"):  # with Gemma's post-norm, inside FC2's module
        names |= {f"MLP {norm}", *ALL_ACTIVATION_OPS, post_norm_name("MLP", norm)}
    return [name for name in ops if name in names]


__all__ = ["ElementwiseBytes", "layer_elementwise_bytes", "qk_norm_name"]
