"""Activation memory of a transformer layer, built up from the tensors it saves for backward.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", section
4) count, per layer at 16 bits: each LayerNorm's input 2sbh; the QKV input 2sbh; Q and K 4sbh;
the softmax output 2as^2b, its dropout mask as^2b and the dropout's output 2as^2b; V 2sbh; the
projection input 2sbh; the attention dropout mask sbh; the MLP input 2sbh, GeLU input 8sbh,
second linear's input 8sbh and dropout mask sbh: s b h (34 + 5 a s / h). Listing the tensors
rather than the total lets grouped-query attention (K and V of h_kv), SwiGLU (gate and up of f),
models without dropout, other dtypes, tp, sp, cp and recomputation follow from the same list.
Masks are 1 byte (torch.bool), softmax statistics 4 (float32), everything else the model's dtype.
Norm statistics (mean / rstd: 4-8 bytes per token) are not counted, as in the paper. Latent attention saves its
latents and its own Q, K, V (pipesim.model.latent_attention.latent_saved) in place of the QKV input, Q, K and V;
a multi-token-prediction module saves its embedding's and projection's inputs, a layer and a head
(`mtp_activation_bytes`). Q, K, V and the attention output are heads x head_dim wide (the hidden size unless
`head_width` says otherwise); QK-norm (Qwen3) saves its two inputs, the QKV's query and key outputs before the norm.
"""

from __future__ import annotations

from dataclasses import replace

from pipesim.model.config import ModelConfig
from pipesim.model.fp8 import Fp8Options, saved_bytes
from pipesim.model.gemma_layer import post_norm_name
from pipesim.model.latent_layer import latent_saved, latent_widths
from pipesim.model.layer_kinds import StageLayers, kind_options
from pipesim.model.layer_parts import BLOCK, MAMBA, mlp_half, saved_sublayer
from pipesim.model.linear_attention import GDN
from pipesim.model.mixer_layer import mixer_part_saved
from pipesim.model.moe_layer import ROUTER_BYTES, routed_tokens, tokens_here
from pipesim.model.op_recompute import OP, op_saved
from pipesim.model.options import LayerOptions, vocab_shard
from pipesim.model.output_gate import gate_saved_bytes, qk_gate
from pipesim.model.recompute_modules import norms_recomputed
from pipesim.model.shared_gate import gate_saved
from pipesim.model.tensor_types import SavedTensor

MASK_BYTES = 1  # a dropout mask element (torch.bool)
CLAMPED = "expert FC1 output, clamped"  # the clamps' concatenated copy (pipesim.model.grouped_mlp_extras)
STAT_BYTES = 4  # flash attention's logsumexp per (token, head), float32
LOGIT_BYTES = 4  # the cross-entropy's softmax over the vocabulary, kept in float32 (Megatron)


def layer_saved_tensors(model: ModelConfig, b: int, opts: LayerOptions, *, recompute: str | None = None,
                        moe: bool = False) -> list[SavedTensor]:
    """The tensors one transformer layer (`_block_saved`) or one part of it (`opts.part`: its sublayer's,
    pipesim.model.layer_parts) saves on one rank for a microbatch of b sequences. Under full recomputation a part is
    a layer of its own (a hybrid model's): it keeps its input, as the block does."""
    full = (opts.recompute if recompute is None else recompute) == "full"
    if opts.part == MAMBA:  # a hybrid model's Mamba layer (pipesim.model.mixer_layer): under full, its input
        opts.check(model)
        residual = opts.seq_sharded(model.dtype_bytes * b * opts.local_seq(model) * model.hidden)
        return [SavedTensor("layer input", residual)] if full else mixer_part_saved(model, b, opts)
    if opts.mixer == GDN:  # a linear-attention layer: its Gated DeltaNet half's and the block's MLP part's
        opts.check(model)
        mlp = layer_saved_tensors(model, b, mlp_half(opts), recompute=recompute, moe=moe)
        return mlp if full else mixer_part_saved(model, b, opts) + mlp  # full: the MLP part's, the layer's input
    saved = _block_saved(model, b, opts, recompute=recompute, moe=moe)
    if opts.part == BLOCK or full:
        return saved
    return [x for x in saved if saved_sublayer(x.name) == opts.part]


def _block_saved(model: ModelConfig, b: int, opts: LayerOptions, *, recompute: str | None = None,
                 moe: bool = False) -> list[SavedTensor]:
    """The tensors one transformer layer saves on one rank for a microbatch of b sequences.

    recompute (default `opts.recompute`): "none" every tensor below; "selective" all but those its modules
    (`opts.modules`, pipesim.model.recompute_modules) drop, by default the attention core's (scores, softmax, its
    dropout; flash: its logsumexp); "full" the layer input only (Megatron keeps it sharded over tp under sequence
    parallelism); "op" what torchtitan's per-op policy keeps (pipesim.model.op_recompute.op_saved). `moe`: the
    layer's MLP is the model's mixture of experts (`_moe_saved`).
    """
    opts.check(model)
    recompute = opts.recompute if recompute is None else recompute
    d, t = model.dtype_bytes, opts.tp
    s_loc = opts.local_seq(model)
    tokens = s_loc * b  # tokens of the microbatch on this rank
    h, f, a = model.hidden, model.ffn_size, model.heads
    seq_split = opts.seq_sharded  # norms, dropout, the residual stream: split over tp only under sp
    if recompute == "full":
        return [SavedTensor("layer input", seq_split(d * tokens * h))]
    if recompute == OP:  # torchtitan's per-op policy (tp = cp = 1, no FP8: pipesim.model.op_recompute)
        return [SavedTensor(name, nbytes) for name, nbytes in op_saved(model, tokens)]
    norms = norms_recomputed(model, moe=moe)  # the norms "layernorm" re-runs (the rest are fused into TE linears)
    saved = [SavedTensor("attention norm input", seq_split(d * tokens * h))]
    if model.mla is not None:  # its latents and its own Q, K (nope + rope) and V (v_head) widths
        saved += [SavedTensor(name, nbytes, _latent_dropped_by(name), block="attention")
                  for name, nbytes in latent_saved(model, b, opts)]
        mla = model.mla  # mla_up_proj's checkpoint keeps the rotary key it rotates, all-gathered under sp
        saved.append(SavedTensor("rotary key (up-projection checkpoint input)", d * tokens * mla.qk_rope_dim,
                                 only_with="mla_up_proj", block="attention"))
        attention_out = d * tokens * latent_widths(model, t)[1]
    else:
        hq, hkv = model.attention_width, model.kv_width
        # under sp: re-gathered in backward (Megatron); DTensor's tp saves the gathered input its matmuls read
        gathered = opts.dtensor_tp and opts.sp
        saved.append(SavedTensor("QKV input", d * tokens * h if gathered else seq_split(d * tokens * h)))
        # each QK-norm (either kind) keeps its input, as the layer's norms: the QKV's query and key outputs
        if model.qk_norm or model.qk_l2_norm:
            saved += [SavedTensor("Q head norm input", d * tokens * hq // t),
                      SavedTensor("K head norm input", d * tokens * hkv // t)]
        saved += [SavedTensor("Q", d * tokens * hq // t),
                  SavedTensor("K", d * tokens * hkv // t),
                  SavedTensor("V", d * tokens * hkv // t)]
        attention_out = d * tokens * hq // t
    core = ("core_attn",)
    if opts.attention == "eager":  # eager needs cp = 1, so the keys are the rank's own s_loc = s tokens
        scores = b * (a // t) * s_loc * model.seq  # elements of one (b, a/t, s, s) tensor
        saved.append(SavedTensor("softmax output", d * scores, core, block="attention"))
        if model.dropout:  # the dropout's output, not the softmax's, is what A V reads
            saved.append(SavedTensor("softmax dropout mask", MASK_BYTES * scores, core, block="attention"))
            saved.append(SavedTensor("softmax dropout output", d * scores, core, block="attention"))
    else:  # flash: no s x s tensor; the kernel keeps one logsumexp per (token, head) and recomputes the scores
        saved.append(SavedTensor("attention logsumexp", STAT_BYTES * tokens * (a // t), core, block="attention"))
    saved.append(SavedTensor("attention output (projection input)", attention_out))
    if model.attention_gate:  # the product keeps its operands: the attention's output and the float32 sigmoid
        saved += [SavedTensor(name, nbytes, block="attention") for name, nbytes in gate_saved_bytes(
            qk_gate(model, b, opts), d)]
    if model.post_norms:  # Gemma's norm on the projection's (reduced, sp: scattered) output keeps its input
        saved.append(SavedTensor(post_norm_name("attention", "norm input"), seq_split(d * tokens * h),
                                 block="attention"))
    if model.dropout:
        saved.append(SavedTensor("attention dropout mask", seq_split(MASK_BYTES * tokens * h)))
    # the pre-MLP norm's output: a MoE layer's separate norm ("layernorm"); a dense MLP's checkpoint ("mlp") holds
    # TE's fused norm, so it keeps the norm's input and drops its output with the rest
    mlp = ("mlp",) if not moe else ()
    mlp_input = d * tokens * h if opts.dtensor_tp and opts.sp and not moe else seq_split(d * tokens * h)
    saved += [SavedTensor("MLP norm input", seq_split(d * tokens * h)),
              SavedTensor("MLP input", mlp_input, ("layernorm",) if "MLP" in norms else mlp)]
    if moe:
        saved += _moe_saved(model, b, opts)
    elif model.gated:  # a fused SwiGLU / GeGLU (Megatron's) saves gate and up, recomputes act(gate) * up
        saved += [SavedTensor("gate and up", 2 * d * tokens * f // t, mlp),
                  SavedTensor("down projection input", d * tokens * f // t, mlp)]
    else:
        saved += [SavedTensor("GeLU input" if model.activation == "gelu" else "ReLU output (squared ReLU's input)",
                              d * tokens * f // t, mlp),
                  SavedTensor("second linear input", d * tokens * f // t, mlp)]
    if model.post_norms:  # and on the MLP's output (inside FC2's module: a dense MLP's checkpoint re-runs it)
        saved.append(SavedTensor(post_norm_name("MLP", "norm input"), seq_split(d * tokens * h), mlp))
    if model.dropout:
        saved.append(SavedTensor("MLP dropout mask", seq_split(MASK_BYTES * tokens * h)))
    if recompute == "selective":
        modules = opts.modules
        saved = [x for x in saved if not set(x.dropped_by) & set(modules) and x.only_with in ("", *modules)]
    else:
        saved = [x for x in saved if not x.only_with]
    if opts.fp8 is not None and opts.fp8.impl == "te":  # torchao's Float8Linear saves its input in the dtype
        saved = _fp8_saved(saved, d, opts.fp8, flash=opts.fused_attention, moe=moe)
    if opts.act_fp8_store:
        stored = _stored_in_fp8(opts, clamped=moe and model.moe is not None and model.moe.glu_clamp is not None)
        saved = [replace(x, name=f"{x.name} (FP8 store)", nbytes=x.nbytes // d) if x.name in stored else x
                 for x in saved]
    return saved


def _stored_in_fp8(opts: LayerOptions, *, clamped: bool = False) -> tuple[str, ...]:
    """The SwiGLU inputs Megatron-core's --activation-func-fp8-input-store keeps as FP8 (fused_bias_swiglu.py:
    `input.to(torch.float8_e4m3fn)`, one byte per element, no scale): the dense MLP's, the shared experts' and the
    experts' gate and up, the last unless moe_act recomputes the activation (its checkpoint keeps the input as it
    came, in the dtype). A clamped expert activation stores its clamped copy so, the clamps their input (the FC1
    output) in the dtype."""
    experts = () if opts.recomputes("moe_act") else (CLAMPED,) if clamped else ("expert FC1 output",)
    return ("gate and up", "shared expert FC1 output") + experts


FP8_INPUTS = ("QKV input", "down projection input", "second linear input", "dispatched tokens (expert FC1 input)",
              "expert FC2 input", "shared expert FC2 input",  # an FP8 linear's input, saved by it alone
              # latent attention's: the down projections' input, and the normed latents the up projections read
              # (TE's LayerNormColumnParallelLinear keeps its norm's input in the dtype and its output as FP8)
              "Q/KV down input", "Q latent normed (Q up input)", "KV latent normed (KV up input)")


def _fp8_saved(saved: list[SavedTensor], d: int, fp8: Fp8Options, *, flash: bool, moe: bool) -> list[SavedTensor]:
    """The saved tensors under FP8: Transformer Engine's Linear saves its input as FP8 for the wgrad (one byte per
    element, its column-wise copy, or the row-wise shard it re-gathers under sequence parallelism; plus block scales:
    pipesim.model.fp8.saved_bytes) instead of in the dtype (transformer_engine/pytorch/module/linear.py @ v2.8:
    `saved_inputmat = inputmat`, the quantised input, its row-wise data discarded). The projection's input is
    also flash attention's output, which flash keeps in the dtype for its own backward, so under flash the FP8 copy
    comes on top, under delayed scaling only: every other recipe keeps the bf16 input alone
    (`Fp8Options.keeps_projection_input`); the MLP input of a mixture of experts is the router's too (a bf16 torch
    linear), so it stays."""
    out = []
    for x in saved:
        fp8_input = x.name in FP8_INPUTS or (x.name == "MLP input" and not moe)
        projection = x.name == "attention output (projection input)"
        if projection and fp8.keeps_projection_input:
            out.append(x)  # the bf16 tensor alone, flash's output under flash
        elif projection and flash:
            out += [x, replace(x, name="projection input (FP8)", nbytes=saved_bytes(x.nbytes // d, fp8))]
        elif fp8_input or projection:
            out.append(replace(x, name=f"{x.name} (FP8)", nbytes=saved_bytes(x.nbytes // d, fp8)))
        else:
            out.append(x)
    return out


def _latent_dropped_by(name: str) -> tuple[str, ...]:
    """Which module drops one of latent attention's saved tensors (pipesim.model.latent_layer.latent_saved's names):
    the input norm's output ("layernorm": MLA's input norm is a module of its own), the normed latents and Q, K, V
    ("mla_up_proj"); the latents themselves are its checkpoint's inputs."""
    if name == "Q/KV down input":
        return ("layernorm",)
    return ("mla_up_proj",) if "normed" in name or name in ("Q", "K", "V") else ()


def _moe_saved(model: ModelConfig, b: int, opts: LayerOptions) -> list[SavedTensor]:
    """What a mixture-of-experts MLP saves (Megatron-core's all-to-all dispatcher, the slowest rank's tokens): the
    router's float32 probabilities, the dispatched tokens (expert FC1 input), the experts' FC1 outputs (SwiGLU: gate
    and up) and FC2 input, each routed token's probability, and the shared experts' tensors as a dense MLP's.

    The probabilities weigh the experts' activation (TEGroupedMLP's weighted_bias_swiglu_impl), which keeps one per
    routed token; the unpermute after the combine is then a plain index sum that keeps nothing. Megatron-core moved
    them there in core_v0.13.0 (NVIDIA/Megatron-LM 2659630721, 'perf(MoE): Memory efficient token permutation',
    MR !2668, 2025-04); before it the unpermute multiplied the k expert outputs of each token by their probabilities
    and kept those outputs (d T k h bytes more per layer), which pipesim no longer counts. A clamped activation
    (GPT-OSS's) keeps the clamps' concatenated copy too, what the fused activation saves while the clamps keep the FC1
    output (pipesim.model.grouped_mlp_extras)."""
    moe = model.moe
    assert moe is not None
    d, h = model.dtype_bytes, model.hidden
    here = tokens_here(model, b, opts)
    routed = routed_tokens(model, b, opts)
    ffn = moe.expert_ffn // opts.etp
    fc1 = 2 * ffn if model.gated else ffn
    layer = ("moe",)  # the MoE layer's checkpoint keeps its input (the pre-MLP norm's output) only
    saved = [SavedTensor("router probabilities", ROUTER_BYTES * here * moe.experts, layer),
             SavedTensor("dispatched tokens (expert FC1 input)", d * routed * h, layer),
             SavedTensor("expert FC1 output", d * routed * fc1, layer),
             SavedTensor("expert FC2 input", d * routed * ffn, ("moe_act", "moe")),
             *([SavedTensor(CLAMPED, d * routed * fc1, ("moe_act", "moe"))] if moe.glu_clamp is not None else []),
             SavedTensor("routed probabilities (weighted activation input)", ROUTER_BYTES * routed, layer)]
    width = moe.shared_experts * moe.shared_width // opts.tp
    if width:
        tokens = opts.local_seq(model) * b
        shared = ("moe", "shared_experts")
        saved += [SavedTensor("shared expert FC1 output", d * tokens * (2 * width if model.gated
                                                                          else width), shared),
                  SavedTensor("shared expert FC2 input", d * tokens * width, shared)]
        if moe.shared_gate:  # the gate's product keeps the (sp: scattered) shared output and the scores
            saved += [SavedTensor(name, nbytes, shared) for name, nbytes in gate_saved(here, h, d)]
    return saved


def layer_activation_bytes(model: ModelConfig, b: int, opts: LayerOptions, *, moe: bool = False) -> int:
    """Bytes one layer stashes per microbatch on one rank, until its backward (the sum of the saved tensors)."""
    return sum(x.nbytes for x in layer_saved_tensors(model, b, opts, moe=moe))


def recompute_working_bytes(model: ModelConfig, b: int, opts: LayerOptions, *, moe: bool = False) -> int:
    """Bytes a recomputed layer re-creates, live during that layer's backward only.

    full: everything the layer would have saved, less the stashed input it is rebuilt from; selective: what its
    modules dropped, the larger of the two blocks' (the MLP's re-created tensors are freed by its backward before
    the attention block's are re-created); by default the attention core's tensors; none: 0.
    """
    if opts.recompute == "none":
        return 0
    every = layer_saved_tensors(model, b, opts, recompute="none", moe=moe)
    if opts.recompute == "selective":
        modules = set(opts.modules)
        dropped = [x for x in every if set(x.dropped_by) & modules]
        return max(sum(x.nbytes for x in dropped if x.block == block) for block in ("attention", "MLP"))
    return sum(x.nbytes for x in every) - layer_activation_bytes(model, b, opts, moe=moe)


def stage_recompute_bytes(model: ModelConfig, b: int, opts: LayerOptions, mix: StageLayers) -> int:
    """The recompute working set of a stage (its layers `mix`): one layer is re-run at a time, the largest kind's."""
    return max((recompute_working_bytes(model, b, kind_options(model, opts, kind), moe=kind.moe) for kind, _ in mix),
               default=0)


def embedding_activation_bytes(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """The embedding's stash: its dropout mask (GPT; split over tp under sp). The token ids are not counted."""
    opts.check(model)
    if not model.dropout:
        return 0
    return opts.seq_sharded(MASK_BYTES * opts.local_seq(model) * b * model.hidden)


def head_activation_bytes(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """Final norm input and head input (split over tp under sp) plus the float32 softmax over the vocab shard.

    Not recomputed under any --recompute (Megatron recomputes transformer layers only).
    """
    opts.check(model)
    tokens = opts.local_seq(model) * b
    hidden = 2 * opts.seq_sharded(model.dtype_bytes * tokens * model.hidden)
    return hidden + LOGIT_BYTES * tokens * vocab_shard(model, opts.tp)


def mtp_activation_bytes(model: ModelConfig, b: int, opts: LayerOptions, *, moe: bool = False) -> int:
    """Stash of one multi-token-prediction module per microbatch (Megatron-core's MultiTokenPredictionLayer; `moe`:
    its block has experts): its embedding's dropout mask (as the embedding's), the embedding output (enorm's input)
    and the projection's input (the concatenated 2h, split over tp under sp), its block as a layer, and its final
    norm, head and float32 logits as the head's. The hidden state it starts from (hnorm's input) is the previous
    head's input, saved there already. Full recomputation checkpoints the projection, the block and the final norm
    (Megatron-core's _checkpointed_forward): the embedding output and the head's input and logits stay."""
    opts.check(model)
    hidden = opts.seq_sharded(model.dtype_bytes * opts.local_seq(model) * b * model.hidden)
    head = head_activation_bytes(model, b, opts)
    total = embedding_activation_bytes(model, b, opts) + hidden
    if opts.recompute == "full":
        return total + head - hidden
    return total + 2 * hidden + layer_activation_bytes(model, b, opts, moe=moe) + head


def mtp_moe_layers(model: ModelConfig) -> int:
    """How many of the multi-token-prediction modules' blocks have experts (layer indices layers, layers + 1, ...)."""
    moe = model.moe
    return 0 if moe is None else moe.moe_layers(model.layers, model.mtp_layers)


def stage_activation_bytes(model: ModelConfig, b: int, opts: LayerOptions, mix: StageLayers, *, first: bool,
                           last: bool) -> int:
    """Stash of one microbatch on a pipeline stage: its layers `mix` (each kind under its own options,
    pipesim.model.layer_kinds), plus embedding / head (and the multi-token-prediction modules) where held."""
    total = sum(n * layer_activation_bytes(model, b, kind_options(model, opts, kind), moe=kind.moe) for kind, n in mix)
    if first:
        total += embedding_activation_bytes(model, b, opts)
    if last:
        total += head_activation_bytes(model, b, opts)
        experts = mtp_moe_layers(model)
        total += (model.mtp_layers - experts) * mtp_activation_bytes(model, b, opts)
        total += experts * mtp_activation_bytes(model, b, opts, moe=True) if experts else 0
    return total


__all__ = ["SavedTensor", "embedding_activation_bytes", "head_activation_bytes", "layer_activation_bytes",
           "layer_saved_tensors", "mtp_activation_bytes", "mtp_moe_layers", "recompute_working_bytes",
           "stage_activation_bytes", "stage_recompute_bytes"]
