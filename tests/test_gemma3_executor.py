"""Gemma 3's layer as the executor builds it (executor/transformer.py, executor/mlp.py, executor/models.py), each
piece against transformers' code written out: the decoder layer (pre- and post-norms, QK-norm, the windowed and full
layers' RoPE, the scores' scale), GeGLU, and the scaled embeddings. Its op counts and its tensor-parallel runs:
tests/test_executor_structure.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from executor.mlp import activate, fc1_rows
from executor.models import Embed
from executor.transformer import Block
from pipesim.model.attention_window import SlidingWindow
from pipesim.model.config import ModelConfig
from pipesim.model.executor_scope import unbuilt_structure
from pipesim.model.hf_config import load_hf_config

QUERY_PRE_ATTN_SCALAR = 24  # tests/data/tiny_gemma3.json's (its heads are 32 wide)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm written out: x / sqrt(mean(x^2) + eps) times the weight."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _turned(x: torch.Tensor, inverse_frequencies: list[float]) -> torch.Tensor:
    """RoPE written out on (b, heads, t, d): position p turns the pair (x_i, x_{i + d/2}) by p x frequency i."""
    angles = torch.arange(x.shape[-2], dtype=x.dtype)[:, None] * torch.tensor(inverse_frequencies, dtype=x.dtype)
    cos, sin = angles.cos(), angles.sin()
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GeLU's tanh approximation written out (transformers' gelu_pytorch_tanh)."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))))


def _gemma_layer(block: Block, model: ModelConfig, x: torch.Tensor, frequencies: list[float],
                 window: int | None) -> torch.Tensor:
    """transformers' Gemma3DecoderLayer written out in float64 on `block`'s weights: x + post(attn(ln1 x)), then
    x + post(mlp(ln2 x)), the attention's heads QK-normed, turned by `frequencies`, attending over `window` keys."""
    w = {name: p.detach().double() for name, p in block.named_parameters()}
    x, eps, d = x.double(), model.norm_eps, model.head_dim
    b, t, _ = x.shape
    q, k, v = (_rms(x, w["ln1.weight"], eps) @ w["qkv.weight"].T).split(
        [model.heads * d, model.num_kv_heads * d, model.num_kv_heads * d], dim=-1)
    q, k, v = (z.view(b, t, -1, d).transpose(1, 2) for z in (q, k, v))
    q = _turned(_rms(q, w["q_norm.weight"], eps), frequencies)
    k = _turned(_rms(k, w["k_norm.weight"], eps), frequencies)
    group = model.heads // model.num_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    i = torch.arange(t)
    seen = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < (window or t))
    # Gemma3Attention.scaling: query_pre_attn_scalar ** -0.5, the file's 24 over heads of 32
    scores = (q @ k.transpose(-2, -1) / math.sqrt(QUERY_PRE_ATTN_SCALAR)).masked_fill(~seen, float("-inf"))
    attn = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, -1) @ w["proj.weight"].T
    x = x + _rms(attn, w["post_attn_norm.weight"], eps)
    gate, up = (_rms(x, w["ln2.weight"], eps) @ w["fc1.weight"].T).chunk(2, dim=-1)
    return x + _rms((_gelu_tanh(gate) * up) @ w["fc2.weight"].T, w["post_mlp_norm.weight"], eps)


def test_gemmas_block_is_its_decoder_layer_written_out():
    """Gemma 3's layer (tests/data/tiny_gemma3.json, its scores scaled by 24 ** -0.5): the executor's block is
    x + post_attn_norm(attn(ln1 x)), then x + post_mlp_norm(down(gelu_tanh(gate) up)), its sliding layer (0) turned by
    plain RoPE of base 10,000 over an 8-key window, its full layer (1) by base 10**6 with every frequency / 8, all
    norms with their own weights."""
    model = load_hf_config("tests/data/tiny_gemma3.json", seq=16, batch=8, dtype="float32")
    assert (model.activation, model.post_norms, model.embedding_scale, model.window, model.head_dim) == (
        "geglu", True, True, SlidingWindow(8, full_every=2), 32)
    assert unbuilt_structure(model) == []
    local = [10_000 ** (-2 * i / 32) for i in range(16)]
    scaled = [1e6 ** (-2 * i / 32) / 8 for i in range(16)]
    gen = torch.Generator().manual_seed(1)
    for layer, frequencies, window in ((0, local, 8), (1, scaled, None)):
        torch.manual_seed(layer)
        block = Block(model, layer)
        assert (block.window, block.rope[1]) == (window, 1.0)
        torch.testing.assert_close(torch.tensor(block.rope[0], dtype=torch.float64),
                                   torch.tensor(frequencies, dtype=torch.float64), rtol=1e-15, atol=0)
        with torch.no_grad():  # every norm its own weight (a ones weight would hide a missing or swapped norm)
            for p in block.parameters():
                if p.dim() == 1:
                    p.copy_(1 + 0.5 * torch.randn(p.shape, generator=gen))
        x = torch.randn(2, model.seq, model.hidden, generator=gen)
        torch.testing.assert_close(block(x).double(), _gemma_layer(block, model, x, frequencies, window), rtol=1e-5,
                                   atol=1e-5)


def test_geglu_is_gelu_tanh_of_the_gate_times_up():
    """executor.mlp: GeGLU's fc1 holds [gate; up] and the activation is gelu_pytorch_tanh(gate) x up."""
    assert fc1_rows("geglu", 5) == fc1_rows("swiglu", 5) == (5, 5)
    y = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    gate, up = y[:, :5], y[:, 5:]
    assert torch.equal(activate(y, "geglu"), F.gelu(gate, approximate="tanh") * up)
    torch.testing.assert_close(activate(y.double(), "geglu"), _gelu_tanh(gate.double()) * up.double(), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize(("hidden", "dtype"), [(64, torch.float32), (48, torch.bfloat16), (48, torch.float32)])
def test_the_embeddings_are_scaled_by_the_square_root_of_the_width(hidden, dtype):
    """Gemma3TextScaledWordEmbedding: embed(idx) x sqrt(hidden), the factor a float32 tensor cast to the weight's dtype
    (48: sqrt not a float, rounded as transformers rounds it); learned positions are added after, unscaled."""
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    sizes = {"kind": "gpt", "hidden": hidden, "heads": 4, "seq": 8, "vocab": 32, "dtype": name}
    idx = torch.randint(32, (2, 8), generator=torch.Generator().manual_seed(0))
    embed = Embed(ModelConfig(**sizes, positions="rope", embedding_scale=True)).to(dtype)
    expected = embed.tok(idx) * torch.tensor(hidden ** 0.5).to(dtype)
    assert torch.equal(embed(idx), expected)
    learned = Embed(ModelConfig(**sizes, embedding_scale=True)).to(dtype)
    assert torch.equal(learned(idx), learned.tok(idx) * torch.tensor(hidden ** 0.5).to(dtype) + learned.pos.weight)
    plain = Embed(ModelConfig(**sizes, positions="rope")).to(dtype)
    assert plain.scale is None and torch.equal(plain(idx), plain.tok(idx))
