"""What one microbatch does on one stage, before any hardware: FLOPs, bytes moved, framework ops, stash,
parameters and tensor-parallel collectives per F, I and W.

The MLP's layers and the transformer's embedding, blocks and head are pieces added into a `Work`;
`pipesim.cost.model_costs` turns it into seconds on a machine (roofline on CPUs, kernel by kernel on GPU
presets), and the calibration fit inverts the same counts (`stage_work`, `action_flops`). The
transformer's figures come from the model layer (pipesim/model/); the memory traffic that feeds the
calibrated CPU timing stays the estimate it was fitted with (docs/cost_model.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from pipesim.cost.executor_ops import (
    EMBED_ROPE_OPS,
    EMBED_SCALE_OPS,
    GPT_BLOCK_OPS,
    HEAD_RMSNORM_OPS,
    MLP_LAYER_OPS,
    NO_OPS,
    add_ops,
    executor_block_ops,
    executor_moe_block_ops,
)
from pipesim.model.activations import (
    embedding_activation_bytes,
    head_activation_bytes,
    layer_activation_bytes,
    mtp_activation_bytes,
    mtp_moe_layers,
    stage_recompute_bytes,
)
from pipesim.model.config import ModelConfig, split_layers
from pipesim.model.elementwise import layer_elementwise_bytes
from pipesim.model.flops import Flops, head_flops, layer_flops, mtp_projection_flops
from pipesim.model.layer_collectives import (
    Collective,
    ep_layer_exchanges,
    tp_embedding_collectives,
    tp_head_collectives,
    tp_layer_collectives,
    tp_mtp_collectives,
)
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.layer_kinds import StageLayers, kind_options, stage_layers
from pipesim.model.layer_parts import BLOCK
from pipesim.model.moe_layer import dense_mlp_params, expert_params_here, moe_block_params
from pipesim.model.op_recompute import OP
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import (
    block_params,
    embedding_params,
    head_params,
    is_moe_layer,
    mtp_embedding_params,
    mtp_projection_params,
)
from pipesim.model.piece_kernels import check_mtp
from pipesim.model.weight_tensors import layer_params

CORE_OPS = 3  # ops of the attention core (scores, softmax, A V) that selective recomputation re-runs
# the vocab-parallel cross-entropy's all-reduces of a float32 per token (Megatron's unfused three; its fused two and
# Transformer Engine's one all-gather): latency-bound, once per microbatch on the last stage, 10-45 us against its
# head's milliseconds; counted (layer_collectives.tp_head_collectives), not timed
UNTIMED = "cross-entropy"




@dataclass
class Work:
    """FLOPs, bytes moved and collectives of one microbatch through (part of) a stage, on one device."""

    flops: dict[str, float] = field(default_factory=lambda: {"F": 0.0, "I": 0.0, "W": 0.0})  # FLOPs
    moved: dict[str, float] = field(default_factory=lambda: {"F": 0.0, "I": 0.0, "W": 0.0})  # bytes (HBM)
    ops: dict[str, float] = field(default_factory=lambda: {"F": 0.0, "I": 0.0, "W": 0.0})  # framework ops
    activation_bytes: float = 0.0  # bytes stashed until backward
    recompute_bytes: float = 0.0  # bytes a recomputed layer re-creates, live during its backward only
    param_count: float = 0.0  # parameters held on this device
    # the collectives the simulator times, per phase ("F", "I": the backward), in order, each with the tensor it
    # moves and the computation Megatron overlaps it with (pipesim.model.layer_collectives)
    collectives: dict[str, list[Collective]] = field(default_factory=lambda: {"F": [], "I": []})
    # the expert-parallel all-to-alls per phase ("F", "I": the backward), in order (pipesim.model.layer_collectives)
    ep_exchanges: dict[str, list[Collective]] = field(default_factory=lambda: {"F": [], "I": []})
    expert_params: float = 0.0  # of param_count: the routed experts' (sharded over ep, reduced over edp)
    # full recomputation's re-run forward (FLOPs, bytes, framework ops), which I holds: what the executor's split W
    # re-runs once more (torch's non-reentrant checkpoint re-runs a layer once per autograd call that needs it)
    split_rerun: dict[str, float] = field(default_factory=lambda: {"flops": 0.0, "moved": 0.0, "ops": 0.0})

    def add(self, f: float, i: float, w: float, *, moved: tuple[float, float, float] = (0.0, 0.0, 0.0),
            act: float = 0.0, params: float = 0.0, ops: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> None:
        for key, value in zip("FIW", (f, i, w), strict=True):
            self.flops[key] += value
        for key, value in zip("FIW", moved, strict=True):
            self.moved[key] += value
        for key, value in zip("FIW", ops, strict=True):
            self.ops[key] += value
        self.activation_bytes += act
        self.param_count += params

    def absorb(self, other: Work) -> None:
        """Adds `other`, another part of the same stage (its bf16 layers under --first-last-layers-bf16): its figures
        summed, its collectives after these, the recompute working set the larger (one layer re-run at a time)."""
        for mine, theirs in ((self.flops, other.flops), (self.moved, other.moved), (self.ops, other.ops)):
            for key in mine:
                mine[key] += theirs[key]
        self.activation_bytes += other.activation_bytes
        self.recompute_bytes = max(self.recompute_bytes, other.recompute_bytes)
        self.param_count += other.param_count
        self.expert_params += other.expert_params
        for key in self.split_rerun:
            self.split_rerun[key] += other.split_rerun[key]
        for phase in self.collectives:
            self.collectives[phase] += other.collectives[phase]
            self.ep_exchanges[phase] += other.ep_exchanges[phase]


def mlp_stage_work(model: ModelConfig, b: int, layers: int, tp: int = 1, *, first: bool = False) -> Work:
    """`layers` x (Linear(h, h) + GeLU) on a microbatch of b rows.

    Per layer F = 2*b*h*h FLOPs; I = F (grad wrt input); W = F (grad wrt weight); bias and GeLU
    FLOPs are not counted (as torch's FlopCounterMode). tp splits each weight; one all_reduce of
    b*h per column/row pair of layers in F and in I. Framework ops per layer: F 2 (linear, GeLU),
    I 2 (their input gradients), W 1 (the weight gradient). On the first stage the data needs no
    gradient, so its first Linear has none wrt its input: only the GeLU's gradient is left in I.
    """
    h, d = model.hidden, model.dtype_bytes
    work = Work()
    mm = 2 * b * h * h / tp  # FLOPs
    weights = (h * h / tp + h) * d  # bytes
    f_ops, i_ops, w_ops = MLP_LAYER_OPS
    for n in range(layers):
        no_dx = first and n == 0  # the data needs no gradient: I is only the GeLU's gradient
        i_moved = 2 * b * h * d / tp if no_dx else weights + 4 * b * h * d / tp  # bytes
        work.add(mm, 0.0 if no_dx else mm, mm, moved=(weights + 4 * b * h * d / tp, i_moved,
                                                      weights + 2 * b * h * d / tp),
                 act=2 * b * h * d / tp, params=h * h / tp + h, ops=(f_ops, i_ops - 1 if no_dx else i_ops, w_ops))
    if tp > 1:
        pairs = math.ceil(layers / 2)
        work.collectives["F"] += [Collective("all_reduce", b * h * d, "F", "tp", "block output")] * pairs
        work.collectives["I"] += [Collective("all_reduce", b * h * d, "I", "tp", "block input gradient")] * pairs
    return work


def gpt_block_flops(model: ModelConfig, b: int) -> tuple[float, float, float]:
    """(F, I, W) FLOPs of one transformer block on b sequences, before tp.

    Weight matmuls (QKV, projection, 4h MLP): 24*b*s*h^2 forward, the same again for I and for W.
    Score matmuls (Q K^T and A V): 4*b*s^2*h forward; they have no weights, so their backward
    (grads wrt both operands, 8*b*s^2*h) goes entirely into I.
    """
    s, h = model.seq, model.hidden
    dense = 24 * b * s * h * h
    scores = 4 * b * s * s * h
    return dense + scores, dense + 2 * scores, dense


def gpt_block_activation_bytes(model: ModelConfig, b: int, tp: int = 1) -> float:
    """Korthikanti et al. (2022): s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes at 16 bits, scaled to the dtype.

    Only the memory-traffic estimate uses it now (the figure the CPU timing was calibrated with);
    the stash is `pipesim.model.activations.layer_activation_bytes` (1-byte masks, GQA, flash, ...).
    """
    s, h, a = model.seq, model.hidden, model.heads
    return s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)) * model.dtype_bytes / 2


def _add_forward(work: Work, collectives: list[Collective]) -> None:
    """The forward collectives the simulator times (all but the cross-entropy's scalars: UNTIMED)."""
    work.collectives["F"] += [c for c in collectives if not c.what.startswith(UNTIMED)]


def _add_backward(work: Work, collectives: list[Collective]) -> None:
    """The backward collectives the simulator times, with the computation each overlaps in Megatron."""
    work.collectives["I"] += [c for c in collectives if not c.what.startswith(UNTIMED)]


def _gpt_shaped(model: ModelConfig) -> ModelConfig:
    """`model`'s sizes in the GPT block's structure (MHA, 4h GeLU, LayerNorm, biases): what the CPU fit's block
    weights count, so that another structure's are counted as a difference from them. Its weights (12 h^2 + 13 h) do
    not depend on the heads: one head stands in where the model's heads have their own width and do not divide h
    (GLM-4.5-Air: 96 heads of 128 over a 4096 hidden)."""
    heads = model.heads if model.hidden % model.heads == 0 else 1
    return replace(model, kv_heads=None, ffn_hidden=None, activation="gelu", norm="layernorm", biases=True,
                   head_width=None, qk_norm=False, moe=None, mla=None, heads=heads, qk_l2_norm=False, nope_every=0,
                   post_norms=False, embedding_scale=False, hybrid=None, linear_attention=None,
                   attention_gate=False)


def gpt_stage_work(model: ModelConfig, b: int, mix: StageLayers, *, first: bool, last: bool, tp: int = 1,
                   opts: LayerOptions | None = None, executor_ops: bool = False) -> Work:
    """Embedding (first stage), the stage's blocks `mix` (by kind: with experts or dense, the model's variant layers,
    windowed or NoPE, or not: pipesim.model.layer_kinds), final norm + LM head + loss (last stage).

    FLOPs (with recomputation in I), stash, parameters and tp collectives from pipesim/model/ under
    `opts` (default: tp only), each kind under its own options. Memory traffic: the estimate the CPU timing was fitted
    with (weights plus the Korthikanti stash per block), plus the re-run forward under recomputation. Framework
    ops: embedding F 3 (two lookups, add), W 2; block F 10, I 10, W 6, plus the re-run forward's in
    I (full: the block's own forward, 10 for the GPT block, an MoE block's its own; selective 3); head F 3, I 3,
    W 2. A MoE block's FLOPs are the dense block's with the MLP's GEMMs replaced by the router's, the experts' and the
    shared experts' (pipesim.model.layer_kernels).
    The last stage runs the model's multi-token-prediction modules after the head (`_add_mtp_module`).
    `executor_ops`: a block counts the executor's ops (`executor_block_ops`, `executor_moe_block_ops`; a calibrated
    CPU host), whose attention masks the square: a variant layer is costed under the job's options there.
    """
    opts = opts if opts is not None else LayerOptions(tp=tp)
    tp = opts.tp
    s, h, v, d = model.seq, model.hidden, model.vocab, model.dtype_bytes
    act = b * s * h * d  # bytes of one (b, s, h) activation
    work = Work()
    if first:  # token + position lookup: no matmul FLOPs; vocab-parallel embedding all_reduces its output
        ops = add_ops((3, 0, 2), EMBED_ROPE_OPS if executor_ops and model.positions == "rope" else NO_OPS,
                      EMBED_SCALE_OPS if executor_ops and model.embedding_scale else NO_OPS)  # Gemma's sqrt(h)
        work.add(0.0, 0.0, 0.0, moved=(2 * act, 0.0, 2 * act), act=embedding_activation_bytes(model, b, opts),
                 params=embedding_params(model, tp), ops=ops)
        _add_forward(work, tp_embedding_collectives(model, b, opts))
    if mix.layers:
        # the GPT block's weights the CPU fit was made with, and what another structure holds beyond them
        weights = 12 * h * h / tp + 13 * h + block_params(model, tp) - block_params(_gpt_shaped(model), tp)
        traffic = weights * d + gpt_block_activation_bytes(model, b, tp)  # bytes
        rerun, rerun_ops = 0.0, 0
        if opts.recompute == "full":
            rerun = traffic  # its ops: the layer's forward's (below)
        elif opts.recompute in ("selective", OP):  # op: its elementwise ops (its GEMMs: layer_flops)
            ew = layer_elementwise_bytes(model, b, opts).backward
            rerun = sum(n for k, n in ew.items() if k.startswith("recompute "))
            core = ("recompute softmax", "recompute softmax dropout")  # the eager core's; counted in CORE_OPS
            others = sum(k.startswith("recompute ") and k not in core for k in ew)  # other modules' ops
            rerun_ops = (CORE_OPS if opts.recomputes("core_attn") else 0) + others
        for kind, count in mix:
            _add_blocks(work, model, b, opts if executor_ops else kind_options(model, opts, kind), kind.moe, count,
                        moved=(traffic, traffic + rerun if rerun else traffic, traffic), rerun=rerun,
                        ops=_block_ops(model, opts, kind.moe, kind.variant, executor_ops, rerun_ops))
    if mix.layers or (last and model.mtp_layers):  # one layer re-run at a time: the larger kind's (an MTP block too)
        mtp = StageLayers.uniform(model.mtp_layers, mtp_moe_layers(model)) if last else StageLayers()
        work.recompute_bytes = stage_recompute_bytes(model, b, opts, mix.plus(mtp))
    if last:  # final norm + LM head (h x vocab) + cross-entropy on vocab-parallel logits
        head = head_flops(model, b, opts)
        logits = b * s * v / tp * d
        traffic = h * v / tp * d + act + logits  # bytes
        ops = add_ops((3, 3, 2), HEAD_RMSNORM_OPS if executor_ops and model.norm == "rmsnorm" else NO_OPS)
        work.add(head.F, head.I, head.W, moved=(traffic, traffic, traffic), act=head_activation_bytes(model, b, opts),
                 params=head_params(model, tp, holds_embedding=first), ops=ops)
        colls = tp_head_collectives(model, b, opts)
        _add_forward(work, [c for c in colls if c.phase == "F"])
        _add_backward(work, [c for c in colls if c.phase != "F"])
        for k in range(model.mtp_layers):
            _add_mtp_module(work, model, b, opts, moe=is_moe_layer(model, model.layers + k),
                            embedding_copy=k == 0 and not first)
    return work


def _block_ops(model: ModelConfig, opts: LayerOptions, moe: bool, variant: bool, executor_ops: bool,
               rerun_ops: int) -> tuple[int, int, int]:
    """One block's (F, I, W) framework ops, I with the re-run forward's (full: the block's forward)."""
    if executor_ops:
        ops = executor_moe_block_ops(model, opts, variant) if moe else executor_block_ops(model, variant)
    else:
        ops = GPT_BLOCK_OPS
    return ops[0], ops[1] + (ops[0] if opts.recompute == "full" else rerun_ops), ops[2]


def _add_blocks(work: Work, model: ModelConfig, b: int, opts: LayerOptions, moe: bool, count: int, *,
                moved: tuple[float, float, float], rerun: float, ops: tuple[int, int, int]) -> None:
    """`count` blocks of one kind under `opts` (`moe`: with the model's experts): FLOPs, traffic, stash, parameters,
    tp collectives and the experts' exchanges each."""
    flops = _layer_flops(model, b, opts, moe)
    stash = layer_activation_bytes(model, b, opts, moe=moe)
    params = layer_params(model, opts, moe=moe)
    if moe:
        work.expert_params += count * expert_params_here(model, opts)
    tp_colls = tp_layer_collectives(model, b, opts, moe=moe)
    fwd_colls = [c for c in tp_colls if c.phase == "F"]
    bwd_colls = [c for c in tp_colls if c.phase != "F"]
    exchanges = ep_layer_exchanges(model, b, opts) if moe else []
    for _ in range(count):
        work.add(flops.F, flops.I, flops.W, moved=moved, act=stash, params=params, ops=ops)
        if opts.recompute == "full":
            for key, value in (("flops", flops.F), ("moved", rerun), ("ops", ops[0])):
                work.split_rerun[key] += value
        _add_forward(work, fwd_colls)
        _add_backward(work, bwd_colls)
        work.ep_exchanges["F"] += [c for c in exchanges if c.phase == "F"]
        work.ep_exchanges["I"] += [c for c in exchanges if c.phase != "F"]


def _add_mtp_module(work: Work, model: ModelConfig, b: int, opts: LayerOptions, *, moe: bool,
                    embedding_copy: bool) -> None:
    """One multi-token-prediction module on the last stage (DeepSeek-V3 report section 2.2; Megatron-core's
    MultiTokenPredictionLayer): the shifted tokens' embedding, two norms, the projection 2h -> h, a block (`moe`:
    with experts), and the shared head and cross-entropy run again. `embedding_copy`: the stage keeps its own copy of
    the embedding (it does not hold the first stage's), counted once. Memory traffic: the block's and the head's
    estimate, as for those pieces."""
    check_mtp(model, opts)
    s, h, v, d, tp = model.seq, model.hidden, model.vocab, model.dtype_bytes, opts.tp
    flops = mtp_projection_flops(model, b, opts) + head_flops(model, b, opts)
    flops = flops + (moe_layer_flops(model, b, opts) if moe else layer_flops(model, b, opts))
    params = mtp_projection_params(model, tp) + block_params(model, tp)
    if embedding_copy:
        params += mtp_embedding_params(model, tp, holds_embedding=False)
    if moe:
        params += moe_block_params(model, opts) - dense_mlp_params(model, tp)
        work.expert_params += expert_params_here(model, opts)
    block = (12 * h * h / tp + 13 * h) * d + gpt_block_activation_bytes(model, b, tp)  # bytes, as a block's
    head = h * v / tp * d + b * s * h * d + b * s * v / tp * d  # bytes, as the head's
    traffic = block + head + 2 * h * h / tp * d
    ops = tuple(x + y + z for x, y, z in zip(GPT_BLOCK_OPS, (3, 3, 2), (5, 3, 3), strict=True))
    work.add(flops.F, flops.I, flops.W, moved=(traffic, traffic, traffic),
             act=mtp_activation_bytes(model, b, opts, moe=moe), params=params, ops=ops)
    colls = tp_mtp_collectives(model, b, opts) + tp_layer_collectives(model, b, opts, moe=moe) + \
        tp_head_collectives(model, b, opts)
    _add_forward(work, [c for c in colls if c.phase == "F"])
    _add_backward(work, [c for c in colls if c.phase != "F"])
    if moe:
        exchanges = ep_layer_exchanges(model, b, opts)
        work.ep_exchanges["F"] += [c for c in exchanges if c.phase == "F"]
        work.ep_exchanges["I"] += [c for c in exchanges if c.phase != "F"]


def _layer_flops(model: ModelConfig, b: int, opts: LayerOptions, moe: bool) -> Flops:
    """A layer's FLOPs per F, I, W: the block's (`layer_flops`, `moe_layer_flops`), or a part's, its kernels'
    (pipesim.model.layer_parts; the block's kernels carry layer_flops exactly)."""
    if opts.part != BLOCK or opts.mixer != "attention":
        kernels = layer_kernels(model, b, opts, moe=moe)
        return Flops(kernels.flops("F"), kernels.flops("I"), kernels.flops("W"))
    return moe_layer_flops(model, b, opts) if moe else layer_flops(model, b, opts)


def moe_layer_flops(model: ModelConfig, b: int, opts: LayerOptions) -> Flops:
    """A MoE block's FLOPs per F, I, W: the dense block's (`layer_flops`) with its MLP's GEMMs (their kernels)
    replaced by the mixture of experts' (the slowest rank's tokens)."""
    dense, moe = layer_kernels(model, b, opts), layer_kernels(model, b, opts, moe=True)
    base = layer_flops(model, b, opts)
    f, i, w = (total + moe.flops(p) - dense.flops(p) for total, p in zip((base.F, base.I, base.W), "FIW", strict=True))
    return Flops(f, i, w)


FIW = tuple[float, float, float]  # one figure per kind of compute: F, I, W


def stage_work(model: ModelConfig, num_stages: int, m: int) -> list[tuple[FIW, FIW, FIW]]:
    """((F, I, W) FLOPs, (F, I, W) bytes moved, (F, I, W) framework ops) of one microbatch on each
    stage, as `model_costs` counts them on a calibrated CPU host (no tensor parallelism; the executor's ops for the
    model's structure and experts); the calibration fit inverts them."""
    b = model.batch // m
    out = []
    split = split_layers(model.layers, num_stages)
    for s, mix in enumerate(stage_layers(model, split)):
        if model.kind == "mlp":
            work = mlp_stage_work(model, b, mix.layers, first=s == 0)
        else:
            work = gpt_stage_work(model, b, mix, first=s == 0, last=s == num_stages - 1, executor_ops=True)
        out.append(tuple(tuple(part[k] for k in "FIW") for part in (work.flops, work.moved, work.ops)))
    return out


def stage_flops(model: ModelConfig, num_stages: int, m: int) -> list[FIW]:
    """(F, I, W) FLOPs of one microbatch on each stage, as the simulator's cost model counts them."""
    return [work[0] for work in stage_work(model, num_stages, m)]


def action_flops(kind: str, stage: int, flops: FIW) -> tuple[FIW, int]:
    """(FLOPs attributed to the F, I, W rates, overheads charged) of one executed compute action.

    The first stage has no input gradient: its I is empty and its W runs the whole backward (a plain
    one, charged like a B), the rule `model_costs` applies to its durations.
    """
    f, i, w = flops
    if kind == "F":
        return (f, 0.0, 0.0), 1
    if kind == "B":
        return (0.0, i, w), 2
    if kind == "I":
        return ((0.0, 0.0, 0.0), 1) if stage == 0 else ((0.0, i, 0.0), 1)
    return ((0.0, i, w), 2) if stage == 0 else ((0.0, 0.0, w), 1)


__all__ = ["CORE_OPS", "FIW", "UNTIMED", "Work", "action_flops", "gpt_block_activation_bytes", "gpt_block_flops",
           "gpt_stage_work", "mlp_stage_work", "stage_flops", "stage_work"]
