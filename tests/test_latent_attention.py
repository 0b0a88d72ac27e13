"""Multi-head latent attention (pipesim.model.latent_attention, latent_layer) costed by hand and against torch:
FLOPs per token, kernels, saved tensors, elementwise bytes, tensor-parallel collectives and refusals, on DeepSeek-V3's
shapes (tests/deepseek_shapes.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesim.cost.device_profiles import profile_of
from pipesim.cost.kernel_costs import kernel_seconds
from pipesim.device.kernels import attention_flops, flash_attention_time
from pipesim.errors import PipesimError
from pipesim.model.activations import layer_saved_tensors
from pipesim.model.cp_exchanges import cp_kv_block_bytes
from pipesim.model.elementwise import layer_elementwise_bytes
from pipesim.model.flops import attention_core_flops, dense_flops, layer_flops
from pipesim.model.fp8 import Fp8Options, saved_bytes
from pipesim.model.kernel_types import FlashAttention
from pipesim.model.latent_attention import LatentAttention
from pipesim.model.layer_collectives import tp_layer_collectives
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.options import LayerOptions
from tests.deepseek_shapes import (
    DC,
    DQ,
    DV,
    NOPE,
    ROPE,
    V3,
    A,
    F,
    H,
    tiny,
)


def test_latent_attention_flops_per_token_by_hand():
    """One token through one layer at tp 1: 2 x the weights of each linear; the core 2 s (a (nope + rope) + a v) per
    query (forward), flash backward 2 s (3 a (nope + rope) + 2 a v). Under sp the down projections run on each
    rank's own tokens: the tp ranks' FLOPs add up to tp 1's exactly."""
    dense = replace(V3, moe=None)
    s = V3.seq
    one = LayerOptions(attention="flash")
    weights = H * DQ + H * (DC + ROPE) + DQ * A * (NOPE + ROPE) + DC * A * (NOPE + DV) + A * DV * H + 3 * H * F
    assert dense_flops(dense, 1, one) == 2 * s * weights
    core = attention_core_flops(dense, 1, one)
    assert core.F == 2 * s * s * A * (NOPE + ROPE + DV) and core.I == 2 * s * s * A * (3 * (NOPE + ROPE) + 2 * DV)
    assert attention_core_flops(dense, 1, LayerOptions()).I == 2 * core.F  # eager: both operands' gradients
    for tp in (2, 4, 8):
        opts = LayerOptions(tp=tp, sp=True, attention="flash")
        assert dense_flops(dense, 1, opts) * tp == dense_flops(dense, 1, one)
        assert attention_core_flops(dense, 1, opts).F * tp == core.F
    kernel = FlashAttention("flash attention", 1, s, A, NOPE + ROPE, s, A, False, DV)
    assert kernel.flops == core.F and replace(kernel, backward=True).flops == core.I
    assert attention_flops(1, s, A, NOPE + ROPE, v_head_dim=DV, backward=True) == core.I


def test_latent_attention_flops_match_torch():
    """A tiny latent-attention layer (SwiGLU MLP) built in torch, its matmuls counted by FlopCounterMode: forward
    equals layer_flops' F, the backward (input gradients of every linear and the eager core, weight gradients)
    equals I + W."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode  # local import: torch is heavy

    model = tiny()
    mla, h, a, b, s = model.mla, model.hidden, model.heads, 2, model.seq
    torch.manual_seed(0)
    lin = {name: torch.nn.Linear(i, o, bias=False) for name, i, o in (
        ("q_a", h, mla.q_lora_rank), ("q_b", mla.q_lora_rank, a * mla.qk_head_dim),
        ("kv_a", h, mla.kv_lora_rank + mla.qk_rope_dim), ("kv_b", mla.kv_lora_rank, a * (mla.qk_nope_dim + 8)),
        ("o", a * 8, h), ("gate", h, 48), ("up", h, 48), ("down", 48, h))}
    x = torch.randn(b, s, h, requires_grad=True)

    def forward(x):
        q = lin["q_b"](torch.nn.functional.rms_norm(lin["q_a"](x), (mla.q_lora_rank,))).view(b, s, a, -1)
        kv_c, k_pe = lin["kv_a"](x).split([mla.kv_lora_rank, mla.qk_rope_dim], dim=-1)
        k_nope, v = lin["kv_b"](torch.nn.functional.rms_norm(kv_c, (mla.kv_lora_rank,))).view(b, s, a, -1).split(
            [mla.qk_nope_dim, 8], dim=-1)
        k = torch.cat([k_nope, k_pe[:, :, None, :].expand(b, s, a, mla.qk_rope_dim)], dim=-1)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = (torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v).transpose(1, 2).reshape(b, s, a * 8)
        y = x + lin["o"](out)
        return y + lin["down"](torch.nn.functional.silu(lin["gate"](y)) * lin["up"](y))

    with FlopCounterMode(display=False) as fwd:
        y = forward(x)
    with FlopCounterMode(display=False) as bwd:
        y.sum().backward()
    flops = layer_flops(model, b, LayerOptions())
    assert fwd.get_total_flops() == flops.F and bwd.get_total_flops() == flops.I + flops.W


def test_kernels_carry_the_flop_counts_and_flash_times_its_value_head():
    for opts in (LayerOptions(), LayerOptions(attention="flash"), LayerOptions(tp=2, sp=True, attention="flash"),
                 LayerOptions(tp=4, sp=True, recompute="full", attention="flash"),
                 LayerOptions(tp=2, sp=True, recompute="selective"), LayerOptions(cp=2, attention="flash")):
        for model in (tiny(), tiny(mla=replace(tiny().mla, q_lora_rank=None)), replace(V3, moe=None)):
            kernels, flops = layer_kernels(model, 2, opts), layer_flops(model, 2, opts)
            assert (kernels.flops("F"), kernels.flops("I"), kernels.flops("W")) == (flops.F, flops.I, flops.W)
    opts = LayerOptions(tp=2, sp=True, attention="flash")
    kernels = layer_kernels(replace(V3, moe=None), 1, opts)
    gemms = {k.name: (k.m, k.n, k.k) for k in kernels.F if not isinstance(k, FlashAttention) and hasattr(k, "m")}
    n = V3.seq
    assert gemms["Q down"] == (n // 2, DQ, H) and gemms["KV down"] == (n // 2, DC + ROPE, H)
    assert gemms["Q up"] == (n, A // 2 * (NOPE + ROPE), DQ) and gemms["KV up"] == (n, A // 2 * (NOPE + DV), DC)
    assert gemms["projection"] == (n, H, A // 2 * DV)
    flash = next(k for k in kernels.F if isinstance(k, FlashAttention))
    assert (flash.heads, flash.head_dim, flash.value_dim, flash.kv_heads) == (A // 2, NOPE + ROPE, DV, A // 2)
    profile = profile_of("H100")
    t = flash_attention_time(1, n, A // 2, NOPE + ROPE, "bfloat16", profile, causal=True, v_head_dim=DV)
    assert kernel_seconds(flash, "bfloat16", profile) == t.seconds
    assert t.bytes_moved == 2 * (n * A // 2 * (NOPE + ROPE + DV)) * 2  # Q, O and K, V once, bfloat16
    narrower = flash_attention_time(1, n, A // 2, NOPE + ROPE, "bfloat16", profile, causal=True)
    assert t.flops < narrower.flops and t.seconds < narrower.seconds  # a 128 value head costs less than 192


def test_latent_attention_saved_tensors_by_hand():
    """tp 2 with sp, flash, one sequence of 4096: the norm input and the down projections' input sharded, each latent
    twice (its norm's input, its up projection's input: sharded), Q and K of 192 and V of 128 per head on the rank's
    64 heads, the logsumexp, the projection input of 64 x 128."""
    opts = LayerOptions(tp=2, sp=True, attention="flash")
    n, d, t = V3.seq, 2, 2
    saved = {x.name: x.nbytes for x in layer_saved_tensors(replace(V3, moe=None), 1, opts)}
    assert saved == {
        "attention norm input": d * n * H // t, "Q/KV down input": d * n * H // t,
        "Q latent (norm input)": d * n * DQ // t, "Q latent normed (Q up input)": d * n * DQ // t,
        "KV latent (norm input)": d * n * DC // t, "KV latent normed (KV up input)": d * n * DC // t,
        "Q": d * n * A // t * (NOPE + ROPE), "K": d * n * A // t * (NOPE + ROPE), "V": d * n * A // t * DV,
        "attention logsumexp": 4 * n * A // t, "attention output (projection input)": d * n * A // t * DV,
        "MLP norm input": d * n * H // t, "MLP input": d * n * H // t,
        "gate and up": 2 * d * n * F // t, "down projection input": d * n * F // t}
    full = layer_saved_tensors(replace(V3, moe=None), 1, replace(opts, recompute="full"))
    assert [(x.name, x.nbytes) for x in full] == [("layer input", d * n * H // t)]


def test_latent_attention_saves_its_linears_inputs_as_fp8():
    """Under FP8 (blockwise: + a float32 scale per 128 elements) the down projections' input, the normed latents
    and the MLP's linears' inputs are saved as FP8; the latents (their norms' inputs), Q, K and V stay bf16, and
    the projection keeps flash's bf16 output alone (save_original_input: every recipe but delayed scaling)."""
    fp8 = Fp8Options("e4m3", "blockwise")
    opts = LayerOptions(tp=2, sp=True, attention="flash")
    model = replace(V3, moe=None)
    bf16 = {x.name: x.nbytes for x in layer_saved_tensors(model, 1, opts)}
    saved = {x.name: x.nbytes for x in layer_saved_tensors(model, 1, replace(opts, fp8=fp8))}
    converted = ("Q/KV down input", "Q latent normed (Q up input)", "KV latent normed (KV up input)", "MLP input",
                 "down projection input")
    for name in converted:
        assert saved.pop(f"{name} (FP8)") == saved_bytes(bf16.pop(name) // 2, fp8)
    assert "projection input (FP8)" not in saved
    assert saved == bf16  # the rest as in bf16: the latents, Q, K, V, the norms' inputs, gate and up


def test_latent_attention_elementwise_bytes():
    """The latents' RMSNorms, RoPE on the queries' rope part and the one shared rotary key per token, the Q, K, V
    assembly (read and write each once)."""
    opts = LayerOptions(tp=2, sp=True, attention="flash")
    n, d = V3.seq, 2
    ew = layer_elementwise_bytes(replace(V3, moe=None), 1, opts)
    assert ew.forward["Q latent RMSNorm"] == 2 * n * DQ // 2 * d
    assert ew.backward["KV latent RMSNorm"] == 3 * n * DC // 2 * d
    rope = n * A // 2 * ROPE + n * ROPE
    assert ew.forward["RoPE on Q and K"] == 2 * rope * d
    assert ew.forward["Q, K, V assembly"] == 2 * n * (2 * A // 2 * (NOPE + ROPE) + A // 2 * DV) * d


def test_latent_attention_tp_collectives_and_refusals():
    """Under sp: the Q latent, the KV latent and the rotary key gathered before the up projections, the output
    reduce-scattered; backward each up projection's input gathered again and its gradient reduce-scattered beside
    its GEMMs, the rotary key's gradient reduce-scattered. Without sp at tp > 1: refused (Megatron-core's MLA leaves
    the rotary key's gradient unreduced, NVIDIA/Megatron-LM issue 1699)."""
    model = replace(V3, moe=None)
    x, per_token = V3.seq * H * 2, V3.seq * 2  # bytes of one (s, h) tensor, and per unit of width, bfloat16
    colls = [(c.kind, c.nbytes, c.phase, c.what, c.overlaps) for c in
             tp_layer_collectives(model, 1, LayerOptions(tp=2, sp=True, attention="flash")) if "MLP" not in c.what]
    assert colls == [("all_gather", per_token * DQ, "F", "Q latent (before Q up)", ""),
                     ("all_gather", per_token * DC, "F", "KV latent (before KV up)", ""),
                     ("all_gather", per_token * ROPE, "F", "rotary key", ""),
                     ("reduce_scatter", x, "F", "attention output", ""),
                     ("all_gather", x, "I", "attention output gradient", ""),
                     ("all_gather", per_token * DQ, "I", "Q latent, again (for the Q up weight gradient)",
                      "I: Q up input-gradient GEMM"),
                     ("reduce_scatter", per_token * DQ, "I", "Q latent gradient", "W: Q up weight-gradient GEMM"),
                     ("all_gather", per_token * DC, "I", "KV latent, again (for the KV up weight gradient)",
                      "I: KV up input-gradient GEMM"),
                     ("reduce_scatter", per_token * DC, "I", "KV latent gradient", "W: KV up weight-gradient GEMM"),
                     ("reduce_scatter", per_token * ROPE, "I", "rotary key gradient", "")]
    assert cp_kv_block_bytes(model, 1, LayerOptions(tp=2, sp=True, cp=2, attention="flash")) == \
        V3.seq // 2 * A // 2 * (NOPE + ROPE + DV) * 2
    with pytest.raises(PipesimError) as err:
        layer_kernels(model, 1, LayerOptions(tp=2))
    assert str(err.value) == ("multi-head latent attention with tp(2) needs --sequence-parallel (Megatron-core's MLA "
                              "leaves the rotary key's gradient unreduced without it)")
    with pytest.raises(PipesimError, match=r"^latent attention \(mla\) has no single head_dim"):
        _ = model.head_dim


@pytest.mark.parametrize("kw,message", [
    ({"biases": True}, "latent attention (mla): pipesim models its linears bias-free (DeepSeek's attention_bias "
                       "false); set biases false"),
    ({"positions": "learned"}, "latent attention (mla) carries its positions in a decoupled rotary part: positions "
                               "must be rope"),
    ({"kv_heads": 2}, "latent attention (mla) gives every head its own keys and values: --kv-heads 2 must equal "
                      "--heads 4"),
    ({"mtp_layers": -1}, "mtp_layers must be a non-negative integer, got -1"),
    ({"mla": None, "mtp_layers": 1, "positions": "learned"},
     "multi-token prediction (mtp_layers) with learned positions: Megatron-core supports rope only"),
])
def test_model_config_refuses_in_one_line(kw, message):
    with pytest.raises(PipesimError) as err:
        tiny(**kw)
    assert str(err.value) == message


def test_latent_attention_sizes_refuse_in_one_line():
    with pytest.raises(PipesimError) as err:
        LatentAttention(q_lora_rank=0, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128)
    assert str(err.value) == "latent attention q_lora_rank must be a positive integer, got 0"
