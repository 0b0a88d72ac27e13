"""The executor's transformer block, built from the same ModelConfig the cost model reads: the GPT of Megatron's
papers by default, and the Llama / Qwen3 / Llama 4 structures a config gives (grouped-query attention, heads of their
own width, QK-norm or Llama 4's weightless L2 one, SwiGLU or squared ReLU of their own width, RMSNorm, rotary
positions, none on Llama 4's NoPE layers, no biases), and GPT-OSS's attention:
sliding windows on the layers `ModelConfig.window` names (a query sees its `size` latest keys, itself included:
transformers' sliding_window) and a learned sink logit per head in every softmax's denominator (transformers v4.55.0
GptOssAttention: the sinks concatenated to the scores, softmaxed, dropped), and Gemma 3's layer
(pipesim.model.gemma_layer): a norm on the attention's and on the MLP's output before each residual add (`post_norms`;
under tensor parallelism on the row-parallel linear's reduced output, a sequence-parallel rank's shard of it), GeGLU
(executor.mlp), and the windowed layers rotating with their own plain RoPE (`Rotary.window_theta`).

The attention's input projection is one `qkv` matrix of rows [Q; K; V] (heads x head_dim, then kv heads x head_dim
twice), as the MLP's SwiGLU fc1 is [gate; up] (executor.mlp), so that a column-parallel shard
(executor.models.group_rows_by_rank) holds each block's rows of its own heads. The forward reads its local widths off
those outputs: one code path serves the whole block (the single-process reference) and a tensor-parallel rank's share.
The parameter counts are pipesim.model.param_counts' (tests/test_executor_structure.py ties them).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from executor.experts import MoeMLP, Steps, drive
from executor.mlp import Mlp, activate
from pipesim.model.config import ModelConfig
from pipesim.model.llama4_attention import is_nope_layer
from pipesim.model.rotary import Rotary

Rope = tuple[tuple[float, ...], float]  # (the rotated pairs' inverse frequencies, YaRN's attention factor on cos, sin)


def make_norm(kind: str, width: int, eps: float = ModelConfig.norm_eps) -> nn.Module:
    """LayerNorm (weight and bias) or RMSNorm (weight only) over the last `width` features, `eps` in the denominator
    (the model's norm_eps: its config.json's, else Megatron-LM's --norm-epsilon default)."""
    return nn.LayerNorm(width, eps=eps) if kind == "layernorm" else nn.RMSNorm(width, eps=eps)


def qk_norms(cfg: ModelConfig) -> tuple[nn.Module | None, nn.Module | None]:
    """The query and key heads' norms over head_dim: the model's norm (qk_norm, Qwen3's), a weightless RMSNorm
    (qk_l2_norm: Llama 4's L2 norm, x / rms(x), Megatron-core's torch_norm.L2Norm), or none."""
    if cfg.qk_l2_norm:
        return tuple(nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps, elementwise_affine=False) for _ in range(2))
    if cfg.qk_norm:
        return tuple(make_norm(cfg.norm, cfg.head_dim, cfg.norm_eps) for _ in range(2))
    return None, None


def post_norms(cfg: ModelConfig) -> tuple[nn.Module | None, nn.Module | None]:
    """Gemma's norms on the attention's and on the MLP's output (post_attention_layernorm, post_feedforward_layernorm:
    the model's norm kind over hidden), or none (`ModelConfig.post_norms`)."""
    if not cfg.post_norms:
        return None, None
    return make_norm(cfg.norm, cfg.hidden, cfg.norm_eps), make_norm(cfg.norm, cfg.hidden, cfg.norm_eps)


def post_norm(norm: nn.Module | None, y: torch.Tensor) -> torch.Tensor:
    """A block's output before its residual add: normed by `norm` (Gemma's post-norm), or as it is."""
    return y if norm is None else norm(y)


def qkv_rows(cfg: ModelConfig) -> tuple[int, int, int]:
    """Rows of the Q, K and V blocks of `qkv`: heads x head_dim, kv heads x head_dim, kv heads x head_dim."""
    hd = cfg.head_dim
    return cfg.heads * hd, cfg.num_kv_heads * hd, cfg.num_kv_heads * hd


def rope_of(cfg: ModelConfig, windowed: bool = False) -> Rope:
    """The model's rotary frequencies (config.json's rope_theta, rotary scaling and partial_rotary_factor:
    pipesim.model.rotary; Megatron-LM's base 10,000 unscaled without them) and YaRN's attention factor; on a
    `windowed` layer of a model with its own window base (Gemma 3's rope_local_base_freq: `Rotary.window_theta`),
    plain RoPE of that base without the factor (transformers' Gemma3 rotary_emb_local, a default rotary)."""
    rotary = cfg.rotary or Rotary()
    local = windowed and rotary.window_theta > 0
    rotary = rotary.on_window() if local else rotary
    return tuple(rotary.inverse_frequencies(rotary.rotated_width(cfg.head_dim))), 1.0 if local else cfg.rope_mscale


@functools.lru_cache(maxsize=16)
def rotary_tables(t: int, rope: Rope, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's angles, (t, r) float32 each (r: the rotated features): positions 0..t-1 turn
    feature pair i (i, i + r/2) by position x inverse frequency i, both times YaRN's attention factor (transformers
    scales cos and sin by it). Built once per shape and device (Megatron-core's RotaryEmbedding keeps them too), not
    per call."""
    inv, scale = rope
    with torch.no_grad():
        inv_freq = torch.tensor(inv, device=device, dtype=torch.float32)  # (r / 2,)
        angles = torch.outer(torch.arange(t, device=device, dtype=torch.float32), inv_freq)  # (t, r / 2)
        angles = torch.cat((angles, angles), dim=-1)  # (t, r)
        cos, sin = angles.cos(), angles.sin()
        return (cos, sin) if scale == 1.0 else (cos * scale, sin * scale)


def rotate(x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
    """Rotary position embedding on (b, heads, t, head_dim), Megatron-core's default form (rotate_half: the first and
    second halves of the rotated features paired), in float32; `rope` (`rope_of`) None: plain RoPE of base 10,000
    over the whole head. A partial rotation turns the first features and passes the rest (transformers' Nemotron)."""
    rope = rope or (tuple(Rotary().inverse_frequencies(x.shape[-1])), 1.0)
    cos, sin = rotary_tables(x.shape[-2], rope, x.device)
    xf = x.float()  # one cast (none for float32)
    r = cos.shape[-1]
    turned = xf if r == x.shape[-1] else xf[..., :r]
    first, second = turned.chunk(2, dim=-1)
    out = turned * cos + torch.cat((-second, first), dim=-1) * sin
    return (out if r == x.shape[-1] else torch.cat((out, xf[..., r:]), dim=-1)).to(x.dtype)


@functools.lru_cache(maxsize=16)
def band(t: int, window: int | None, device: torch.device) -> torch.Tensor:
    """(t, t) bool: True where query i sees key j, j <= i and (with a window) i - j < window."""
    i = torch.arange(t, device=device)
    seen = i[None, :] <= i[:, None]
    return seen if window is None else seen & (i[:, None] - i[None, :] < window)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None,
                   sinks: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Causal softmax(QK^T x scale) V on (b, heads, t, d) queries and (b, kv heads, t, d) keys and values, each kv
    head serving heads / kv heads consecutive query heads (torch's grouped-query SDPA, torch >= 2.5): what selective
    recomputation re-runs. `window`: keys a query sees, itself included; `sinks`: one logit per query head here,
    (heads,), in every softmax's denominator; `scale`: the scores' (ModelConfig.softmax_scale), None 1 / sqrt(d)."""
    gqa = k.shape[1] != q.shape[1]
    if window is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa, scale=scale)
    seen = band(q.shape[-2], window, q.device)
    if sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=seen, enable_gqa=gqa, scale=scale)
    if gqa:
        k, v = (z.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for z in (k, v))
    scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    scores = scores.masked_fill(~seen, float("-inf"))
    logits = torch.cat((scores, sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)), dim=-1)
    return torch.softmax(logits, dim=-1)[..., :-1] @ v


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then the MLP (or, on a layer with experts, an MoE MLP:
    executor.experts; `steps` then yields its all-to-alls in flight).

    Under TP (Megatron) a rank holds heads / tp query heads and kv heads / tp key/value heads: `qkv` column-parallel
    (its rows of Q, K and V), `proj` row-parallel; `fc1` column- (its gate and up rows), `fc2` row-parallel.
    """

    def __init__(self, cfg: ModelConfig, layer: int = 0, *, ep: tuple[int, int] | None = None) -> None:
        """`ep`: (this rank's ep coordinate, ep): an MoE MLP draws only that rank's experts (executor.experts)."""
        super().__init__()
        h = cfg.hidden
        self.head_dim = cfg.head_dim
        self.qkv_split = qkv_rows(cfg)  # the whole block's; a rank's are the same fractions of its width
        # a sliding layer by its type, as transformers' layer_types (its window may cover the sequence here): its RoPE
        sliding = cfg.window is not None and cfg.window.windowed(layer)
        # rotary tables; None with learned positions or on a NoPE layer (ModelConfig.nope_every: Llama 4's)
        nope = is_nope_layer(cfg.nope_every, layer)
        self.rope = rope_of(cfg, sliding) if cfg.positions == "rope" and not nope else None
        self.ln1 = make_norm(cfg.norm, h, cfg.norm_eps)
        self.qkv = nn.Linear(h, sum(self.qkv_split), bias=cfg.has_qkv_bias)
        self.q_norm, self.k_norm = qk_norms(cfg)
        windowed = cfg.window_size is not None and cfg.window.windowed(layer)
        self.window = cfg.window_size if windowed else None  # keys a query sees (None: causal over the sequence)
        # one sink logit per query head, whole on every tp rank (each applies its own heads': `first_head`)
        self.sinks = nn.Parameter(torch.zeros(cfg.heads)) if cfg.attention_sinks else None
        self.scale = cfg.softmax_scale  # the scores' (Gemma's query_pre_attn_scalar ** -0.5); None: 1 / sqrt(hd)
        self.first_head = 0  # the first of this rank's query heads (executor.models.shard_piece sets it under tp)
        self.proj = nn.Linear(self.qkv_split[0], h, bias=cfg.biases)
        # Gemma's post-norms on the attention's and the MLP's output (None without: post_norms)
        self.post_attn_norm, self.post_mlp_norm = post_norms(cfg)
        self.ln2 = make_norm(cfg.norm, h, cfg.norm_eps)
        self.activation = cfg.activation
        moe = cfg.moe is not None and cfg.moe.is_moe_layer(layer)
        self.moe = MoeMLP(h, cfg.moe, cfg.activation, cfg.biases, ep=ep) if moe else None
        if self.moe is None:  # executor.mlp.Mlp's matrices, held as the block's own (pieces.N.fc1: tp shards them)
            dense = Mlp(h, cfg.ffn_size, cfg.activation, cfg.biases)
            self.fc1, self.fc2 = dense.fc1, dense.fc2
        self.recompute_attention = False  # selective recomputation: the core keeps only q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, t, h) -> (b, t, h)
        if self.moe is not None:
            return drive(self.steps(x))
        x = self.attend(x)
        return x + self.mlp(self.ln2(x))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The dense MLP's output, post-normed when the model says so (what the residual adds)."""
        return post_norm(self.post_mlp_norm, self.fc2(activate(self.fc1(x), self.activation)))

    def steps(self, x: torch.Tensor) -> Steps:
        """The block as a generator yielding its MoE MLP's all-to-alls in flight (none for a dense block)."""
        x = self.attend(x)
        if self.moe is None:
            return x + self.mlp(self.ln2(x))
        return x + post_norm(self.post_mlp_norm, (yield from self.moe.steps(self.ln2(x))))

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """x plus the attention's output."""
        qkv = self.qkv(self.ln1(x))  # (b, t, width): the whole block's rows, or this rank's share of each
        b, t, width = qkv.shape  # t: the whole sequence, also under sequence parallelism (qkv gathered it)
        whole, hd = sum(self.qkv_split), self.head_dim
        widths = [width * rows // whole for rows in self.qkv_split]
        q, k, v = (z.view(b, t, w // hd, hd).transpose(1, 2) for z, w in zip(qkv.split(widths, dim=2), widths,
                                                                             strict=True))  # (b, heads, t, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = rotate(q, self.rope), rotate(k, self.rope)
        sinks = None if self.sinks is None else self.sinks[self.first_head:self.first_head + q.shape[1]]
        if self.recompute_attention:
            y = checkpoint(attention_core, q, k, v, self.window, sinks, self.scale, use_reentrant=False)
        else:
            y = attention_core(q, k, v, self.window, sinks, self.scale)
        y = y.transpose(1, 2).reshape(b, t, widths[0])
        return x + post_norm(self.post_attn_norm, self.proj(y))  # proj: reduced (sp: scattered) under tp


__all__ = ["Block", "Rope", "attention_core", "band", "make_norm", "post_norm", "post_norms", "qk_norms", "qkv_rows",
           "rope_of", "rotary_tables", "rotate"]
