"""The GPU kernels of a transformer's pieces beside its layers, for one microbatch on one rank, per F, I and W: the
embedding (first stage), the final norm, LM head and cross-entropy (last stage), a multi-token-prediction module's own
kernels (DeepSeek-V3), and the lecture MLP's layer. Kernel types and byte rules as pipesim.model.layer_kernels'.
"""

from __future__ import annotations

from dataclasses import replace

from pipesim.errors import PipesimError
from pipesim.model.activations import MASK_BYTES
from pipesim.model.config import ModelConfig
from pipesim.model.gemma_layer import embedding_scale_bytes
from pipesim.model.kernel_types import (
    Gemm,
    Kernel,
    MemoryBound,
    PieceKernels,
    dgrad_gemms,
    forward_gemms,
    wgrad_gemms,
    with_tokens,
)
from pipesim.model.options import LayerOptions, vocab_shard

FP32 = 4  # bytes: Megatron's vocab-parallel cross-entropy runs on float32 logits (logits.float())


CE_IMPLS = ("native", "te")  # Megatron-core's --cross-entropy-fusion-impl choices
CE_FUSIONS = ("unfused", *CE_IMPLS)  # the cross-entropy a head runs: Megatron-core's unfused one, or a fused impl
# bytes per logit of each (forward, backward): (d + float32 passes x 4) for unfused and native, multiples of d for te
_CE_FP32_PASSES = {"unfused": (9, 3), "native": (5, 2)}


def head_kernels(model: ModelConfig, b: int, opts: LayerOptions, *, ce_fusion: str = "unfused") -> PieceKernels:
    """Final norm, LM head (h x ceil(V / t)) and Megatron's vocab-parallel cross-entropy on float32 logits.

    Cross-entropy forward: cast to float32 (read d, write 4), max (read 4), subtract (read 4,
    write 4), exp (read 4, write 4), sum (read 4), divide (read 4, write 4): d + 36 bytes per
    logit; backward: scale the saved softmax (read 4, write 4), cast back (read 4, write d):
    12 + d. That is Megatron's default. `ce_fusion` "native" (--cross-entropy-loss-fusion, Megatron-core's
    megatron/core/fusions/fused_cross_entropy.py: each @jit_fuser function one kernel that reads its logit-sized
    inputs once and writes its outputs, an input it changes in place written back): forward cast + max (read d,
    write 4), subtract + exp + sum (read 4, write 4), divide (read 4, write 4): d + 20; backward one kernel (read
    the softmax 4, write it back 4, write the gradient d): 8 + d. "te" (--cross-entropy-fusion-impl te: Transformer
    Engine's Triton parallel_cross_entropy, transformer_engine/pytorch/triton/cross_entropy.py @ v2.9, on the bf16
    logits): the online-softmax pass reads them (d), the loss pass reads them again and writes the gradient over
    them in place (2 d): 3 d; backward the in-place scale by the per-token loss gradient (read d, write d): 2 d.
    """
    opts.check(model)
    d = model.dtype_bytes
    tokens = b * opts.local_seq(model)
    hidden = opts.seq_sharded(tokens * model.hidden)
    vocab = vocab_shard(model, opts.tp)
    logits = tokens * vocab
    norm = "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"
    if ce_fusion not in CE_FUSIONS:
        raise PipesimError(f"unknown cross-entropy {ce_fusion!r}; choose {', '.join(CE_FUSIONS)}")
    if ce_fusion == "te":
        ce_f, ce_b = 3 * d, 2 * d  # bytes per logit (above)
    else:
        passes_f, passes_b = _CE_FP32_PASSES[ce_fusion]
        ce_f, ce_b = d + passes_f * FP32, d + passes_b * FP32
    f: tuple[Kernel, ...] = (MemoryBound(f"final {norm}", 2 * hidden * d), Gemm("LM head", tokens, vocab, model.hidden),
                             MemoryBound("cross-entropy", logits * ce_f))
    i: tuple[Kernel, ...] = (MemoryBound("cross-entropy backward", logits * ce_b),
                             Gemm("LM head dgrad", tokens, model.hidden, vocab),
                             MemoryBound(f"final {norm} backward", 3 * hidden * d))
    w: tuple[Kernel, ...] = (Gemm("LM head wgrad", model.hidden, vocab, tokens),)
    return PieceKernels(f, i, w)


def embedding_kernels(model: ModelConfig, b: int, opts: LayerOptions) -> PieceKernels:
    """Vocab-parallel token lookup (+ learned positions, + dropout): memory-bound, no FLOPs.

    F: gather the rows (read and write b s h); the position add (read 2, write 1); Gemma's scale by sqrt(h) and dropout
    on the (sp: sharded) output (the scale's gradient in W, before the table's). W: the table's gradient, a scatter-add
    of b s h gradient rows into the rank's ceil(V / t) x h rows (read the gradient, write the table).
    """
    opts.check(model)
    d = model.dtype_bytes
    tokens = b * opts.local_seq(model)
    full = tokens * model.hidden
    out = opts.seq_sharded(full)
    f: list[Kernel] = [MemoryBound("embedding lookup", 2 * full * d)]
    if model.positions == "learned":
        f.append(MemoryBound("position add", 3 * full * d))
    w: list[Kernel] = []
    if model.embedding_scale:  # Gemma: x sqrt(h) on the (sp: scattered) output, and on its gradient
        f.append(MemoryBound("embedding scale", embedding_scale_bytes(out, d)))
        w.append(MemoryBound("embedding scale backward", embedding_scale_bytes(out, d)))
    if model.dropout:
        f.append(MemoryBound("embedding dropout", 2 * out * d + MASK_BYTES * out))
    table = vocab_shard(model, opts.tp) * model.hidden
    return PieceKernels(tuple(f), (), (*w, MemoryBound("embedding backward", full * d + table * d)))


def mtp_kernels(model: ModelConfig, b: int, opts: LayerOptions) -> PieceKernels:
    """A multi-token-prediction module's own kernels (its block's and its pass through the shared head are
    `layer_kernels` and `head_kernels`): the shifted tokens' embedding (`embedding_kernels`, named "MTP ..."), the
    two input norms on the (sp: sharded) hidden size (enorm on the embedding, hnorm on the previous depth's hidden
    state; F 2, B 3 bytes per element and dtype byte), their concatenation (read and write the 2h; its backward takes
    views), and the projection 2h -> h / t on the rank's tokens (all-gathered under sp), F, dgrad and wgrad."""
    check_mtp(model, opts)
    d = model.dtype_bytes
    tokens = b * opts.local_seq(model)
    hidden = opts.seq_sharded(tokens * model.hidden)
    emb = embedding_kernels(model, b, opts)
    norm = "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"
    proj = with_tokens([("MTP projection", 2 * model.hidden, model.hidden // opts.tp)], tokens)
    f = [*(_renamed(k) for k in emb.F), MemoryBound(f"MTP embedding {norm}", 2 * hidden * d),
         MemoryBound(f"MTP hidden {norm}", 2 * hidden * d), MemoryBound("MTP concatenation", 4 * hidden * d),
         *forward_gemms(proj)]
    i = [*dgrad_gemms(proj), MemoryBound(f"MTP embedding {norm} backward", 3 * hidden * d),
         MemoryBound(f"MTP hidden {norm} backward", 3 * hidden * d)]
    if opts.recompute == "full":  # Megatron-core checkpoints the projection (the embedding stays outside)
        i = [*f[len(emb.F):], *i]
    w = [*wgrad_gemms(proj), *(_renamed(k) for k in emb.W)]
    return PieceKernels(tuple(f), tuple(i), tuple(w))


def _renamed(kernel: Kernel) -> Kernel:
    """An embedding kernel as the multi-token-prediction module runs it again."""
    return replace(kernel, name=f"MTP {kernel.name}")


def check_mtp(model: ModelConfig, opts: LayerOptions) -> None:
    """PipesimError unless the model's multi-token-prediction modules can be costed under these options: Megatron-core
    does not support them with context parallelism."""
    opts.check(model)
    if not model.mtp_layers:
        raise PipesimError("multi-token-prediction costs need a model with mtp_layers")
    if opts.cp > 1:
        raise PipesimError(f"multi-token prediction with --cp {opts.cp}: Megatron-core does not support it with "
                           "context parallelism")


def mlp_layer_kernels(b: int, hidden: int, dtype_bytes: int, tp: int, *, input_grad: bool = True) -> PieceKernels:
    """The lecture MLP's Linear(h, h / t) + GeLU on b rows: one GEMM each for F, I (unless the data needs
    no gradient) and W, and the GeLU as a memory-bound kernel (F 2, B 3 values per element)."""
    out = hidden // tp  # model_costs checks that tp divides the hidden size
    act = b * out * dtype_bytes  # bytes of the layer's output on this rank
    i: tuple[Kernel, ...] = (MemoryBound("GeLU backward", 3 * act),)
    if input_grad:
        i += (Gemm("linear dgrad", b, hidden, out),)
    return PieceKernels((Gemm("linear", b, out, hidden), MemoryBound("GeLU", 2 * act)), i,
                        (Gemm("linear wgrad", hidden, out, b),))


__all__ = ["CE_FUSIONS", "CE_IMPLS", "check_mtp", "embedding_kernels", "head_kernels", "mlp_layer_kernels",
           "mtp_kernels"]
