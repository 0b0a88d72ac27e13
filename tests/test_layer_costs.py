"""Transformer layer costs: Korthikanti's activation closed forms, FLOPs against torch and Narayanan eq. 3,
elementwise bytes, tensor-parallel collectives and ring-attention exchanges, parameters."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from pipesim.cost.stage_work import gpt_block_flops
from pipesim.errors import PipesimError
from pipesim.model.activations import (
    embedding_activation_bytes,
    head_activation_bytes,
    layer_activation_bytes,
    layer_saved_tensors,
    recompute_working_bytes,
)
from pipesim.model.config import ModelConfig
from pipesim.model.elementwise import layer_elementwise_bytes
from pipesim.model.flops import (
    Flops,
    attention_core_flops,
    dense_flops,
    hardware_flops,
    head_flops,
    iteration_flops,
    layer_flops,
    model_flops,
)
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import block_params, embedding_params, head_params, model_params, stage_params

SHAPES = [(64, 2, 256, 8), (128, 3, 512, 16), (2048, 1, 12288, 96)]  # (s, b, h, a)


def _gpt(s: int, h: int, a: int, *, dtype: str = "bfloat16", layers: int = 4, vocab: int = 1024) -> ModelConfig:
    return ModelConfig(kind="gpt", hidden=h, heads=a, seq=s, layers=layers, vocab=vocab, batch=8, dtype=dtype)


def _llama(**kw) -> ModelConfig:
    base = dict(kind="gpt", hidden=256, heads=8, kv_heads=2, ffn_hidden=688, seq=64, layers=2, vocab=1000,
                batch=4, dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                positions="rope")
    return ModelConfig(**{**base, **kw})


# --- activation memory: Korthikanti et al. 2022, table in ../shared/reference/published.md ---

@pytest.mark.parametrize("s,b,h,a", SHAPES)
@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activations_reduce_to_korthikanti_closed_forms_exactly(s, b, h, a, t):
    model = _gpt(s, h, a)
    sbh = s * b * h

    def act(**kw) -> int:
        return layer_activation_bytes(model, b, LayerOptions(tp=t, **kw))

    assert act() == sbh * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))
    assert act(sp=True) == Fraction(sbh, t) * (34 + Fraction(5 * a * s, h))
    assert act(recompute="selective") == sbh * (10 + Fraction(24, t))
    assert act(sp=True, recompute="selective") == Fraction(sbh, t) * 34
    assert act(recompute="full") == 2 * sbh
    assert act(sp=True, recompute="full") == Fraction(2 * sbh, t)  # Megatron keeps the input sharded under sp
    if t == 1:  # no parallelism
        assert act() == sbh * (34 + Fraction(5 * a * s, h))


@pytest.mark.parametrize("s,b,h,a", SHAPES)
def test_flash_attention_drops_the_score_term_and_keeps_the_logsumexp(s, b, h, a):
    model = _gpt(s, h, a)
    for t in (1, 8):
        eager = layer_activation_bytes(model, b, LayerOptions(tp=t))
        flash = layer_activation_bytes(model, b, LayerOptions(tp=t, attention="flash"))
        assert flash == eager - 5 * a * s * s * b // t + 4 * s * b * a // t
        assert layer_activation_bytes(model, b, LayerOptions(tp=t, attention="flash", recompute="selective")) == \
            s * b * h * (10 + Fraction(24, t))


def test_float32_doubles_every_tensor_but_the_one_byte_masks():
    s, b, h, a = 64, 2, 256, 8
    half = layer_activation_bytes(_gpt(s, h, a), b, LayerOptions())
    full = layer_activation_bytes(_gpt(s, h, a, dtype="float32"), b, LayerOptions())
    masks = a * s * s * b + 2 * s * b * h  # softmax dropout, attention dropout, MLP dropout
    assert full == 2 * half - masks


def test_llama_layer_saves_gqa_kv_swiglu_gate_and_up_and_no_masks():
    model = _llama()
    s, b, h, a, f = 64, 3, 256, 8, 688
    hkv = 2 * 32  # kv heads x head_dim
    saved = {x.name: x.nbytes for x in layer_saved_tensors(model, b, LayerOptions())}
    assert saved == {
        "attention norm input": 2 * s * b * h, "QKV input": 2 * s * b * h, "Q": 2 * s * b * h,
        "K": 2 * s * b * hkv, "V": 2 * s * b * hkv,
        "softmax output": 2 * a * s * s * b,  # no dropout: A V reads the softmax output itself
        "attention output (projection input)": 2 * s * b * h,
        "MLP norm input": 2 * s * b * h, "MLP input": 2 * s * b * h,
        "gate and up": 4 * s * b * f, "down projection input": 2 * s * b * f,
    }
    flash = {x.name: x.nbytes for x in layer_saved_tensors(model, b, LayerOptions(tp=2, sp=True, attention="flash"))}
    assert flash["attention logsumexp"] == 4 * s * b * a // 2 and "softmax output" not in flash
    assert flash["K"] == 2 * s * b * hkv // 2 and flash["attention norm input"] == 2 * s * b * h // 2


def test_context_parallelism_divides_the_stash_by_cp():
    model = _llama(seq=256)
    one = layer_activation_bytes(model, 2, LayerOptions(tp=2, sp=True, attention="flash"))
    for cp in (2, 4):
        assert layer_activation_bytes(model, 2, LayerOptions(tp=2, sp=True, cp=cp, attention="flash")) * cp == one


def test_recompute_working_set_lives_during_the_layers_backward():
    model = _gpt(64, 256, 8)
    none = layer_activation_bytes(model, 2, LayerOptions(tp=2))
    full = layer_activation_bytes(model, 2, LayerOptions(tp=2, recompute="full"))
    selective = layer_activation_bytes(model, 2, LayerOptions(tp=2, recompute="selective"))
    assert recompute_working_bytes(model, 2, LayerOptions(tp=2)) == 0
    assert recompute_working_bytes(model, 2, LayerOptions(tp=2, recompute="full")) == none - full
    assert recompute_working_bytes(model, 2, LayerOptions(tp=2, recompute="selective")) == 5 * 8 * 64 * 64 * 2 // 2
    assert full < selective < none


def test_embedding_and_head_stash():
    model = _gpt(64, 256, 8, vocab=1000)
    assert embedding_activation_bytes(model, 2, LayerOptions(tp=4, sp=True)) == 64 * 2 * 256 // 4  # 1-byte mask
    assert embedding_activation_bytes(_llama(), 2, LayerOptions()) == 0
    # norm and head inputs (2 s b h each, / t under sp) + float32 softmax over ceil(1000 / 8) = 125 rows
    assert head_activation_bytes(model, 2, LayerOptions(tp=8, sp=True)) == 2 * 2 * 64 * 2 * 256 // 8 + 4 * 128 * 125
    assert head_activation_bytes(model, 2, LayerOptions(tp=8, recompute="full")) == \
        head_activation_bytes(model, 2, LayerOptions(tp=8))


# --- FLOPs ---

def test_gpt_flops_generalise_todays_gpt_block_flops():
    model = _gpt(64, 256, 8)
    assert layer_flops(model, 3, LayerOptions()) == Flops(*gpt_block_flops(model, 3))


@pytest.mark.parametrize("s,b,h,a", SHAPES)
def test_tp_ranks_share_the_flops_exactly(s, b, h, a):
    model = _gpt(s, h, a)
    for kw in ({}, {"recompute": "full"}, {"recompute": "selective", "sp": True}):
        assert layer_flops(model, b, LayerOptions(tp=8, **kw)) * 8 == layer_flops(model, b, LayerOptions(**kw))


NAR21 = [(24, 2304, 24, 512), (32, 3072, 30, 512), (32, 4096, 36, 512), (48, 6144, 40, 1024),
         (64, 8192, 48, 1536), (80, 10240, 60, 1792), (96, 12288, 80, 2304), (128, 16384, 96, 2160),
         (128, 20480, 105, 2520), (160, 25600, 128, 3072)]  # (heads, hidden, layers, global batch), Table 1


@pytest.mark.parametrize("a,h,l,B", NAR21)
def test_iteration_flops_equal_narayanan_eq3_and_korthikanti_eq7(a, h, l, B):
    s, V = 2048, 51200
    model = ModelConfig(kind="gpt", hidden=h, heads=a, layers=l, seq=s, vocab=V, batch=B, dtype="float16")
    eq3 = 96 * B * s * l * h * h * (1 + Fraction(s, 6 * h) + Fraction(V, 16 * l * h))  # full recompute
    eq7 = 72 * B * s * l * h * h * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * l * h))  # model FLOPs
    assert iteration_flops(model, B, LayerOptions(recompute="full")) == eq3
    assert iteration_flops(model, B, LayerOptions()) == eq7
    causal = 72 * B * s * l * h * h * (1 + Fraction(s, 12 * h) + Fraction(V, 12 * l * h))  # MFU's count
    assert model_flops(model, B) == causal


@pytest.mark.parametrize("a,h,l,B", NAR21[:3])
def test_hardware_flops_add_recomputation_and_flash_s_diagonal_tiles_to_the_causal_count(a, h, l, B):
    s, V = 2048, 51200
    model = ModelConfig(kind="gpt", hidden=h, heads=a, layers=l, seq=s, vocab=V, batch=B, dtype="float16")
    for rc in ("none", "selective", "full"):  # eager attention: the causal count with the recomputation
        eager = LayerOptions(recompute=rc)
        assert hardware_flops(model, B, eager) == iteration_flops(model, B, eager, causal=True)
    # flash, causal: the core's forward 2 B s^2 h, backward 5 B s^2 h (and the forward again under full or selective
    # recomputation), each x 128 / s more for the 128 x 128 diagonal tiles it computes whole
    for rc, core in (("none", 7), ("selective", 9), ("full", 9)):
        flash = LayerOptions(recompute=rc, attention="flash")
        extra = core * B * s * h * 128 * l
        assert hardware_flops(model, B, flash) == iteration_flops(model, B, flash, causal=True) + extra
    assert hardware_flops(model, B, LayerOptions(attention="flash")) > model_flops(model, B)


def test_recompute_orders_flops_full_over_selective_over_none():
    model = _gpt(64, 256, 8)
    none, sel, full = (layer_flops(model, 2, LayerOptions(recompute=r)) for r in ("none", "selective", "full"))
    core = 4 * 2 * 64 * 64 * 256
    assert sel == none + Flops(0, core, 0) and full == none + Flops(0, none.F, 0)
    assert full.total > sel.total > none.total


def test_flash_backward_recomputes_the_scores_and_causal_halves():
    model = _gpt(64, 256, 8)
    pairs = 2 * 64 * 64 * 256
    assert attention_core_flops(model, 2, LayerOptions()) == Flops(4 * pairs, 8 * pairs, 0)
    assert attention_core_flops(model, 2, LayerOptions(attention="flash")) == Flops(4 * pairs, 10 * pairs, 0)
    causal = attention_core_flops(model, 2, LayerOptions(attention="flash"), causal=True)
    assert causal == Flops(2 * pairs, 5 * pairs, 0)
    # cp: the rank's s / cp queries against all s keys; the ranks' sum is the whole square
    cp = attention_core_flops(model, 2, LayerOptions(attention="flash", cp=4))
    assert cp * 4 == Flops(4 * pairs, 10 * pairs, 0)


class _LlamaBlock(nn.Module):
    """RMSNorm, GQA attention with explicit score matmuls, SwiGLU: what layer_flops counts (t = 1, eager)."""

    def __init__(self, h: int, heads: int, kv_heads: int, f: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dh = heads, kv_heads, h // heads
        self.n1, self.n2 = nn.RMSNorm(h), nn.RMSNorm(h)
        self.q = nn.Linear(h, h, bias=False)
        self.kv = nn.Linear(h, 2 * kv_heads * self.dh, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.gate, self.up = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        y = self.n1(x)
        q = self.q(y).view(b, s, self.heads, self.dh).transpose(1, 2)  # (b, a, s, dh)
        k, v = (t.view(b, s, self.kv_heads, self.dh).transpose(1, 2) for t in self.kv(y).chunk(2, -1))
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # (b, a, s, dh)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.dh), dim=-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, s, h))
        z = self.n2(x)
        return x + self.down(nn.functional.silu(self.gate(z)) * self.up(z))


def _count(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_llama_block_flops_and_params_match_torch_exactly():
    model = _llama(seq=12, ffn_hidden=40, hidden=32, heads=4, kv_heads=2)
    b = 3
    torch.manual_seed(0)
    block = _LlamaBlock(32, 4, 2, 40)
    x = torch.randn(b, 12, 32, requires_grad=True)
    loss = lambda y: y.square().mean()  # noqa: E731
    f = _count(lambda: block(x))
    block.requires_grad_(False)
    i = _count(lambda: loss(block(x)).backward()) - f
    block.requires_grad_(True)
    w = _count(lambda: loss(block(x)).backward()) - f - i
    assert layer_flops(model, b, LayerOptions()) == Flops(f, i, w)
    assert block_params(model) == sum(p.numel() for p in block.parameters())


# --- memory-bound work ---

def test_elementwise_bytes_of_the_gpt_layer():
    s, b, h, a = 64, 2, 256, 8
    model = _gpt(s, h, a)
    n, scores = s * b * h, a * s * s * b
    ew = layer_elementwise_bytes(model, b, LayerOptions())
    assert ew.forward == {
        "attention LayerNorm": 4 * n, "softmax": 4 * scores, "softmax dropout": 5 * scores,
        "attention dropout": 5 * n, "attention residual add": 6 * n, "MLP LayerNorm": 4 * n,
        "GeLU": 2 * 2 * 4 * n, "MLP dropout": 5 * n, "MLP residual add": 6 * n,
    }
    assert ew.backward["softmax"] == 6 * scores and ew.backward["GeLU"] == 3 * 2 * 4 * n
    sel = layer_elementwise_bytes(model, b, LayerOptions(recompute="selective"))
    assert sel.backward_total == ew.backward_total + 4 * scores + 5 * scores
    full = layer_elementwise_bytes(model, b, LayerOptions(recompute="full"))
    assert full.backward_total == ew.backward_total + ew.forward_total


def test_elementwise_bytes_of_a_llama_layer_under_tp_and_sp():
    model = _llama()
    s, b, h, f, t = 64, 2, 256, 688, 2
    ew = layer_elementwise_bytes(model, b, LayerOptions(tp=t, sp=True, attention="flash"))
    n = s * b * h // t
    assert ew.forward == {"attention RMSNorm": 4 * n, "RoPE on Q and K": 2 * 2 * s * b * (h + 64) // t,
                          "attention residual add": 6 * n, "MLP RMSNorm": 4 * n, "SwiGLU": 6 * s * b * f // t,
                          "MLP residual add": 6 * n}
    assert ew.backward["SwiGLU"] == 10 * s * b * f // t


# --- communication: tests/test_layer_collectives.py ---

def test_parameters_per_tp_rank():
    h, V, s = 256, 1000, 64
    model = _gpt(s, h, 8, vocab=V)
    assert block_params(model) == 12 * h * h + 13 * h
    assert block_params(model, 4) == 12 * h * h // 4 + 7 * h // 4 + 6 * h  # QKV and fc1 biases split
    assert embedding_params(model, 8) == 125 * h + s * h
    assert head_params(model, 8) == 2 * h + h * 125
    assert stage_params(model, 1, layers=4, first=True, last=True) == model_params(model)
    tied = _llama(tied_embeddings=True)
    assert model_params(tied) == model_params(_llama()) - 1000 * 256  # the head is the embedding
    assert head_params(tied, 1, holds_embedding=False) == head_params(_llama())  # a last stage keeps its copy


# --- options ---

@pytest.mark.parametrize("kw,model_kw,message", [
    ({"cp": 2}, {}, "--cp 2 needs --attention flash (ring attention runs the fused kernel)"),
    ({"tp": 4}, {}, "--kv-heads 2 is not divisible by tp(4)"),
    ({"cp": 3, "attention": "flash"}, {}, "--seq 64 is not divisible by 2 x cp(3) (ring attention's load-balanced "
                                          "causal split)"),
    ({"cp": 16, "attention": "flash"}, {"seq": 80}, "--seq 80 is not divisible by 2 x cp(16) (ring attention's "
                                                    "load-balanced causal split)"),
    ({"recompute": "some"}, {}, "unknown --recompute 'some'; choose none, selective, full, op"),
    ({"attention": "sdpa"}, {}, "unknown --attention 'sdpa'; choose eager, flash, flash2"),
    ({"tp": 4, "sp": True, "cp": 2, "attention": "flash"}, {"seq": 12, "kv_heads": 4}, "--seq 12 / cp(2) is not "
                                                                                        "divisible by tp(4) "
                                                                        "(sequence parallelism splits the sequence "
                                                                        "over tp)"),
])
def test_bad_options_are_one_line(kw, model_kw, message):
    with pytest.raises(PipesimError) as err:
        layer_activation_bytes(_llama(**model_kw), 1, LayerOptions(**kw))
    assert str(err.value) == message


def test_flops_need_the_transformer():
    with pytest.raises(PipesimError, match="need --model gpt"):
        dense_flops(ModelConfig(), 1, LayerOptions())
    assert head_flops(_gpt(64, 256, 8, vocab=1000), 2, LayerOptions(tp=8)) == Flops(*(2 * 2 * 64 * 256 * 125,) * 3)
