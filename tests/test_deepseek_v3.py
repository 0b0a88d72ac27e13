"""DeepSeek-V3 expressible and costed: multi-head latent attention (pipesim.model.latent_attention), DeepSeek's MoE
layout and router bias, multi-token prediction on the last stage, the bundled config.json, and exact parameter
counts against the technical report's figures (arXiv:2412.19437) and the checkpoint's tensors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipesim.cli import main
from pipesim.comm.all_to_all import dispatch_time
from pipesim.comm.expert_exchange import ExpertExchange, exchange_timing, node_limit
from pipesim.cost.kernel_costs import kernel_seconds, profile_of
from pipesim.cost.model_costs import model_costs
from pipesim.cost.stage_work import gpt_stage_work, moe_layer_flops
from pipesim.device.kernels import attention_flops, flash_attention_time
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.activations import head_activation_bytes, layer_saved_tensors, mtp_activation_bytes
from pipesim.model.config import ModelConfig
from pipesim.model.elementwise import layer_elementwise_bytes
from pipesim.model.flops import attention_core_flops, dense_flops, head_flops, layer_flops, mtp_projection_flops
from pipesim.model.hf_config import hf_key_report, load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.kernel_types import FlashAttention
from pipesim.model.latent_attention import LatentAttention
from pipesim.model.latent_layer import latent_params
from pipesim.model.layer_collectives import cp_kv_block_bytes, tp_layer_collectives, tp_mtp_collectives
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.moe import MoeConfig, group_node_limit
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import (
    active_params,
    block_params,
    checkpoint_params,
    model_params,
    moe_mlp_params,
    mtp_projection_params,
)
from pipesim.model.piece_kernels import mtp_kernels
from pipesim.parallel_dims import ParallelDims

V3 = load_hf_config("deepseek-v3", seq=4096, batch=32)
H, A, V, L = 7168, 128, 129280, 61  # hidden, heads, vocabulary, layers
DQ, DC, NOPE, ROPE, DV = 1536, 512, 128, 64, 128  # q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head_dim
F, FE, E, K = 18432, 2048, 256, 8  # dense MLP width, expert width, routed experts, experts per token
ATTENTION = H * DQ + DQ + DQ * A * (NOPE + ROPE) + H * (DC + ROPE) + DC + DC * A * (NOPE + DV) + A * DV * H
ROUTER = H * E + E  # the gate's weight and its e_score_correction_bias
EXPERT = 3 * H * FE  # gate_proj, up_proj, down_proj of one routed (or the one shared) expert
MTP_OWN = 2 * H + 2 * H * H + H  # enorm, hnorm, eh_proj (2h -> h, bias-free), shared_head.norm


def _tiny(**kw) -> ModelConfig:
    """A DeepSeek-shaped model small enough to run in torch: h 64, 4 heads, latents 32 / 16, heads 8 + 4 / 8."""
    base = dict(kind="gpt", hidden=64, heads=4, seq=16, layers=2, vocab=100, batch=2, dtype="float32",
                ffn_hidden=48, activation="swiglu", norm="rmsnorm", dropout=False, biases=False, positions="rope",
                mla=LatentAttention(q_lora_rank=32, kv_lora_rank=16, qk_nope_dim=8, qk_rope_dim=4, v_head_dim=8))
    return ModelConfig(**{**base, **kw})


# --- the config ---

def test_bundled_config_loads_every_key_read_or_ignored():
    """The published deepseek-ai/DeepSeek-V3 config.json less quantization_config (FP8 storage: still refused,
    tests/test_moe_config.py), every other key read or listed as ignored."""
    cfg = read_hf_config(resolve_model_config("deepseek-v3"))
    assert "quantization_config" not in cfg and cfg["model_type"] == "deepseek_v3" and len(cfg) == 45
    report = hf_key_report("deepseek-v3")
    assert set(report.read) | set(report.ignored) == set(cfg)
    assert set(report.ignored) >= {"aux_loss_alpha", "seq_aux", "scoring_func", "routed_scaling_factor",
                                   "norm_topk_prob", "ep_size", "rope_scaling"}
    assert {"q_lora_rank", "kv_lora_rank", "num_nextn_predict_layers", "topk_method", "n_group",
            "topk_group"} <= set(report.read)  # group-limited routing: the nodes a token's experts reach
    assert V3.mla == LatentAttention(q_lora_rank=DQ, kv_lora_rank=DC, qk_nope_dim=NOPE, qk_rope_dim=ROPE,
                                     v_head_dim=DV)
    assert V3.moe == MoeConfig(experts=E, top_k=K, expert_ffn=FE, shared_experts=1, dense_layers=3, expert_bias=True,
                               groups=8, group_topk=4)
    assert (V3.mtp_layers, V3.ffn_size, V3.activation, V3.norm, V3.dtype) == (1, F, "swiglu", "rmsnorm", "bfloat16")
    assert ModelConfig(**json.loads(json.dumps(V3.to_dict()))) == V3  # to_dict round-trips mla and mtp_layers
    assert not {"mla", "mtp_layers"} & set(ModelConfig(kind="gpt").to_dict())  # left out at their defaults


def test_deepseek_keys_pipesim_cannot_read_refuse_in_one_line(tmp_path):
    cfg = read_hf_config(resolve_model_config("deepseek-v3"))
    cases = [({"moe_layer_freq": 2}, "field 'moe_layer_freq' 2: DeepSeek places experts on layers l with "
                                     "l % freq == 0, pipesim's every on (l + 1) % every == 0; pipesim reads 1 only"),
             ({"topk_method": "top2"}, "field 'topk_method' 'top2' is not DeepSeek's; choose one of noaux_tc, "
                                       "greedy, group_limited_greedy"),
             ({"scoring_func": "relu"}, "field 'scoring_func' 'relu' is not DeepSeek's; choose sigmoid or softmax"),
             ({"attention_bias": True}, "latent attention (mla): pipesim models its linears bias-free (DeepSeek's "
                                        "attention_bias false); set biases false")]
    for change, message in cases:
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**cfg, **change}))
        with pytest.raises(PipesimError) as err:
            load_hf_config(path)
        assert str(err.value) == f"{path}: {message}"
    missing = {key: value for key, value in cfg.items() if key != "kv_lora_rank"}
    path.write_text(json.dumps(missing))
    with pytest.raises(PipesimError, match=r"config.json: field 'kv_lora_rank' is missing$"):
        load_hf_config(path)
    no_mtp = {key: value for key, value in cfg.items() if key != "num_nextn_predict_layers"}
    path.write_text(json.dumps(no_mtp))
    assert load_hf_config(path).mtp_layers == 0


# --- parameters ---

def test_exact_parameter_counts_round_to_the_published_figures():
    """The report's "671B total, 37B activated" are the main model's; its Hugging Face checkpoint ("685B") adds the
    MTP module as stored, with its own copies of the embedding and the head, and the FP8 weights' block scales."""
    main_model = replace(V3, mtp_layers=0)
    ends = 2 * V * H + H  # embedding, head, final norm
    dense_layer, moe_layer = ATTENTION + 2 * H + 3 * H * F, ATTENTION + 2 * H + ROUTER + E * EXPERT + EXPERT
    assert model_params(main_model) == ends + 3 * dense_layer + 58 * moe_layer == 671_026_419_200
    assert round(model_params(main_model) / 1e9) == 671
    mtp = MTP_OWN + moe_layer  # its block is layer 61: a MoE layer, as the checkpoint's model.layers.61.mlp.experts
    assert mtp_projection_params(V3) == MTP_OWN and mtp == 11_610_068_224
    assert model_params(V3) == 671_026_419_200 + mtp == 682_636_487_424  # trained: the embedding and head shared
    assert checkpoint_params(V3) == model_params(V3) + 2 * V * H == 684_489_845_504  # + layers.61.embed_tokens, head
    # the checkpoint's FP8 weights (every linear but the router, eh_proj, the embedding and the head) carry one
    # float32 scale per 128 x 128 block: with them the tensors total 685B on the Hugging Face page
    blocks = lambda rows, cols: -(-rows // 128) * -(-cols // 128)  # noqa: E731
    attention = (blocks(DQ, H) + blocks(A * (NOPE + ROPE), DQ) + blocks(DC + ROPE, H) + blocks(A * (NOPE + DV), DC)
                 + blocks(H, A * DV))
    expert = 2 * blocks(FE, H) + blocks(H, FE)
    scales = 62 * attention + 3 * (2 * blocks(F, H) + blocks(H, F)) + 59 * 257 * expert
    assert checkpoint_params(V3) + scales == 684_531_386_000 and round((checkpoint_params(V3) + scales) / 1e9) == 685
    assert 685 - 671 == 14 and round((checkpoint_params(V3) - 671_026_419_200) / 1e9) == 13  # "14B MTP": 13.46B
    # active: 8 of the 256 routed experts, every other parameter (the embedding and the head whole: issue #231)
    active = ends + 3 * dense_layer + 58 * (ATTENTION + 2 * H + ROUTER + K * EXPERT + EXPERT)
    assert active_params(main_model) == active == 37_552_297_472
    assert int(active_params(main_model) / 1e9) == 37  # "37B activated": 37.55B, truncated (36.63B without the
    assert round((active - V * H) / 1e9) == 37  # embedding lookup, which rounds to it)
    assert active_params(V3) == active + MTP_OWN + ATTENTION + 2 * H + ROUTER + K * EXPERT + EXPERT


def test_counts_match_the_modules_deepseeks_checkpoint_names():
    """The modules of one dense layer, one MoE layer and the MTP layer as modeling_deepseek.py names them
    (q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; gate with
    e_score_correction_bias, experts, shared_experts; enorm, hnorm, eh_proj, shared_head.norm), on the meta device."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    def mlp(width: int) -> nn.Module:
        return nn.ModuleDict({"gate_proj": nn.Linear(H, width, bias=False), "up_proj": nn.Linear(H, width, bias=False),
                              "down_proj": nn.Linear(width, H, bias=False)})

    def layer(moe: bool) -> nn.Module:
        attn = nn.ModuleDict({"q_a_proj": nn.Linear(H, DQ, bias=False), "q_a_layernorm": nn.RMSNorm(DQ),
                              "q_b_proj": nn.Linear(DQ, A * (NOPE + ROPE), bias=False),
                              "kv_a_proj_with_mqa": nn.Linear(H, DC + ROPE, bias=False),
                              "kv_a_layernorm": nn.RMSNorm(DC), "kv_b_proj": nn.Linear(DC, A * (NOPE + DV), bias=False),
                              "o_proj": nn.Linear(A * DV, H, bias=False)})
        gate = nn.Module()
        gate.weight = nn.Parameter(torch.empty(E, H))
        gate.e_score_correction_bias = nn.Parameter(torch.empty(E))
        block = nn.ModuleDict({"gate": gate, "experts": nn.ModuleList([mlp(FE) for _ in range(E)]),
                               "shared_experts": mlp(FE)}) if moe else mlp(F)
        return nn.ModuleDict({"self_attn": attn, "mlp": block, "input_layernorm": nn.RMSNorm(H),
                              "post_attention_layernorm": nn.RMSNorm(H)})

    def count(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    with torch.device("meta"):
        dense, moe = count(layer(False)), count(layer(True))
        mtp_extra = count(nn.ModuleDict({"enorm": nn.RMSNorm(H), "hnorm": nn.RMSNorm(H),
                                         "eh_proj": nn.Linear(2 * H, H, bias=False), "norm": nn.RMSNorm(H)}))
        ends = count(nn.ModuleDict({"embed_tokens": nn.Embedding(V, H), "norm": nn.RMSNorm(H),
                                    "lm_head": nn.Linear(H, V, bias=False)}))
    assert block_params(V3) == dense and moe_mlp_params(V3) == moe - (dense - 3 * H * F)
    assert model_params(V3) == ends + 3 * dense + 58 * moe + mtp_extra + moe


def test_latent_attention_parameters_per_tp_rank_by_hand():
    """Megatron-core's MLA: the down projections and the latents' norms whole on every tp rank (duplicated
    TELinear), the up projections and the output projection split by heads."""
    for tp in (1, 2, 4, 8):
        whole = H * DQ + DQ + H * (DC + ROPE) + DC
        split = (DQ * A * (NOPE + ROPE) + DC * A * (NOPE + DV) + A * DV * H) // tp
        assert latent_params(V3, tp) == whole + split
        assert block_params(replace(V3, moe=None), tp) == whole + split + 3 * H * F // tp + 2 * H
    assert latent_params(V3) == ATTENTION == 187_107_328
    lite = replace(V3, mla=replace(V3.mla, q_lora_rank=None))  # DeepSeek-V2-Lite's plain Q projection
    assert latent_params(lite, 2) == H * (DC + ROPE) + DC + (H * A * (NOPE + ROPE) + DC * A * (NOPE + DV)
                                                             + A * DV * H) // 2


# --- FLOPs, kernels, saved tensors, collectives ---

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

    model = _tiny()
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
        for model in (_tiny(), _tiny(mla=replace(_tiny().mla, q_lora_rank=None)), replace(V3, moe=None)):
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
        _tiny(**kw)
    assert str(err.value) == message


def test_latent_attention_sizes_refuse_in_one_line():
    with pytest.raises(PipesimError) as err:
        LatentAttention(q_lora_rank=0, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128)
    assert str(err.value) == "latent attention q_lora_rank must be a positive integer, got 0"


# --- multi-token prediction on the last stage ---

def test_mtp_module_on_the_last_stage():
    """The last stage of 8 DeepSeek-V3 layers at tp 2 (sp), ep 4: with its MTP module it adds the module's norms and
    projection, one MoE block (layer index 8), the shared head's FLOPs and stash again, and a copy of the embedding;
    the projection's collectives, the block's and the head's."""
    model = replace(V3, layers=8)
    opts = LayerOptions(tp=2, sp=True, ep=4, etp=2, attention="flash")
    with_mtp = gpt_stage_work(model, 1, 1, first=False, last=True, opts=opts, moe_layers=1)
    without = gpt_stage_work(replace(model, mtp_layers=0), 1, 1, first=False, last=True, opts=opts, moe_layers=1)
    moe_block = with_mtp.param_count - without.param_count - (3 * H + 2 * H * H // 2) - (V // 2 * H)
    assert moe_block == latent_params(model, 2) + 2 * H + H * E + E // 4 * 3 * H * FE // 2 + 3 * H * FE // 2
    assert with_mtp.expert_params - without.expert_params == E // 4 * 3 * H * FE // 2
    proj, head = mtp_projection_flops(model, 1, opts), head_flops(model, 1, opts)
    block = moe_layer_flops(model, 1, opts)
    assert proj.F == 2 * V3.seq * 2 * H * H // 2
    for phase in "FIW":
        extra = with_mtp.flops[phase] - without.flops[phase]
        assert extra == getattr(proj, phase) + getattr(head, phase) + getattr(block, phase)
    stash = with_mtp.activation_bytes - without.activation_bytes
    assert stash == mtp_activation_bytes(model, 1, opts, moe=True)
    hidden = V3.seq * H * 2 // 2  # one (s, h) bfloat16 tensor split over tp by sp
    layer = sum(x.nbytes for x in layer_saved_tensors(model, 1, opts, moe=True))
    assert stash == hidden + 2 * hidden + layer + head_activation_bytes(model, 1, opts)  # enorm in, eh_proj in
    assert len(with_mtp.ep_exchanges["F"]) == 2 * len(without.ep_exchanges["F"])
    own = [(c.kind, c.nbytes, c.phase) for c in tp_mtp_collectives(model, 1, opts)]
    x = V3.seq * H * 2
    assert own == [("reduce_scatter", x, "F"), ("all_gather", 2 * x, "F"), ("all_gather", x, "F"),
                   ("all_gather", x, "I"), ("all_gather", 2 * x, "I"), ("reduce_scatter", 2 * x, "I")]
    for recompute in ("none", "selective", "full"):
        kernels, flops = mtp_kernels(model, 1, replace(opts, recompute=recompute)), \
            mtp_projection_flops(model, 1, replace(opts, recompute=recompute))
        assert (kernels.flops("F"), kernels.flops("I"), kernels.flops("W")) == (flops.F, flops.I, flops.W)
    with pytest.raises(PipesimError) as err:
        mtp_kernels(model, 1, LayerOptions(tp=2, sp=True, cp=2, ep=4, etp=2, attention="flash"))
    assert str(err.value) == ("multi-token prediction with --cp 2: Megatron-core does not support it with context "
                              "parallelism")


def test_parameters_of_each_rank_through_the_cost_model():
    """model_costs for 8 layers split 3, 2, 2, 1 over 4 stages at tp 2, ep 4 (etp 2, edp 1): the last stage holds
    layer 7, the MTP module (a MoE block), the head and a copy of the embedding; every parameter by hand."""
    model = replace(V3, layers=8)
    job = Job(ParallelDims(dp=4, tp=2, ep=4), sp=True, attention="flash")
    costs = model_costs(model, 4, 8, load_hardware("dgx-h100").with_nodes(4), job, layer_split=[3, 2, 2, 1])
    attention = latent_params(model, 2) + 2 * H
    experts = E // 4 * 3 * H * FE // 2
    moe = attention + H * E + experts + 3 * H * FE // 2  # router whole (its bias is a buffer), shared split
    dense = attention + 3 * H * F // 2
    embedding = V // 2 * H
    mtp_own = 3 * H + 2 * H * H // 2
    assert costs.param_counts == (embedding + 3 * dense, 2 * moe, 2 * moe,
                                  moe + mtp_own + moe + H + embedding + embedding)
    assert costs.expert_param_counts == (0, 2 * experts, 2 * experts, 2 * experts)


def test_simulate_from_the_cli(capsys):
    """The brief's command: on 80 GiB H100s its last stage (two MoE layers' experts on edp 1, the MTP block's, the
    head and an embedding copy) does not fit and is refused in one line; with the dense layers first
    (--layer-split 3,2,2,1) or on H200s it runs."""
    args = ["simulate", "1f1b", "-p", "4", "-m", "8", "--model-config", "deepseek-v3", "--seq", "4096", "--batch",
            "32", "--layers", "8", "--tp", "2", "--sequence-parallel", "--ep", "4", "--dp", "4", "--nodes", "4"]
    assert main([*args, "--hardware", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert "rank 3 (stage 3) needs" in err and "but H100-SXM5-80GB has 80.00 GiB" in err
    assert main([*args, "--hardware", "dgx-h100", "--layer-split", "3,2,2,1"]) == 0
    assert "1f1b: 4 ranks, 4 stages, 8 microbatches" in capsys.readouterr().out
    assert main([*args, "--hardware", "hgx-h200", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model_config"]["ignored"]


def test_group_limited_routing_bounds_the_nodes_a_token_reaches():
    """DeepSeek-V3's 4 of 8 groups over EP 64 on 8 nodes reach 4 nodes (its node-limited routing, arXiv:2412.19437
    section 2.1.2): the exchange is timed as dispatch_time with node_limit 4; on one node, or with several groups
    per node, there is no bound."""
    hw = load_hardware("dgx-h100").with_nodes(8)
    ep64 = list(range(64))
    x = ExpertExchange("dispatch", 4096, 7168, 8, 256, 2, groups=8, group_topk=4)
    assert node_limit(hw, ep64, x) == 4 == group_node_limit(8, 4, 8)
    assert node_limit(hw, list(range(8)), x) is None  # one node
    assert group_node_limit(8, 4, 16) == 8 and group_node_limit(8, 4, 4) is None  # a group per 2 nodes; 2 per node
    assert node_limit(hw, ep64, x._replace(groups=1, group_topk=0)) is None
    limited = exchange_timing(hw, ep64, x, kernel="deepep")[0]
    assert limited == dispatch_time(hw, ep64, 4096, 7168, 8, 256, node_limit=4, kernel="deepep").seconds
    assert limited < exchange_timing(hw, ep64, x._replace(groups=1, group_topk=0), kernel="deepep")[0]
    with pytest.raises(PipesimError, match="group_topk must be given with groups > 1"):
        MoeConfig(experts=256, top_k=8, expert_ffn=2048, groups=8)
    with pytest.raises(PipesimError, match="groups must be a positive integer dividing the 256 experts"):
        MoeConfig(experts=256, top_k=8, expert_ffn=2048, groups=3, group_topk=1)
