"""FLOPs of a transformer layer and LM head, split F / I / W, on one rank, with recomputation.

Convention as pipesim/cost/model_costs.py's gpt_block_flops and torch's FlopCounterMode: matmuls
only, 2 FLOPs per multiply-add. The weight matmuls' backward is the same again for the input
gradient (I) and for the weight gradient (W); the score matmuls (Q K^T, A V) have no weights, so
their whole backward is in I. Attention is counted over the full s x s square, causal or not, as
Narayanan et al. 2021 eq. 3 and the MFU figures of the Megatron papers count it. Recomputation
puts the re-run forward into I, the part of the backward that needs it first. Latent attention (`model.mla`)
counts its five linears on the tokens each multiplies (pipesim.model.latent_attention: the down projections whole on
the rank's own tokens) and its core with a query/key head of nope + rope and a value head of v.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipesim.device.kernels import band_pairs, causal_tile_factor, window_tile_factor
from pipesim.model.config import ModelConfig
from pipesim.model.kernel_types import FlashAttention, Kernel
from pipesim.model.latent_layer import check_latent, latent_linears, latent_widths
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.layer_kinds import StageLayers, kind_options
from pipesim.model.op_recompute import OP, op_rerun_flops
from pipesim.model.options import LayerOptions, vocab_shard


@dataclass(frozen=True)
class Flops:
    """FLOPs of one microbatch through a piece, on one rank: forward, input gradient, weight gradient."""

    F: int
    I: int  # noqa: E741 (the action's name in the IR)
    W: int

    @property
    def total(self) -> int:
        return self.F + self.I + self.W

    def __add__(self, other: Flops) -> Flops:
        return Flops(self.F + other.F, self.I + other.I, self.W + other.W)

    def __mul__(self, k: int) -> Flops:
        return Flops(self.F * k, self.I * k, self.W * k)


def dense_flops(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """Forward FLOPs of one layer's weight matmuls on one rank: QKV, projection and MLP.

    2 n h (h_q + 2 h_kv) + 2 n h_q h + 4 n h f (GeLU) or 6 n h f (SwiGLU), n = b s / cp tokens, all / t
    (h_q = heads x head_dim, h unless `head_width` says otherwise; h_kv = kv heads x head_dim).
    The GPT (h_q = h_kv = h, f = 4h): 24 b s h^2. Latent attention: 2 x tokens x in x out of each of its linears on this
    rank (the down projections whole, on n / t tokens under sp) in place of QKV and the projection.
    """
    opts.check(model)
    n = b * opts.local_seq(model)
    h, f = model.hidden, model.ffn_size
    mlp = (6 if model.gated else 4) * n * h * f
    if model.mla is not None:
        return sum(2 * x.tokens * x.inp * x.out for x in latent_linears(model, b, opts)) + mlp // opts.tp
    hq = model.attention_width
    return (2 * n * h * model.qkv_width + 2 * n * hq * h + mlp) // opts.tp


def attention_core_flops(model: ModelConfig, b: int, opts: LayerOptions, *, causal: bool = False) -> Flops:
    """Q K^T and A V of one layer on one rank: forward 4 b s_q s_k h_q / t (s_q = s / cp local queries, s_k = s keys;
    h_q = heads x head_dim, the hidden size unless `head_width` says otherwise).

    eager backward: the gradients wrt both operands of both matmuls, 8 b s_q s_k h_q / t, all in I.
    flash backward: the kernel first re-computes Q K^T (2 b s_q s_k h_q / t), then the four
    gradient matmuls: 10 b s_q s_k h_q / t. Grouped-query attention does the same FLOPs (each
    query head still meets s_k keys of head_dim). causal=True counts the half a causal kernel
    really computes (s_q s_k / 2 pairs), for timing; the defaults count the full square.

    Latent attention, with query/key width q = a (nope + rope) / t and value width v = a v_head / t on this rank:
    forward 2 b s_q s_k (q + v) (Q K^T, A V); eager backward twice that; flash backward 2 b s_q s_k (3 q + 2 v)
    (Q K^T again, dQ and dK of width q, dA and dV of width v). With q = v = h_q / t these are the lines above.

    A windowed layer (`opts.window` w, cp 1): its causal pairs are the band's, band_pairs(s, w) = w s - w (w - 1) / 2
    (pipesim.model.attention_window), which the full-square count takes twice, as it takes s^2 for s^2 / 2.
    """
    opts.check(model)
    pairs = b * opts.local_seq(model) * model.seq  # (query, key) pairs per head-dim, summed below over h_q
    if opts.window is not None:  # the band, twice (the full-square convention; causal halves it back)
        pairs = 2 * b * band_pairs(model.seq, opts.window)
    if model.mla is not None:
        check_latent(model, opts)
        qk, v = latent_widths(model, opts.tp)
        fwd = 2 * pairs * (qk + v)
        bwd = 2 * pairs * (3 * qk + 2 * v) if opts.fused_attention else 2 * fwd
    else:
        fwd = 4 * pairs * model.attention_width // opts.tp
        bwd = (10 if opts.fused_attention else 8) * pairs * model.attention_width // opts.tp
    if causal:
        fwd, bwd = fwd // 2, bwd // 2
    return Flops(fwd, bwd, 0)


def layer_flops(model: ModelConfig, b: int, opts: LayerOptions, *, causal: bool = False) -> Flops:
    """One transformer layer on one rank, with its recomputation in I (causal: the attention core's causal half).

    full: the backward first re-runs the whole forward (dense + attention core); op: torchtitan's per-op policy
    re-runs wk, wo and w3 (pipesim.model.op_recompute); selective:
    only the attention core's forward by default, and the GEMMs of its other modules a dense layer has
    (`_module_rerun_flops`; a MoE layer's are `pipesim.cost.stage_work.moe_layer_flops`'). The GPT without
    recomputation, t = cp = 1, eager:
    F = 24 b s h^2 + 4 b s^2 h, I = 24 b s h^2 + 8 b s^2 h, W = 24 b s h^2.
    """
    dense = dense_flops(model, b, opts)
    core = attention_core_flops(model, b, opts, causal=causal)
    flops = Flops(dense, dense, dense) + core
    if opts.recompute == "full":
        flops = flops + Flops(0, flops.F, 0)
    elif opts.recompute == "selective":
        rerun = (core.F if opts.recomputes("core_attn") else 0) + _module_rerun_flops(model, b, opts)
        flops = flops + Flops(0, rerun, 0)
    elif opts.recompute == OP:  # torchtitan's per-op policy: wk, wo and w3 again (pipesim.model.op_recompute)
        flops = flops + Flops(0, op_rerun_flops(model, b * opts.local_seq(model)), 0)
    return flops


def _module_rerun_flops(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """Forward GEMM FLOPs a dense layer's backward re-runs for --recompute-modules other than core_attn (pipesim.model
    .recompute_modules): mlp the dense MLP (4 or 6 n h f / t), mla_up_proj latent attention's up projections (Q up,
    or Q without a query latent, and KV up)."""
    out = 0
    if opts.recomputes("mlp"):
        out += (6 if model.gated else 4) * b * opts.local_seq(model) * model.hidden \
            * model.ffn_size // opts.tp
    if opts.recomputes("mla_up_proj"):
        out += sum(2 * x.tokens * x.inp * x.out for x in latent_linears(model, b, opts)
                   if x.name in ("Q", "Q up", "KV up"))
    return out


def head_flops(model: ModelConfig, b: int, opts: LayerOptions) -> Flops:
    """LM head (h x ceil(V / t)) on the rank's tokens: 2 b s h V / t each for F, I and W (never recomputed)."""
    opts.check(model)
    head = 2 * b * opts.local_seq(model) * model.hidden * vocab_shard(model, opts.tp)
    return Flops(head, head, head)


def mtp_projection_flops(model: ModelConfig, b: int, opts: LayerOptions) -> Flops:
    """A multi-token-prediction module's projection 2h -> h / t (Megatron-core's column-parallel eh_proj) on the
    rank's tokens (all-gathered under sp): 4 b s h^2 / t each for F, I and W, the forward again in I under full
    recomputation (Megatron-core checkpoints the module). Its block and its pass through the shared head are a
    layer's and the head's (`layer_flops`, `head_flops`)."""
    opts.check(model)
    proj = 2 * b * opts.local_seq(model) * 2 * model.hidden * model.hidden // opts.tp
    return Flops(proj, 2 * proj if opts.recompute == "full" else proj, proj)


def moe_mlp_delta(model: ModelConfig, tokens: int) -> int:
    """A mixture-of-experts layer's GEMM FLOPs per phase (F, I or W alike) over `tokens`, less the dense MLP's it
    replaces: the router (2 T h E), each token's top_k routed experts and the shared experts with their gate (2 T per
    weight), the mean tokens per expert (an iteration's total, whatever the load on the slowest rank)."""
    moe = model.moe
    if moe is None:
        return 0
    matrices = 3 if model.gated else 2
    per_token = (model.hidden * moe.experts + moe.top_k * matrices * model.hidden * moe.expert_ffn
                 + _shared_weights(model) - matrices * model.hidden * model.ffn_size)
    return 2 * tokens * per_token


def _shared_weights(model: ModelConfig) -> int:
    """The weights each token passes through in the shared experts: their matrices and, with Qwen2-MoE's gate, its h
    (pipesim.model.shared_gate)."""
    moe = model.moe
    assert moe is not None
    gate = model.hidden if moe.shared_gate else 0
    return moe.shared_experts * (3 if model.gated else 2) * model.hidden * moe.shared_width + gate


def iteration_flops(model: ModelConfig, global_batch: int, opts: LayerOptions, *, causal: bool = False) -> int:
    """All ranks' FLOPs of one iteration (tp = cp = 1 view): layers x layer + head, over the global batch, and each
    multi-token-prediction module's projection, layer and head; a mixture of experts' layers with their active
    experts' GEMMs instead of the dense MLP's (`moe_mlp_delta`, F, I and W; F again in I under full recomputation).

    With the GPT and eager attention this is Narayanan et al. 2021 eq. 3 under full recomputation,
    96 B s l h^2 (1 + s / (6h) + V / (16 l h)), and Korthikanti et al. 2022 eq. 7 without it,
    72 B s l h^2 (1 + s / (6h) + V / (12 l h)). causal=True counts the attention core's causal half.
    """
    one = LayerOptions(recompute=opts.recompute, attention=opts.attention, recompute_modules=opts.recompute_modules)
    layer = layer_flops(model, global_batch, one, causal=causal)
    head = head_flops(model, global_batch, one)
    if model.hybrid is not None or model.linear_attention is not None:
        return _kind_flops(model, global_batch, one, causal=causal) + head.total
    windowed = model.windowed_layers(0, model.layers)  # their attention core over the band (attention_core_flops)
    total = (layer * (model.layers - windowed) + head).total
    if windowed:
        total += (layer_flops(model, global_batch, replace(one, window=model.window_size), causal=causal)
                  * windowed).total
    if model.mtp_layers:
        total += (mtp_projection_flops(model, global_batch, one) + layer + head).total * model.mtp_layers
    if model.moe is not None:
        moe_layers = model.moe.moe_layers(0, model.layers + model.mtp_layers)
        phases = 4 if opts.recompute == "full" else 3
        total += moe_layers * phases * moe_mlp_delta(model, global_batch * model.seq)
        total += moe_layers * _moe_rerun_delta(model, global_batch * model.seq, one)
    return total


def _kind_flops(model: ModelConfig, tokens_batch: int, one: LayerOptions, *, causal: bool) -> int:
    """A model whose layers differ in kind (a hybrid model's, pipesim.model.hybrid; linear attention's,
    pipesim.model.linear_attention): each kind's kernels' FLOPs with its recomputation (an MLP's and the experts'
    (routed top_k and shared, balanced), a Mamba layer's and a Gated DeltaNet's linears and chunked GEMMs), and with
    `causal` the attention core's kernels over their causal half, as `attention_core_flops` counts them."""
    total = 0
    for kind, n in StageLayers.of(model, 0, model.layers):
        kernels = layer_kernels(model, tokens_batch, kind_options(model, one, kind), moe=kind.moe)
        core = sum(k.flops for phase in kernels.phases() for k in phase if _core(k)) // 2 if causal else 0
        total += n * (sum(map(kernels.flops, "FIW")) - core)
    return total


def _core(kernel: Kernel) -> bool:
    """The attention core's kernels: flash attention's, or eager attention's GEMMs (pipesim.model.layer_kernels)."""
    return isinstance(kernel, FlashAttention) or kernel.name.startswith(("Q K^T", "A V"))


def _moe_rerun_delta(model: ModelConfig, tokens: int, opts: LayerOptions) -> int:
    """A MoE layer's re-run GEMM FLOPs under --recompute-modules, less the dense layer's `layer_flops` counted for it:
    moe its router, routed and shared experts; shared_experts its shared experts (once more inside moe's re-run);
    less the dense MLP that mlp re-runs in dense layers only."""
    moe = model.moe
    assert moe is not None
    matrices = 3 if model.gated else 2
    h = model.hidden
    shared = _shared_weights(model)
    per_token = 0
    if opts.recomputes("moe"):
        per_token += h * moe.experts + moe.top_k * matrices * h * moe.expert_ffn + shared
    if opts.recomputes("shared_experts"):
        per_token += shared
    if opts.recomputes("mlp"):
        per_token -= matrices * h * model.ffn_size
    return 2 * tokens * per_token


def model_flops(model: ModelConfig, global_batch: int) -> int:
    """What MFU counts: one iteration's model FLOPs, no recomputation, the attention core 4 + 8 per (query, key)
    pair and head-dim over the causal half a decoder computes (FlashAttention's benchmarks count causal attention
    so, `flops(...) // (2 if causal else 1)`). The full s x s square, Megatron's count, exceeds any real rate
    once attention dominates (128k+ tokens): 72 B s l h^2 (1 + s / (12h) + V / (12 l h)) for the GPT."""
    return iteration_flops(model, global_batch, LayerOptions(attention="eager"), causal=True)


def hardware_flops(model: ModelConfig, global_batch: int, opts: LayerOptions) -> int:
    """What HFU counts (hardware FLOPs utilisation, Chowdhery et al. 2022, PaLM, appendix B): one iteration's FLOPs as
    the GPUs execute them: the recomputation `opts` asks for, the attention core's causal half and, with flash
    attention, each causal kernel's diagonal tiles computed whole (pipesim.device.kernels.causal_tile_factor, the
    factor the simulator times them with). `model_flops` is the model's count, the same for every way to run it."""
    total = iteration_flops(model, global_batch, opts, causal=True)
    if not opts.fused_attention:
        return total
    one = LayerOptions(recompute=opts.recompute, attention=opts.attention, recompute_modules=opts.recompute_modules)
    rerun = opts.recompute == "full" or opts.recomputes("core_attn")
    windowed = model.windowed_layers(0, model.layers)
    core = attention_core_flops(model, global_batch, one, causal=True)
    extra = (core.total + (core.F if rerun else 0)) * (causal_tile_factor(model.seq) - 1.0)  # the diagonal tiles
    attending = StageLayers.of(model, 0, model.layers).attention_layers - windowed + model.mtp_layers  # causal
    total += round(extra * attending)
    if windowed:  # the band's tiles, whole (pipesim.model.attention_window)
        w = model.window_size
        core = attention_core_flops(model, global_batch, replace(one, window=w), causal=True)
        total += round((core.total + (core.F if rerun else 0)) * (window_tile_factor(model.seq, w) - 1.0) * windowed)
    return total


def utilization(flops: float, seconds: float, gpus: int, peak: float) -> tuple[float, float]:
    """(MFU, model TFLOP/s per GPU) of one step's `flops` model FLOPs (`model_flops`) in `seconds` on `gpus` GPUs of
    dense `peak` FLOP/s each (pipesim.cost.fp8_costs.mfu_peak: the FP8 tensor cores' for an FP8 run): the one
    definition `pipesim plan` and `pipesim simulate` report. With the causal half of attention counted it stays below
    1 at any length."""
    per_gpu = flops / (seconds * gpus)  # FLOP/s
    return per_gpu / peak, per_gpu / 1e12


__all__ = ["Flops", "attention_core_flops", "dense_flops", "hardware_flops", "head_flops", "iteration_flops",
           "layer_flops", "model_flops", "moe_mlp_delta", "mtp_projection_flops", "utilization"]
