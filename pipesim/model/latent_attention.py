"""Multi-head latent attention (DeepSeek-V2/V3): its sizes, and its linears, parameters and saved tensors on one rank.

DeepSeek-V3 technical report (arXiv:2412.19437) section 2.1.1, and transformers' / DeepSeek's modeling_deepseek.py:
the queries come from a latent of width `q_lora_rank` (q_a_proj h -> d_q, an RMSNorm, q_b_proj d_q -> heads x
(nope + rope)), or, without one (DeepSeek-V2-Lite), straight from a Q projection h -> heads x (nope + rope); keys and
values come from one shared latent (kv_a_proj_with_mqa h -> d_c + rope, whose last `qk_rope_dim` columns are the
rotary key every head shares, an RMSNorm on the d_c columns, kv_b_proj d_c -> heads x (nope + v)); the attention
core runs with a query/key head dim nope + rope (DeepSeek-V3: 192) and a value head dim `v_head_dim` (128); the
output projection maps heads x v -> h. There is no grouped-query sharing: every head has its own K and V.

Tensor parallelism as Megatron-core's MLASelfAttention (megatron/core/transformer/multi_latent_attention.py, with
gpt_layer_specs' TE spec): the down projections (linear_q_down_proj, linear_kv_down_proj) are `backend.linear()`, a
TELinear in parallel_mode "duplicated": whole on every tp rank, run on the rank's own tokens (b s / tp under sequence
parallelism; their weight gradients are then summed over tp at the step, the `sequence_parallel` attribute); the up
projections (linear_q_up_proj, linear_kv_up_proj, or linear_q_proj without a query latent) are column-parallel (split
by heads, on the all-gathered tokens), and linear_proj is row-parallel. Under sequence parallelism the two latents and
the rotary key are all-gathered before the up projections (pipesim.model.layer_collectives); without it Megatron-core
leaves the rotary key's gradient unreduced over tp (NVIDIA/Megatron-LM issue 1699, its fix PR 6839 still open), so
pipesim refuses latent attention with tp > 1 and no sequence parallelism rather than cost a backward that is wrong.

Here the sizes and the per-rank linears, parameters and saved tensors; the kernels, FLOPs, elementwise bytes and
collectives that follow from them live with the dense layer's (layer_kernels, flops, elementwise, layer_collectives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipesim.errors import PipesimError

if TYPE_CHECKING:  # annotations only: config.py imports this module
    from pipesim.model.config import ModelConfig
    from pipesim.model.options import LayerOptions


@dataclass(frozen=True)
class LatentAttention:
    """The widths of multi-head latent attention (config.json's q_lora_rank, kv_lora_rank, qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim); the heads are the model's."""

    q_lora_rank: int | None  # the queries' latent width d_q; None: a plain Q projection h -> heads x (nope + rope)
    kv_lora_rank: int  # the keys' and values' shared latent width d_c
    qk_nope_dim: int  # per head: the query / key part without positions
    qk_rope_dim: int  # per head: the decoupled rotary part (the key's one vector shared by every head)
    v_head_dim: int  # per head: the value (and the attention output) width

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim"):
            _positive(name, getattr(self, name))
        if self.q_lora_rank is not None:
            _positive("q_lora_rank", self.q_lora_rank)

    @property
    def qk_head_dim(self) -> int:
        """Query and key width per head: nope + rope (DeepSeek-V3: 192)."""
        return self.qk_nope_dim + self.qk_rope_dim


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PipesimError(f"latent attention {name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class LatentLinear:
    """One weight matrix of latent attention on one tp rank, in forward order."""

    name: str  # "Q down", "Q up" (or "Q"), "KV down", "KV up", "projection"
    inp: int  # input features on this rank
    out: int  # output features on this rank
    tokens: int  # rows it multiplies per microbatch on this rank
    split: bool  # split over tp (column- or row-parallel); False: whole on every tp rank (a duplicated TELinear)


def mla_of(model: ModelConfig) -> LatentAttention:
    """The model's latent attention; PipesimError if it has standard attention."""
    if model.mla is None:
        raise PipesimError("latent-attention costs need a model with multi-head latent attention (mla)")
    return model.mla


def check_latent(model: ModelConfig, opts: LayerOptions) -> LatentAttention:
    """The model's latent attention, after the checks tp adds: heads split over tp, and sequence parallelism with tp
    (Megatron-core's MLA leaves the rotary key's gradient partial on each tp rank without it: issue 1699)."""
    mla = mla_of(model)
    opts.check(model)
    if opts.tp > 1 and not opts.sp:
        raise PipesimError(f"multi-head latent attention with tp({opts.tp}) needs --sequence-parallel "
                           "(Megatron-core's MLA leaves the rotary key's gradient unreduced without it)")
    return mla


def latent_linears(model: ModelConfig, b: int, opts: LayerOptions) -> tuple[LatentLinear, ...]:
    """The attention block's weight matrices on one rank in forward order, with the tokens each multiplies.

    n = b s / cp tokens (all-gathered under sp), n_loc = n / tp under sp (else n). Down projections whole on n_loc
    tokens: Q down h -> d_q, KV down h -> d_c + rope; up projections split by heads on n: Q up d_q -> a (nope + rope)
    / t (or Q h -> a (nope + rope) / t), KV up d_c -> a (nope + v) / t; projection a v / t -> h on n.
    """
    mla = check_latent(model, opts)
    t, h, a = opts.tp, model.hidden, model.heads
    n = b * opts.local_seq(model)
    n_loc = opts.seq_sharded(n)
    out: list[LatentLinear] = []
    if mla.q_lora_rank is None:
        out.append(LatentLinear("Q", h, a * mla.qk_head_dim // t, n, True))
    else:
        out.append(LatentLinear("Q down", h, mla.q_lora_rank, n_loc, False))
    out.append(LatentLinear("KV down", h, mla.kv_lora_rank + mla.qk_rope_dim, n_loc, False))
    if mla.q_lora_rank is not None:
        out.append(LatentLinear("Q up", mla.q_lora_rank, a * mla.qk_head_dim // t, n, True))
    out.append(LatentLinear("KV up", mla.kv_lora_rank, a * (mla.qk_nope_dim + mla.v_head_dim) // t, n, True))
    out.append(LatentLinear("projection", a * mla.v_head_dim // t, h, n, True))
    return tuple(out)


def latent_params(model: ModelConfig, tp: int = 1) -> int:
    """Parameters of the attention block (less the layer's input norm) on one tp rank: the down projections and the
    latents' norms whole (h d_q + h (d_c + rope), plus d_q and d_c for RMSNorm, twice that for LayerNorm), the up
    projections and the output projection split over tp (d_q a (nope + rope) / t or h a (nope + rope) / t,
    d_c a (nope + v) / t, a v h / t). No biases (ModelConfig refuses them with latent attention). DeepSeek-V3 at
    t = 1: 187,107,328 per layer."""
    mla = mla_of(model)
    h, a = model.hidden, model.heads
    per_norm = 2 if model.norm == "layernorm" else 1  # values per normalised element: weight (and bias)
    q_width = a * mla.qk_head_dim
    if mla.q_lora_rank is None:
        q = h * q_width // tp
    else:
        q = h * mla.q_lora_rank + per_norm * mla.q_lora_rank + mla.q_lora_rank * q_width // tp
    kv = h * (mla.kv_lora_rank + mla.qk_rope_dim) + per_norm * mla.kv_lora_rank \
        + mla.kv_lora_rank * a * (mla.qk_nope_dim + mla.v_head_dim) // tp
    return q + kv + a * mla.v_head_dim * h // tp


def latent_widths(model: ModelConfig, tp: int) -> tuple[int, int]:
    """(query/key, value) widths of the attention core on one tp rank: a (nope + rope) / t and a v / t."""
    mla = mla_of(model)
    return model.heads * mla.qk_head_dim // tp, model.heads * mla.v_head_dim // tp


def rope_elements(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """Elements the rotary embedding rotates on one rank: the queries' rope part (n a rope / t) and the one shared
    rotary key per token (n rope, all-gathered under sp)."""
    mla = check_latent(model, opts)
    n = b * opts.local_seq(model)
    return n * model.heads * mla.qk_rope_dim // opts.tp + n * mla.qk_rope_dim


def assembly_bytes(model: ModelConfig, b: int, opts: LayerOptions) -> int:
    """Bytes the unfused Q, K, V assembly moves on one rank (Megatron-core's torch.cat of the nope and rope parts of Q
    and of K, the rotary key expanded over the heads, and V made contiguous out of kv_b's output): each of Q, K
    (n a (nope + rope) / t) and V (n a v / t) read once and written once."""
    check_latent(model, opts)
    n = b * opts.local_seq(model)
    qk, v = latent_widths(model, opts.tp)
    return 2 * n * (2 * qk + v) * model.dtype_bytes


def latent_saved(model: ModelConfig, b: int, opts: LayerOptions) -> list[tuple[str, int]]:
    """(name, bytes) of what the attention block saves for backward, between the layer's norm input and the attention
    core (the core's scores or logsumexp and the projection input are the layer's, pipesim.model.activations).

    The down projections' input (the normed hidden, one tensor for both; sharded under sp, as the QKV input), each
    latent saved twice (by its RMSNorm, as its input, and by its column-parallel up projection, as its input: sharded
    under sp and re-gathered in backward), and the core's Q, K (n a (nope + rope) / t each) and V (n a v / t). The
    rotary key is rotated and copied into K, whose saved copy is what the backward reads (RoPE's backward needs no
    input). Without a query latent the Q projection reads the same normed hidden as KV down.
    """
    mla = check_latent(model, opts)
    d = model.dtype_bytes
    n = b * opts.local_seq(model)
    split = opts.seq_sharded
    qk, v = latent_widths(model, opts.tp)
    saved = [("Q/KV down input", split(d * n * model.hidden))]
    if mla.q_lora_rank is not None:
        saved += [("Q latent (norm input)", split(d * n * mla.q_lora_rank)),
                  ("Q latent normed (Q up input)", split(d * n * mla.q_lora_rank))]
    saved += [("KV latent (norm input)", split(d * n * mla.kv_lora_rank)),
              ("KV latent normed (KV up input)", split(d * n * mla.kv_lora_rank)),
              ("Q", d * n * qk), ("K", d * n * qk), ("V", d * n * v)]
    return saved


__all__ = ["LatentAttention", "LatentLinear", "assembly_bytes", "check_latent", "latent_linears", "latent_params",
           "latent_saved", "latent_widths", "mla_of", "rope_elements"]
