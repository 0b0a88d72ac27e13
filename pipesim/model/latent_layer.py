"""One multi-head latent attention block on one rank: its linears, parameters and saved tensors (DeepSeek-V3 under
Megatron-core's tensor parallelism: the sizes and the sources are pipesim/model/latent_attention.py's)."""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.latent_attention import LatentAttention
from pipesim.model.options import LayerOptions


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


__all__ = ["LatentLinear", "assembly_bytes", "check_latent", "latent_linears", "latent_params", "latent_saved",
           "latent_widths", "mla_of", "rope_elements"]
