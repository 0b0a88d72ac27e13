"""Communication of a transformer layer: its tensor- and expert-parallel collectives (context parallelism's:
pipesim.model.cp_exchanges).

Megatron-LM's tensor parallelism (Shoeybi et al. 2019): an attention and an MLP block each
column-parallel then row-parallel, so each block needs one all-reduce in forward (after the
row-parallel matmul) and one in backward (of the column-parallel matmul's input gradient).
Sequence parallelism (Korthikanti et al. 2022, section 4.2.2) replaces each all-reduce with an
all-gather before the block and a reduce-scatter after it: the same volume on the wire. Megatron
overlaps the backward input-gradient collective with the weight-gradient GEMM that follows it.
Bytes are those of the full (unsharded) tensor, the nccl-tests convention of comm/collective_costs.py.
Latent attention (Megatron-core's MLASelfAttention, which pipesim takes under sequence parallelism only:
pipesim.model.latent_attention) gathers its two latents and the rotary key before its column-parallel up projections
instead of the block's input; a multi-token-prediction module adds its embedding's and its projection's
(`tp_mtp_collectives`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipesim.model.config import ModelConfig
from pipesim.model.fp8 import FP8_GATHER_RECIPES, saved_bytes
from pipesim.model.latent_layer import check_latent
from pipesim.model.layer_parts import BLOCK, MAMBA, collective_sublayer, mlp_half
from pipesim.model.linear_attention import GDN
from pipesim.model.moe_layer import routed_tokens, tokens_here
from pipesim.model.options import LayerOptions

CE_REDUCTIONS = ("max logit", "target logit", "sum of exp")  # vocab-parallel cross-entropy's all-reduces
CE_BYTES = 4  # float32 per token, each


@dataclass(frozen=True)
class Collective:
    """One collective (or P2P exchange) a piece issues per microbatch, or per step for phase "step".

    phase: the action it falls in ("F", "I", "W") or "step" (once, around the optimizer step).
    overlaps: the computation it runs concurrently with in Megatron ("" when it blocks).
    count: how many times it runs back to back (ring steps).
    """

    kind: str  # all_reduce, all_gather, reduce_scatter, send_recv
    nbytes: int  # bytes (full tensor; for send_recv the bytes each rank sends)
    phase: str
    group: str  # parallel axis: tp, cp, dp
    what: str  # the tensor it moves
    overlaps: str = ""
    count: int = 1

    @property
    def total_bytes(self) -> int:
        return self.nbytes * self.count


def _residual_bytes(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """Bytes of the full (b, s / cp, h) activation on which the tp collectives run."""
    return b * opts.local_seq(model) * model.hidden * model.dtype_bytes



def _input_gather_bytes(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """Bytes of a block input's all-gather (forward, its recomputation, Megatron's re-gather for the weight gradient).

    In the dtype without FP8. Under FP8 Transformer Engine's LayerNormLinear gathers the quantized norm output
    (transformer_engine/pytorch/module/layernorm_linear.py @ v2.8: `gather_along_first_dim(ln_out, tp_group,
    quantizer=input_quantizer)`, or the userbuffers buffer filled through the same quantizer): one byte per element
    and the recipe's block scales (pipesim.model.fp8.saved_bytes). DTensor's tensor parallelism does so only under
    tensorwise FP8 (torchao's PrepareFloat8ModuleInput). A per-tensor scale's amax is reduced first
    (`_amax_reduction`)."""
    x = _residual_bytes(model, b, opts)
    return saved_bytes(x // model.dtype_bytes, opts.fp8) if _input_quantized(opts) else x


def _input_quantized(opts: LayerOptions) -> bool:
    """A block input is quantized on the rank's shard before its all-gather (`_input_gather_bytes`)."""
    return opts.fp8 is not None and not (opts.dtensor_tp and opts.fp8.recipe not in FP8_GATHER_RECIPES)


def _grad_quantized(opts: LayerOptions) -> bool:
    """A row-parallel output gradient is quantized on the rank's shard before its all-gather (`_grad_gather_bytes`)."""
    return opts.fp8 is not None and not opts.dtensor_tp


def _amax_reduction(opts: LayerOptions, quantized: bool, phase: str, what: str) -> list[Collective]:
    """The all-reduce of a shard-quantized tensor's amax over tp, blocking, before its cast: a scale that spans the
    whole tensor (`Fp8Options.tensor_scaled`) must be the same on every shard it gathers. Transformer Engine sets
    the tp group as the amax reduction group of a column-parallel linear's input quantizer and of a row-parallel
    one's output-gradient quantizer under sequence parallelism (transformer_engine/pytorch/module/linear.py,
    layernorm_linear.py, layernorm_mlp.py @ d0067d0da: set_quantizer_amax_reduction_group), and the quantizer
    all-reduces the amax between its amax kernel and its cast, the compute stream waiting on it (csrc/quantizer.cpp
    Float8CurrentScalingQuantizer::quantize_impl `amax_reduction_group->allreduce(...)->wait()`); torchao's
    tensorwise cast of a sharded DTensor reduces its torch.max over the mesh the same way."""
    if not (quantized and opts.fp8 is not None and opts.fp8.tensor_scaled):
        return []
    return [Collective("all_reduce", opts.fp8.amax_bytes, phase, "tp", f"{what} amax")]


def _grad_gather_bytes(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """Bytes of a row-parallel output gradient's all-gather in the backward: quantized first under Transformer
    Engine's FP8 (module/base.py @ v2.8 grad_output_preprocess: `gather_along_first_dim(grad_output, ...,
    quantizer=quantizer)`), in the dtype otherwise and under DTensor's (torchao casts the gradient inside its
    matmul, after the gather)."""
    x = _residual_bytes(model, b, opts)
    return saved_bytes(x // model.dtype_bytes, opts.fp8) if _grad_quantized(opts) else x


def _latent_inputs(model: ModelConfig, b: int, opts: LayerOptions) -> list[tuple[str, str, int]]:
    """(tensor, the linear reading it or "", bytes) of latent attention's sequence-parallel gathers: the Q latent
    (read by Q up; without a query latent, the block's input read by Q), the KV latent (read by KV up) and the rotary
    key (gather_from_sequence_parallel_region in get_query_key_value_tensors, read by no linear)."""
    mla = check_latent(model, opts)
    per_token = b * opts.local_seq(model) * model.dtype_bytes
    if mla.q_lora_rank is None:
        q = ("attention input", "Q", per_token * model.hidden)
    else:
        q = ("Q latent", "Q up", per_token * mla.q_lora_rank)
    return [q, ("KV latent", "KV up", per_token * mla.kv_lora_rank), ("rotary key", "", per_token * mla.qk_rope_dim)]


def _latent_forward(model: ModelConfig, b: int, opts: LayerOptions) -> list[Collective]:
    """Latent attention's forward under sp: its gathers, then the projection's reduce-scatter."""
    out = [Collective("all_gather", n, "F", "tp", f"{what} (before {linear})" if linear else what)
           for what, linear, n in _latent_inputs(model, b, opts)]
    return out + [Collective("reduce_scatter", _residual_bytes(model, b, opts), "F", "tp", "attention output")]


def _latent_backward(model: ModelConfig, b: int, opts: LayerOptions) -> list[Collective]:
    """Latent attention's backward under sp: the output gradient gathered (blocking); each up projection's saved
    sharded input gathered again for its weight gradient (beside its input-gradient GEMM) and its input gradient
    reduce-scattered (beside its weight-gradient GEMM), as the QKV's; the rotary key's gradient reduce-scattered
    (blocking). The down projections run on the rank's own tokens: no collective for them."""
    out = [Collective("all_gather", _residual_bytes(model, b, opts), "I", "tp", "attention output gradient")]
    for what, linear, n in _latent_inputs(model, b, opts):
        if not linear:
            out.append(Collective("reduce_scatter", n, "I", "tp", f"{what} gradient"))
            continue
        out += [Collective("all_gather", n, "I", "tp", f"{what}, again (for the {linear} weight gradient)",
                           overlaps=f"I: {linear} input-gradient GEMM"),
                Collective("reduce_scatter", n, "I", "tp", f"{what} gradient",
                           overlaps=f"W: {linear} weight-gradient GEMM")]
    return out


def _forward_tp(model: ModelConfig, b: int, opts: LayerOptions, *, moe: bool = False) -> list[Collective]:
    x = _residual_bytes(model, b, opts)
    out: list[Collective] = []
    for block, first in (("attention", "QKV"), ("MLP", "MLP up")):
        if block == "attention" and model.mla is not None:
            out += _latent_forward(model, b, opts)
        elif block == "MLP" and moe and opts.sp:
            out += _moe_tp(model, b, opts, "F")
        elif opts.sp:
            out += _amax_reduction(opts, _input_quantized(opts), "F", f"{block} input")
            out.append(Collective("all_gather", _input_gather_bytes(model, b, opts), "F", "tp",
                                  f"{block} input (before {first})"))
            out.append(Collective("reduce_scatter", x, "F", "tp", f"{block} output"))
        else:
            out.append(Collective("all_reduce", x, "F", "tp", f"{block} output"))
    return out


def tp_layer_collectives(model: ModelConfig, b: int, opts: LayerOptions, *, moe: bool = False) -> list[Collective]:
    """Tensor-parallel collectives of one layer per microbatch, in order (F, then backward).

    Without sp: F all_reduce of each block's output (2 x b s h d); backward all_reduce of each
    block's input gradient, overlapped with that block's first weight-gradient GEMM. With sp: F
    all_gather of each block's input and reduce_scatter of its output; backward all_gather of the
    output gradient (blocking), all_gather of the saved sharded input again (for the weight
    gradient; overlapped with the input-gradient GEMM) and reduce_scatter of the input gradient
    (overlapped with the weight-gradient GEMM). DTensor's tensor parallelism (`opts.dtensor_tp`, torchtitan's
    PrepareModuleInput then ColwiseParallel) gathers nothing again: autograd saved the gathered input. Under FP8
    the input gathers move FP8 bytes (Transformer Engine's, and the output gradients' too; DTensor's under
    tensorwise scaling only: `_input_gather_bytes`, `_grad_gather_bytes`), and under a per-tensor scale each such
    gather follows its amax's all-reduce (`_amax_reduction`). full recomputation first re-runs the
    forward's collectives in I; selective those inside its modules' checkpoints (`_module_collectives`).
    tp = 1: none. `moe`: the MLP block is the model's mixture of experts
    (`_moe_tp`: its expert-tp and shared experts' collectives instead of the dense MLP's). A part of the block
    (`opts.part`): its sublayer's (pipesim.model.layer_parts).
    """
    if opts.part == MAMBA:  # a hybrid model's Mamba layer
        return _mixer_collectives(model, b, opts, "Mamba")
    if opts.mixer == GDN:  # a linear-attention layer: its Gated DeltaNet half's, the block's MLP part's
        gdn = _mixer_collectives(model, b, opts, "GDN")
        mlp = tp_layer_collectives(model, b, mlp_half(opts), moe=moe)
        return [c for c in gdn if c.phase == "F"] + [c for c in mlp if c.phase == "F"] + \
            [c for c in mlp if c.phase != "F"] + [c for c in gdn if c.phase != "F"]
    colls = _block_collectives(model, b, opts, moe=moe)
    if opts.part == BLOCK:
        return colls
    return [c for c in colls if collective_sublayer(c.what) == opts.part]


def _mixer_collectives(model: ModelConfig, b: int, opts: LayerOptions, name: str) -> list[Collective]:
    """A Mamba or Gated DeltaNet mixer's (`name`): in_proj and out_proj split as QKV and the projection, so the
    attention sublayer's collectives, named for it."""
    attention = _block_collectives(model, b, replace(opts, part="attention", mixer="attention"), moe=False)
    return [replace(c, what=c.what.replace("attention", name).replace("QKV", "in_proj"),
                    overlaps=c.overlaps.replace("QKV", "in_proj"))
            for c in attention if collective_sublayer(c.what) == "attention"]


def _block_collectives(model: ModelConfig, b: int, opts: LayerOptions, *, moe: bool) -> list[Collective]:
    """`tp_layer_collectives` of the whole block."""
    opts.check(model)
    if opts.tp == 1:
        return []
    x = _residual_bytes(model, b, opts)
    forward = _forward_tp(model, b, opts, moe=moe)
    out = list(forward)
    if opts.recompute == "full":
        out += [Collective(c.kind, c.nbytes, "I", c.group, f"recompute: {c.what}") for c in forward]
    elif opts.recompute == "selective":
        out += _module_collectives(opts, forward, moe=moe)
    for block, first in (("MLP", "MLP up"), ("attention", "QKV")):  # backward runs the blocks in reverse
        if block == "attention" and model.mla is not None:
            out += _latent_backward(model, b, opts)
        elif block == "MLP" and moe and opts.sp:
            out += _moe_tp(model, b, opts, "I")
        elif opts.sp:
            out += _amax_reduction(opts, _grad_quantized(opts), "I", f"{block} output gradient")
            out.append(Collective("all_gather", _grad_gather_bytes(model, b, opts), "I", "tp",
                                  f"{block} output gradient"))
            if not opts.dtensor_tp:  # DTensor's autograd kept the gathered input: nothing to gather again
                out.append(Collective("all_gather", _input_gather_bytes(model, b, opts), "I", "tp",
                                      f"{block} input, again (for the {first} weight gradient)",
                                      overlaps=f"I: {first} input-gradient GEMM"))
            out.append(Collective("reduce_scatter", x, "I", "tp", f"{block} input gradient",
                                  overlaps=f"W: {first} weight-gradient GEMM"))
        else:  # a MoE layer without sp: the experts split over tp as the MLP (pipesim.model.options checks it)
            out.append(Collective("all_reduce", x, "I", "tp", f"{block} input gradient",
                                  overlaps=f"W: {first} weight-gradient GEMM"))
    return out


def _module_collectives(opts: LayerOptions, forward: list[Collective], *, moe: bool) -> list[Collective]:
    """The forward tp collectives selective recomputation's modules re-run in I, blocking as in the forward
    (pipesim.model.recompute_modules): mla_up_proj the latents' all-gathers inside its column-parallel up projections
    (the rotary key's is outside the checkpoint); mlp a dense MLP's (sp: its input's all-gather and output's
    reduce-scatter; else its all-reduce); moe a MoE layer's expert-tp and shared experts' (without sp: the MLP
    block's all-reduce); shared_experts the shared experts' (once more inside moe's re-run)."""
    mlp_block = {"MLP input amax", "MLP input (before MLP up)", "MLP output"}
    mlp_block |= {what for pair in MOE_TP["F"] for _, what in pair}
    shared = {what for _, what in MOE_TP["F"][1]}
    picked: list[Collective] = []
    if opts.recomputes("mla_up_proj"):
        picked += [c for c in forward if c.what.endswith(("(before Q up)", "(before KV up)", "(before Q)"))]
    if opts.recomputes("moe" if moe else "mlp"):
        picked += [c for c in forward if c.what in mlp_block]
    if moe and opts.recomputes("shared_experts"):
        picked += [c for c in forward if c.what in shared]
    return [Collective(c.kind, c.nbytes, "I", c.group, f"recompute: {c.what}") for c in picked]


MOE_TP = {  # phase -> the (kind, what) of the routed tokens' and the shared experts' collectives, in order
    "F": ((("all_gather", "dispatched tokens, over expert tp"), ("reduce_scatter", "expert outputs, over expert tp")),
          (("all_gather", "shared experts' input"), ("reduce_scatter", "shared experts' output"))),
    "I": ((("all_gather", "expert output gradient, over expert tp"),
           ("reduce_scatter", "dispatched tokens' gradient, over expert tp")),
          (("all_gather", "shared experts' output gradient"), ("reduce_scatter", "shared experts' input gradient"))),
}


def _moe_tp(model: ModelConfig, b: int, opts: LayerOptions, phase: str) -> list[Collective]:
    """Under sp, a MoE MLP's tp collectives in `phase` ("F", or "I": each gradient moves as its tensor did, the other
    way, blocking): with expert tp (etp = tp) the dispatched tokens all-gathered over the etp group before the
    experts and their outputs reduce-scattered after (Megatron-core's all-to-all dispatcher); the shared experts'
    input all-gathered and output reduce-scattered as the dense MLP's."""
    routed, shared = MOE_TP[phase]
    out = []
    if opts.etp > 1:
        nbytes = routed_tokens(model, b, opts) * model.hidden * model.dtype_bytes
        out += [Collective(kind, nbytes, phase, "tp", what) for kind, what in routed]
    if model.moe is not None and model.moe.shared_experts:
        x = _residual_bytes(model, b, opts)
        out += [Collective(kind, x, phase, "tp", what) for kind, what in shared]
    return out


def ep_layer_exchanges(model: ModelConfig, b: int, opts: LayerOptions) -> list[Collective]:
    """A MoE layer's expert-parallel all-to-alls per microbatch, in order: F dispatch then combine; backward the
    combine's gradient to the experts, then the dispatch's back (full recomputation re-runs the forward's two
    first). nbytes: what this rank sends, each of its tokens' k copies (the timing, pipesim.comm.all_to_all,
    counts peers and links); none with ep = 1. Selective recomputation's "moe" module re-runs them as full does."""
    if opts.ep == 1 or model.moe is None:
        return []
    sent = tokens_here(model, b, opts) * model.moe.top_k * model.hidden * model.dtype_bytes
    forward = [Collective("all_to_all", sent, "F", "ep", "MoE dispatch"),
               Collective("all_to_all", sent, "F", "ep", "MoE combine")]
    out = list(forward)
    if opts.recompute == "full" or opts.recomputes("moe"):
        out += [Collective(c.kind, c.nbytes, "I", "ep", f"recompute: {c.what}") for c in forward]
    return out + [Collective("all_to_all", sent, "I", "ep", "MoE combine backward"),
                  Collective("all_to_all", sent, "I", "ep", "MoE dispatch backward")]


def tp_embedding_collectives(model: ModelConfig, b: int, opts: LayerOptions) -> list[Collective]:
    """Vocab-parallel embedding: each rank looks up its rows, an all_reduce (sp: reduce_scatter) sums them in F."""
    opts.check(model)
    if opts.tp == 1:
        return []
    kind = "reduce_scatter" if opts.sp else "all_reduce"
    return [Collective(kind, _residual_bytes(model, b, opts), "F", "tp", "embedding output")]


def tp_head_collectives(model: ModelConfig, b: int, opts: LayerOptions) -> list[Collective]:
    """LM head (column-parallel over the vocabulary) and its vocab-parallel cross-entropy.

    F: (sp) all_gather of the head input; three all_reduces of one float32 per token (max logit,
    target logit, sum of exp). Backward: all_reduce (sp: all_gather again + reduce_scatter) of the
    head input gradient, overlapped with the head's weight-gradient GEMM.
    """
    opts.check(model)
    if opts.tp == 1:
        return []
    x = _residual_bytes(model, b, opts)
    tokens = b * opts.local_seq(model)
    out = [Collective("all_gather", x, "F", "tp", "head input")] if opts.sp else []
    out += [Collective("all_reduce", CE_BYTES * tokens, "F", "tp", f"cross-entropy {r}") for r in CE_REDUCTIONS]
    if opts.sp:
        out.append(Collective("all_gather", x, "I", "tp", "head input, again (for the head weight gradient)",
                              overlaps="I: head input-gradient GEMM"))
        out.append(Collective("reduce_scatter", x, "I", "tp", "head input gradient",
                              overlaps="W: head weight-gradient GEMM"))
    else:
        out.append(Collective("all_reduce", x, "I", "tp", "head input gradient",
                              overlaps="W: head weight-gradient GEMM"))
    return out


def tp_mtp_collectives(model: ModelConfig, b: int, opts: LayerOptions) -> list[Collective]:
    """A multi-token-prediction module's own tp collectives (its block's and its pass through the head are a layer's
    and the head's), Megatron-core's MultiTokenPredictionLayer: the vocab-parallel embedding of the shifted tokens
    summed (all_reduce; sp: reduce_scatter); the column-parallel projection 2h -> h / t (eh_proj, gather_output
    False) reading the concatenated 2h input (sp: all-gathered), its h / t outputs all-gathered over tp
    (gather_from_tensor_model_parallel_region) and, under sp, split back to the rank's tokens (no communication).
    Backward: the split's gradient all-gathered (sp; blocking); the projection's input gradient all-reduced (sp:
    its input gathered again, beside the input-gradient GEMM, and the gradient reduce-scattered), beside its
    weight-gradient GEMM. Full recomputation re-runs the projection's forward collectives first (the embedding is
    outside the checkpoint). tp = 1: none."""
    opts.check(model)
    if opts.tp == 1:
        return []
    x = _residual_bytes(model, b, opts)
    out = tp_embedding_collectives(model, b, opts)
    proj = [Collective("all_gather", 2 * x, "F", "tp", "MTP projection input")] if opts.sp else []
    proj.append(Collective("all_gather", x, "F", "tp", "MTP projection output (over its h / t columns)"))
    out += proj
    if opts.recompute == "full":
        out += [Collective(c.kind, c.nbytes, "I", c.group, f"recompute: {c.what}") for c in proj]
    if opts.sp:
        out += [Collective("all_gather", x, "I", "tp", "MTP block input gradient (the split's)"),
                Collective("all_gather", 2 * x, "I", "tp", "MTP projection input, again (for its weight gradient)",
                           overlaps="I: MTP projection input-gradient GEMM"),
                Collective("reduce_scatter", 2 * x, "I", "tp", "MTP projection input gradient",
                           overlaps="W: MTP projection weight-gradient GEMM")]
    else:
        out.append(Collective("all_reduce", 2 * x, "I", "tp", "MTP projection input gradient",
                              overlaps="W: MTP projection weight-gradient GEMM"))
    return out


__all__ = ["Collective", "ep_layer_exchanges", "tp_embedding_collectives", "tp_head_collectives",
           "tp_layer_collectives", "tp_mtp_collectives"]
