"""The GPU kernels of a transformer layer for one microbatch on one rank, per F, I and W (the other pieces:
pipesim.model.piece_kernels).

Each kernel is typed by how it is timed (pipesim.model.kernel_types): a GEMM (its m, n, k and batch), a
flash-attention kernel (forward or backward), or a memory-bound kernel (the bytes it reads and writes). The
GEMMs and attention kernels carry exactly the FLOPs of pipesim/model/flops.py (tests tie them);
the memory-bound kernels follow Megatron-LM's fused kernels by default (bias + GeLU / SwiGLU,
bias + dropout + residual add, scale + mask + softmax, RoPE, LayerNorm: each reads its inputs
and writes its output once), or eager PyTorch's one kernel per op with `fused=False`
(Megatron's --no-bias-gelu-fusion, --no-bias-swiglu-fusion, --no-bias-dropout-fusion,
--no-masked-softmax-fusion and --no-rope-fusion at once). Byte formulas: docs/gpu_model.md.
Latent attention (`model.mla`): its five linears on the tokens each multiplies and a flash kernel whose value head
(`v_head_dim`) is narrower than its query/key head (pipesim.model.latent_attention); a multi-token-prediction
module's own kernels: pipesim.model.piece_kernels.mtp_kernels. Heads of `head_width` (Qwen3) size QKV, the
projection and the attention kernels at heads x head_dim, not the hidden size; QK-norm adds a norm kernel on the
queries and one on the keys.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.activations import MASK_BYTES
from pipesim.model.config import ModelConfig
from pipesim.model.cp_ring_kernels import cp_ring_bytes
from pipesim.model.elementwise import ACTIVATION_OPS, ALL_ACTIVATION_OPS, layer_elementwise_bytes, qk_norm_name
from pipesim.model.gemma_layer import post_norm_name
from pipesim.model.grouped_mlp_extras import expert_extras
from pipesim.model.kernel_types import (
    FlashAttention,
    Gemm,
    Kernel,
    Linear,
    MemoryBound,
    PieceKernels,
    dgrad_gemms,
    forward_gemms,
    wgrad_gemms,
    with_tokens,
)
from pipesim.model.latent_layer import check_latent, latent_linears, rope_elements
from pipesim.model.layer_parts import MAMBA, mlp_half, part_kernels
from pipesim.model.linear_attention import GDN
from pipesim.model.mixer_layer import mixer_part_kernels
from pipesim.model.moe_layer import ROUTER_BYTES, expert_shapes, tokens_here
from pipesim.model.op_recompute import OP, op_rerun_linears
from pipesim.model.options import LayerOptions
from pipesim.model.output_gate import gate_backward_bytes, gate_forward_bytes, qk_gate
from pipesim.model.recompute_modules import norms_recomputed
from pipesim.model.shared_gate import gate_kernels

# --activation-func-fp8-input-store's kernels (megatron/core/fusions/fused_bias_swiglu.py): the SwiGLU input cast to
# FP8 for the backward (`input.to(torch.float8_e4m3fn)`, read d and write 1 byte per element), and back to the dtype
# before the activation's backward (read 1, write d)
FP8_STORE = "SwiGLU input FP8 store"
FP8_RESTORE = "SwiGLU input FP8 restore"


def _fp8_store_kernels(prefix: str, elements: int, d: int, opts: LayerOptions) -> tuple[list[Kernel], list[Kernel]]:
    """([the forward's cast], [the backward's cast back]) of a SwiGLU input of `elements` under
    --activation-func-fp8-input-store, each reading one side and writing the other (d + 1 bytes per element); ([], [])
    without it."""
    if not opts.act_fp8_store:
        return [], []
    return [MemoryBound(f"{prefix}{FP8_STORE}", elements * (d + 1))], \
        [MemoryBound(f"{prefix}{FP8_RESTORE}", elements * (1 + d))]


def _linears(model: ModelConfig, b: int, opts: LayerOptions) -> tuple[list[Linear], list[Linear], list[Linear]]:
    """One layer's weight matrices on one tp rank, in forward order: (before the attention core, after it, the MLP).

    Column-parallel (QKV, FC1) split their outputs over t, row-parallel (projection, FC2) their
    inputs; QKV's outputs are h_q + 2 h_kv (heads x head_dim and twice kv heads x head_dim), the projection's
    inputs h_q; SwiGLU's gate and up are one FC1 of 2 f / t outputs, as Megatron's linear_fc1. Each
    multiplies b s / cp tokens (with sp, the all-gathered input); latent attention's linears are
    pipesim.model.latent_attention's, its down projections on the rank's own tokens.
    """
    h, f, t = model.hidden, model.ffn_size, opts.tp
    tokens = b * opts.local_seq(model)
    fc1 = 2 * f if model.gated else f
    mlp = [("FC1", h, fc1 // t, tokens), ("FC2", f // t, h, tokens)]
    if model.mla is not None:
        attn = [(x.name, x.inp, x.out, x.tokens) for x in latent_linears(model, b, opts)]
        return attn[:-1], attn[-1:], mlp
    hq = model.attention_width
    return [("QKV", h, model.qkv_width // t, tokens)], [("projection", hq // t, h, tokens)], mlp


def _attention(model: ModelConfig, b: int, opts: LayerOptions) -> tuple[list[Kernel], list[Kernel]]:
    """The attention core's (forward, backward) GEMMs or flash kernels (latent attention: query/key head nope + rope,
    value head v, one key/value head per query head; a windowed layer's kernels over its band, named apart)."""
    sq, sk = opts.local_seq(model), model.seq
    heads = model.heads // opts.tp
    if model.mla is not None:
        mla = check_latent(model, opts)
        hd, vd, kvh = mla.qk_head_dim, mla.v_head_dim, heads
    else:
        hd = vd = model.head_dim
        kvh = model.num_kv_heads // opts.tp
    if opts.cp > 1 and opts.cp_comm == "a2a":  # Ulysses: the whole sequence on heads / cp (the same FLOPs)
        sq, heads, kvh = sk, heads // opts.cp, kvh // opts.cp
    if opts.window is not None and not opts.fused_attention:
        raise PipesimError(f"sliding-window attention (a window of {opts.window} keys) is timed as a fused kernel "
                           "only: give --attention flash")
    if opts.fused_attention:
        v = None if vd == hd else vd
        name = "flash attention" if opts.window is None else "sliding-window attention"  # apart in StageSeconds
        fwd_f: list[Kernel] = [FlashAttention(name, b, sq, heads, hd, sk, kvh, False, v, opts.window)]
        bwd_f: list[Kernel] = [FlashAttention(f"{name} backward", b, sq, heads, hd, sk, kvh, True, v, opts.window)]
        if opts.cp > 1 and opts.cp_comm == "p2p":
            merge, sums = cp_ring_bytes(b * sq, heads, kvh, hd, vd, opts.cp, model.dtype_bytes)
            fwd_f.append(MemoryBound("CP ring merges", merge))
            bwd_f.append(MemoryBound("CP ring gradient sums", sums))
        return fwd_f, bwd_f
    bh = b * heads
    fwd: list[Kernel] = [Gemm("Q K^T", sq, sk, hd, bh), Gemm("A V", sq, vd, sk, bh)]
    bwd: list[Kernel] = [Gemm("A V dA", sq, sk, vd, bh), Gemm("A V dV", sk, vd, sq, bh),
                         Gemm("Q K^T dQ", sq, hd, sk, bh), Gemm("Q K^T dK", sk, hd, sq, bh)]
    return fwd, bwd


def _elementwise(model: ModelConfig, b: int, opts: LayerOptions, fused: bool) -> tuple[list[Kernel], list[Kernel]]:
    """The layer's memory-bound (forward, backward) kernels, without recomputation.

    Unfused: pipesim/model/elementwise.py's ops one kernel each, plus what Megatron's fusions
    remove: bias adds (before GeLU and before each dropout), the scale and the mask before the
    softmax, and RoPE as rotate / two products / sum. Fused: bias + activation one kernel (F
    reads its input, writes its output); bias + dropout + residual add one kernel (F reads the
    branch and the residual, writes the sum and the mask; B: dropout's gradient, the residual's
    gradient sum); scale + mask + softmax one kernel (F 2 S d, B 3 S d); RoPE one kernel.
    """
    ew = layer_elementwise_bytes(model, b, opts)
    d = model.dtype_bytes
    tokens = opts.local_seq(model) * b
    hidden = opts.seq_sharded(tokens * model.hidden)  # residual-stream elements on this rank
    ffn = tokens * model.ffn_size // opts.tp
    scores = b * (model.heads // opts.tp) * opts.local_seq(model) * model.seq
    if model.mla is not None:
        qk = rope_elements(model, b, opts)
    else:
        qk = tokens * (model.attention_width + model.kv_width) // opts.tp
    mask = MASK_BYTES * hidden if model.dropout else 0
    norm = "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"
    fwd: list[Kernel] = []
    bwd: list[Kernel] = []

    def op(name: str, f: int, bk: int) -> None:
        fwd.append(MemoryBound(name, f))
        bwd.append(MemoryBound(f"{name} backward", bk))

    def from_ew(name: str) -> None:
        if name in ew.forward:
            op(name, ew.forward[name], ew.backward[name])

    from_ew(f"attention {norm}")
    qk_kind = qk_norm_name(model)  # QK-norm (qk_norm, qk_l2_norm): one kernel on the queries, one on the keys
    from_ew(f"Q head {qk_kind}")
    from_ew(f"K head {qk_kind}")
    from_ew(f"Q latent {norm}")  # latent attention's latents' norms and its Q, K, V assembly (elementwise.py)
    from_ew(f"KV latent {norm}")
    from_ew("Q, K, V assembly")
    if model.positions == "rope" and not opts.nope:  # a NoPE layer (ModelConfig.nope_every) rotates nothing
        if fused and model.rope_mscale == 1.0:  # YaRN's attention factor: Megatron-core's RoPE unfused (hf_rope)
            from_ew("RoPE on Q and K")
        else:  # rotate_half (read, write), x cos, rot sin (read, write each), their sum (read 2, write)
            op("RoPE on Q and K (unfused)", 9 * qk * d, 9 * qk * d)
    if opts.attention == "eager":
        if not fused:  # scale, then masked_fill (reads the mask), then softmax
            op("attention scale", 2 * scores * d, 2 * scores * d)
            op("attention mask", 2 * scores * d + scores, 2 * scores * d + scores)
        from_ew("softmax")
        from_ew("softmax dropout")
    if model.attention_gate:  # Megatron-core's Attention._apply_output_gate, eager: x * sigmoid(gate.float())
        gated = qk_gate(model, b, opts)
        fwd += [MemoryBound(name, nbytes) for name, nbytes in gate_forward_bytes(gated, d)]
        bwd += [MemoryBound(name, nbytes) for name, nbytes in gate_backward_bytes(gated, d)]
    for block in ("attention", "MLP"):
        if block == "MLP":
            from_ew(f"MLP {norm}")
            acts = ACTIVATION_OPS[model.activation]
            if model.biases and not fused:  # bias add before the activation; its gradient: a reduction
                op(f"{acts[0]} bias add", 2 * ffn * d * (2 if model.gated else 1), ffn * d)
            for act in acts:
                from_ew(act)
            store, restore = _fp8_store_kernels("", 2 * ffn, d, opts)  # its input (gate and up), to FP8 and back
            fwd += store
            bwd += restore
        from_ew(post_norm_name(block, norm))  # Gemma's norm on the block's output (pipesim.model.gemma_layer)
        if fused and (model.dropout or model.biases):  # bias + dropout + add: one kernel forward
            fwd.append(MemoryBound(f"{block} bias-dropout-add", 3 * hidden * d + mask))
            if model.dropout:
                bwd.append(MemoryBound(f"{block} dropout backward", 2 * hidden * d + mask))
            bwd.append(MemoryBound(f"{block} residual gradient sum", 3 * hidden * d))
            continue
        if model.biases:
            op(f"{block} output bias add", 2 * hidden * d, hidden * d)
        from_ew(f"{block} dropout")
        from_ew(f"{block} residual add")
    return fwd, bwd


def _bias_gradients(model: ModelConfig, opts: LayerOptions, linears: list[Linear], tokens: int) -> list[Kernel]:
    """Each bias's gradient: a sum over the tokens of its output gradient (Megatron: grad_output.sum(dim=0) for QKV;
    autograd's reduction of the fused bias-GeLU and bias-dropout-add inputs for the others). The projection's
    and FC2's biases sit after the reduce (-scatter), on the (sp: sharded) residual stream. With Transformer Engine's
    linears the caller leaves QKV out: its weight-gradient GEMM computes that gradient (cuBLASLt's bias-gradient
    epilogue)."""
    d = model.dtype_bytes
    out = []
    for name, _, width, _ in linears:
        elements = opts.seq_sharded(tokens * width) if name in ("projection", "FC2") else tokens * width
        out.append(MemoryBound(f"{name} bias gradient", elements * d))
    return out


def layer_kernels(model: ModelConfig, b: int, opts: LayerOptions, *, fused: bool = True,
                  moe: bool = False) -> PieceKernels:
    """One transformer layer's kernels on one rank, recomputation (full: the whole forward; selective:
    the attention core and its memory-bound ops) first in I. Tokens: b s / cp (with sp, the
    all-gathered input the GEMMs see). `moe`: the layer's MLP is the model's mixture of experts
    (`_moe_mlp`) instead of the dense MLP. A part of the block (`opts.part`): its sublayer's kernels
    (pipesim.model.layer_parts)."""
    opts.check(model)
    if opts.part == MAMBA:  # a hybrid model's Mamba layer (pipesim.model.mixer_layer)
        return mixer_part_kernels(model, b, opts)
    if opts.mixer == GDN:  # a linear-attention layer: its Gated DeltaNet half and the block's MLP part
        mlp = layer_kernels(model, b, mlp_half(opts), fused=fused, moe=moe)
        gdn = mixer_part_kernels(model, b, opts)
        return PieceKernels(gdn.F + mlp.F, mlp.I + gdn.I, gdn.W + mlp.W)
    tokens = b * opts.local_seq(model)
    before, after, mlp = _linears(model, b, opts)
    attn = before + after
    core_f, core_b = _attention(model, b, opts)
    ew_f, ew_b = _elementwise(model, b, opts, fused)
    if moe:
        act = {*ALL_ACTIVATION_OPS, "SwiGLU bias add", "GeLU bias add"}  # the dense MLP's activation: replaced
        ew_f = [k for k in ew_f if k.name not in act]
        ew_b = [k for k in ew_b if k.name.removesuffix(" backward") not in act]
        mlp_f, mlp_i, mlp_w = _moe_mlp(model, b, opts)
        f = forward_gemms(before) + core_f + forward_gemms(after) + mlp_f + ew_f
        i = mlp_i + core_b + dgrad_gemms(attn) + ew_b
        w: list[Kernel] = list(wgrad_gemms(attn)) + mlp_w
        linears = attn
    else:
        linears = attn + mlp
        f = forward_gemms(before) + core_f + forward_gemms(after + mlp) + ew_f
        i = dgrad_gemms(mlp) + core_b + dgrad_gemms(attn) + ew_b
        w = list(wgrad_gemms(linears))
        mlp_f = []
    if model.has_qkv_bias:  # never with latent attention (ModelConfig refuses it)
        if not opts.te_linear:  # Transformer Engine adds it in the QKV GEMM's epilogue
            f[1:1] = [MemoryBound("QKV bias add", 2 * tokens * linears[0][2] * model.dtype_bytes)]
        biased = linears if model.biases else linears[:1]  # --add-qkv-bias: the QKV projection's alone
        w += _bias_gradients(model, opts, [x for x in biased if not (opts.te_linear and x[0] == "QKV")], tokens)
    if opts.recompute == "full":
        i = [*f, *i]
    elif opts.recompute == OP:  # torchtitan's per-op policy: wk, wo, w3 and every memory-bound op again
        i = [*ew_f, *forward_gemms(op_rerun_linears(model, tokens)), *i]
    elif opts.recompute == "selective":
        core_ew = {"softmax", "softmax dropout", "attention scale", "attention mask"}
        rerun = [*core_f, *(k for k in ew_f if k.name in core_ew)] if opts.recomputes("core_attn") else []
        i = [*rerun, *_module_reruns(model, opts, before, mlp, ew_f, mlp_f if moe else None), *i]
    return part_kernels(PieceKernels(tuple(f), tuple(i), tuple(w)), opts.part)


def _module_reruns(model: ModelConfig, opts: LayerOptions, before: list[Linear], mlp: list[Linear],
                   ew_f: list[Kernel], moe_f: list[Kernel] | None) -> list[Kernel]:
    """The forward kernels selective recomputation's other modules re-run in I (pipesim.model.recompute_modules):
    layernorm the norms that are modules of their own; mla_up_proj the up projections, the latents' norms, RoPE and
    the Q, K, V assembly; mlp a dense layer's FC1, activation, FC2 and TE's norm fused into FC1; moe the MoE
    forward (`moe_f`; a MoE layer), and once more what a nested moe_act or shared_experts checkpoint re-runs;
    moe_act the experts' activation; shared_experts the shared experts' MLP. The all-to-alls and tp collectives
    re-run with them are pipesim.model.layer_collectives'."""
    norm = "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"
    out: list[Kernel] = []
    if opts.recomputes("layernorm"):
        names = {f"{block} {norm}" for block in norms_recomputed(model, moe=moe_f is not None)}
        out += [k for k in ew_f if k.name in names]
    if opts.recomputes("mla_up_proj"):
        out += forward_gemms([x for x in before if x[0] in ("Q", "Q up", "KV up")])
        names = {f"Q latent {norm}", f"KV latent {norm}", "Q, K, V assembly"}
        out += [k for k in ew_f if k.name in names or k.name.startswith("RoPE on Q and K")]
    if moe_f is None:
        if opts.recomputes("mlp"):
            act = {f"MLP {norm}", *ALL_ACTIVATION_OPS, "SwiGLU bias add", "GeLU bias add", "GeGLU bias add",
                   "squared ReLU: ReLU bias add", FP8_STORE, post_norm_name("MLP", norm)}
            out += forward_gemms(mlp[:1]) + [k for k in ew_f if k.name in act] + forward_gemms(mlp[1:])
        return out
    moe_act = [k for k in moe_f if k.name.startswith("expert ") and isinstance(k, MemoryBound)]
    shared = [k for k in moe_f if k.name.startswith("shared ")]
    if opts.recomputes("moe"):
        out += moe_f
    out += moe_act if opts.recomputes("moe_act") else []
    return out + (shared if opts.recomputes("shared_experts") else [])


def _moe_mlp(model: ModelConfig, b: int, opts: LayerOptions) -> tuple[list[Kernel], list[Kernel], list[Kernel]]:
    """The mixture of experts' (F, I, W) kernels on one rank (pipesim.model.moe_layer; the all-to-alls and the
    expert-tp collectives are timed by the simulator, not here).

    F: router GEMM (tokens x E x h) and its float32 softmax and top-k (read and write the logits); permute (read
    and write the k copies); with the alltoall dispatcher and more than one local expert, the received tokens sorted
    by local expert before the experts and back after them (Megatron-core's permutation 2; DeepEP's layout needs
    neither); the local experts' grouped FC1, activation and FC2 (one batched GEMM per matrix: E /
    ep experts x tokens per expert, the slowest rank's); unpermute, a plain sum of each token's k outputs (read
    k copies, write one; the probabilities weigh the activation, which reads one per routed token); shared
    experts as a dense MLP of S x f_s columns split over tp. I and W: each GEMM's dgrad and wgrad, the
    activation's and the permutes' backward, the router's softmax backward. A clamped activation's input and the
    experts' FC2 bias add Megatron-core's kernels of pipesim.model.grouped_mlp_extras (the clamp before the
    activation, the bias after FC2).
    """
    moe = model.moe
    assert moe is not None  # layer_kernels' caller checked
    if model.biases and opts.etp > 1:
        raise PipesimError(f"experts with biases cannot be split over --etp {opts.etp}: Transformer Engine's "
                           "GroupedLinear has no bias under tensor parallelism")
    d = model.dtype_bytes
    h = model.hidden
    here = tokens_here(model, b, opts)
    shapes = expert_shapes(model, b, opts)
    n, local = shapes.tokens_per_expert, shapes.local_experts
    routed = n * local
    swiglu = model.gated
    # the experts' activation: one fused kernel (Megatron-core's weighted bias-SwiGLU, GeLU, or weighted squared ReLU:
    # use_fused_weighted_squared_relu, Nemotron 3's experts)
    act = "SwiGLU" if swiglu else "squared ReLU" if model.activation == "relu2" else "GeLU"
    act_f, act_b = (3, 5) if swiglu else (2, 3)  # bytes per ffn element and dtype byte (pipesim.model.elementwise)
    logits = here * moe.experts * ROUTER_BYTES
    probs = routed * ROUTER_BYTES  # one probability per routed token, read by the weighted activation (its
    # backward reads it and writes its gradient): Megatron-core >= 0.13 weighs the experts' activation, not the
    # unpermute (pipesim.model.activations._moe_saved)
    # --activation-func-fp8-input-store: the SwiGLU input (gate and up) cast to FP8 after the activation, back
    # before its backward (Megatron-core's weighted_bias_swiglu_impl with fp8_input_store)
    store, restore = _fp8_store_kernels("expert ", 2 * routed * shapes.ffn, d, opts)
    extra = expert_extras(routed, shapes.ffn, h, d, clamp=moe.glu_clamp is not None, bias=model.biases)
    f: list[Kernel] = [Gemm("router", here, moe.experts, h), MemoryBound("router softmax top-k", 2 * logits),
                       MemoryBound("token permute", 2 * here * moe.top_k * h * d),
                       Gemm("expert FC1", n, shapes.fc1_out, h, local), *extra.clamp_f,
                       MemoryBound(f"expert {act}", act_f * routed * shapes.ffn * d + probs), *store,
                       Gemm("expert FC2", n, h, shapes.ffn, local), *extra.bias_f,
                       MemoryBound("token unpermute", (moe.top_k + 1) * here * h * d)]
    i: list[Kernel] = [MemoryBound("token unpermute backward", (moe.top_k + 1) * here * h * d), *extra.bias_i,
                       Gemm("expert FC2 dgrad", n, shapes.ffn, h, local), *restore,
                       MemoryBound(f"expert {act} backward", act_b * routed * shapes.ffn * d + 2 * probs),
                       *extra.clamp_i,
                       Gemm("expert FC1 dgrad", n, h, shapes.fc1_out, local),
                       MemoryBound("token permute backward", 2 * here * moe.top_k * h * d),
                       MemoryBound("router softmax backward", 3 * logits),
                       Gemm("router dgrad", here, h, moe.experts)]
    if opts.moe_dispatcher == "alltoall" and local > 1:
        # permutation 2: the received tokens sorted by local expert, and back (megatron/core/transformer/moe/
        # token_dispatcher.py, MoEAlltoAllTokenDispatcher.dispatch_postprocess / combine_preprocess:
        # sort_chunks_by_idxs)
        sort = 2 * routed * h * d  # read and write every routed token
        f[3:3] = [MemoryBound("token sort by local expert", sort)]
        f[-1:-1] = [MemoryBound("token unsort by local expert", sort)]
        i[1:1] = [MemoryBound("token unsort backward", sort)]
        i[-3:-3] = [MemoryBound("token sort backward", sort)]
    w: list[Kernel] = [*extra.bias_w, Gemm("expert FC2 wgrad", shapes.ffn, h, n, local),
                       Gemm("expert FC1 wgrad", h, shapes.fc1_out, n, local),
                       Gemm("router wgrad", h, moe.experts, here)]
    width = moe.shared_experts * moe.shared_width // opts.tp
    if width:  # every token, as the dense MLP: on the all-gathered tokens under sp
        tokens = b * opts.local_seq(model)
        shared = with_tokens([("shared FC1", h, 2 * width if swiglu else width), ("shared FC2", width, h)], tokens)
        store, restore = _fp8_store_kernels("shared ", 2 * tokens * width, d, opts)  # as the experts'
        # Qwen2-MoE's sigmoid gate on their (reduced, sp: scattered) output (pipesim.model.shared_gate)
        gate_f, gate_i, gate_w = gate_kernels(here, h, d) if moe.shared_gate else ([], [], [])
        f += forward_gemms(shared[:1]) + [MemoryBound(f"shared {act}", act_f * tokens * width * d), *store] \
            + forward_gemms(shared[1:]) + gate_f
        i += gate_i + dgrad_gemms(shared[1:]) \
            + [*restore, MemoryBound(f"shared {act} backward", act_b * tokens * width * d)] + dgrad_gemms(shared[:1])
        w += wgrad_gemms(shared) + gate_w
    return f, i, w


__all__ = ["FlashAttention", "Gemm", "Kernel", "MemoryBound", "PieceKernels", "layer_kernels"]
