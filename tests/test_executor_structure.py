"""The executor builds the transformer structures the cost model costs (executor/transformer.py): a Llama block
(grouped-query attention, SwiGLU of its own width, RMSNorm, rotary positions, no biases), Qwen3's attention (heads of
their own width, QK-norm), Nemotron's squared ReLU, experts in the model's activation, GPT-OSS's layer (sliding
windows, attention sinks, a router bias, the clamped and offset gate), Qwen2-MoE's (q/k/v biases, the shared expert's
sigmoid gate), and Gemma 3's (post-norms, GeGLU, scaled embeddings, the windowed layers' own RoPE). Their parameters
are the cost model's count exactly, and tensor-parallel runs (with and without sequence parallelism, which moves the
QK-norms' and the sinks' gradient sum) train them like the single-process reference.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

import executor.models
from executor.models import Embed, build_full
from executor.stage import backward_input, backward_weight
from executor.transformer import Block, rope_of, rotate
from pipesim.cli import build_parser
from pipesim.commands.run_args import config_from_args
from pipesim.cost.executor_ops import EMBED_SCALE_OPS, GPT_BLOCK_OPS, executor_block_ops, executor_moe_block_ops
from pipesim.cost.stage_work import gpt_stage_work
from pipesim.errors import PipesimError
from pipesim.model.attention_window import SlidingWindow
from pipesim.model.config import ModelConfig
from pipesim.model.layer_kinds import StageLayers, is_variant_layer
from pipesim.model.moe import MoeConfig
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import model_params
from pipesim.model.rotary import Rotary
from tests.executor_helpers import OpCount, assert_matches_reference, chain, load_run
from tests.launch_shared import register_run

STEPS = 2
SIZES = ["--model", "gpt", "--hidden", "16", "--heads", "4", "--seq", "8", "--vocab", "32", "--layers", "4",
         "--batch", "8"]
LLAMA = [*SIZES, "--kv-heads", "2", "--ffn-hidden", "24", "--activation", "swiglu", "--normalization", "RMSNorm",
         "--position-embedding-type", "rope", "--disable-bias-linear"]
QWEN3 = [*LLAMA, "--kv-channels", "6", "--qk-layernorm"]  # 4 heads of 6: attention 24 wide on a hidden of 16
QWEN2 = [*LLAMA, "--add-qkv-bias"]  # biases on q, k and v alone (Megatron's flag; a qwen2 config.json's)
NEMOTRON = [*SIZES, "--activation", "relu2", "--ffn-hidden", "40", "--position-embedding-type", "rope",
            "--disable-bias-linear"]
TIED = [*LLAMA, "--tie-embeddings-and-output-weights"]  # the head's weight is the embedding's
TIED_GPT = [*SIZES, "--layers", "8", "--tie-embeddings-and-output-weights"]  # learned positions; 8 layers: 8 chunks
# GPT-OSS's layer at a small size (tests/data/tiny_gpt_oss.json, model_type gpt_oss): every other layer windowed over 4
# keys, a sink per head, biases, a router with a bias, 4 experts of 12 with the clamped, offset gate; in float32, the
# reference's precision (a bfloat16 run rounds the microbatches' sum apart from the whole batch's)
GPT_OSS = ["--model-config", "tests/data/tiny_gpt_oss.json", "--seq", "16", "--batch", "8", "--dtype", "float32"]
GPT_OSS_TP = ["--tp", "2", "--sequence-parallel", "--ep", "2", "--etp", "1"]
# Llama 4's language model at a small size (tests/data/tiny_llama4.json, the "llama4" wrapper): every other layer with
# 4 experts of 12 behind a sigmoid top-1 router weighting the expert's input, and a shared expert; the others a dense
# MLP of 24; every other layer without RoPE; the weightless L2 QK-norm
LLAMA4 = ["--model-config", "tests/data/tiny_llama4.json", "--seq", "16", "--batch", "8", "--dtype", "float32"]
# Gemma 3's layer at a small size (tests/data/tiny_gemma3.json, model_type gemma3_text): post-norms, GeGLU, embeddings
# times sqrt(64) = 8, QK-norm, heads of 32 over a hidden of 64, every other layer windowed over 8 of the 16 tokens with
# plain RoPE of base 10,000, the others full with base 10**6 scaled linearly by 8, the head tied to the embedding
GEMMA3 = ["--model-config", "tests/data/tiny_gemma3.json", "--seq", "16", "--batch", "8", "--dtype", "float32"]
# Qwen2-MoE's layer at a small size (tests/data/tiny_qwen2_moe.json, model_type qwen2_moe): biases on q, k and v alone,
# every layer with 4 SwiGLU experts of 32 (2 per token, not renormalised) beside a shared expert of 64 whose output is
# scaled by sigmoid(x . w) (its shared_expert_gate)
QWEN2_MOE = ["--model-config", "tests/data/tiny_qwen2_moe.json", "--seq", "16", "--batch", "8", "--dtype", "float32"]
# GPT-OSS's attention on the GPT (Megatron-core's flags): sinks, every other layer windowed over 4 of the 8 tokens
SINKS = [*SIZES, "--softmax-type", "learnable", "--window-size", "4,0", "--window-attn-skip-freq", "2"]
NAMES = ["1f1b", "zb-h1"]


def model_from(flags: list[str]) -> ModelConfig:
    """The ModelConfig `pipesim run` builds from these flags."""
    return config_from_args(build_parser().parse_args(["run", "1f1b", "--nproc", "1", *flags])).model


def test_the_flags_build_the_structures_they_name():
    llama, qwen3, nemotron, qwen2 = map(model_from, (LLAMA, QWEN3, NEMOTRON, QWEN2))
    assert (llama.kv_heads, llama.ffn_size, llama.activation, llama.norm, llama.positions, llama.biases) == (
        2, 24, "swiglu", "rmsnorm", "rope", False)
    assert (llama.qkv_bias, qwen2.qkv_bias, qwen2.biases) == (False, True, False)
    assert model_from([*SIZES, "--add-qkv-bias"]).qkv_bias is False  # the GPT's biases hold QKV's already
    assert (qwen3.head_dim, qwen3.qk_norm) == (6, True)
    assert (nemotron.activation, nemotron.ffn_size) == ("relu2", 40)


@pytest.mark.parametrize("flags", [SIZES, LLAMA, QWEN3, QWEN2, NEMOTRON, TIED, SINKS, GPT_OSS, GEMMA3, QWEN2_MOE],
                         ids=["gpt", "llama", "qwen3", "qwen2", "nemotron", "tied", "sinks", "gpt-oss", "gemma3",
                              "qwen2-moe"])
def test_the_executor_holds_the_cost_models_parameters(flags):
    model = model_from(flags)
    assert sum(p.numel() for p in build_full(model).parameters()) == model_params(model)


def test_swiglu_experts_hold_the_cost_models_parameters():
    moe = MoeConfig(experts=4, top_k=2, expert_ffn=12, shared_experts=1, shared_ffn=8, dense_layers=1)
    for biases in (True, False):
        model = ModelConfig(kind="gpt", hidden=16, heads=4, layers=3, activation="swiglu", norm="rmsnorm",
                            positions="rope", biases=biases, moe=moe)
        assert sum(p.numel() for p in build_full(model).parameters()) == model_params(model)


def test_a_stage_built_alone_holds_the_full_models_pieces_bit_for_bit(monkeypatch):
    """A rank builds only its stages' pieces, each from its own seed: the last stage of a tied model (blocks 3-4 and
    the head) equals the full model's, its head a copy of the embedding, and no other piece is built."""
    model = model_from(TIED)
    full = dict(build_full(model).named_parameters())
    built = []
    real = executor.models.build_piece
    monkeypatch.setattr(executor.models, "build_piece", lambda cfg, i, ep=None: built.append(i) or real(cfg, i, ep))
    last = executor.models.build_stages(model, [2, 2], [1])[1]
    assert built == [3, 4, 5, 0]  # its pieces, then the embedding whose values the tied head copies
    for name, value in last.named_parameters():
        expected = full["pieces.0.tok.weight" if name == "pieces.5.out.weight" else name]
        torch.testing.assert_close(value, expected, rtol=0, atol=0)
    # a prepare step (the runtime's: shard, move to the device) takes each piece before the next is built
    built.clear()
    prepared = executor.models.build_stages(model, [2, 2], [1], prepare=lambda p: built.append("ready") or p)[1]
    assert built == [3, "ready", 4, "ready", 5, 0, "ready"] and prepared.prepared and not last.prepared


def _block_ops(model: ModelConfig, layer: int = 0) -> tuple[int, int, int]:
    """The executor block's framework ops in F, I and W (tests/executor_helpers.OpCount), its rotary tables built."""
    torch.manual_seed(0)  # the same parameters and input for every structure (an expert block's routing with them)
    block, x = Block(model, layer), torch.randn(2, 8, 16, requires_grad=True)
    block(x)  # the rotary tables are built once per shape, not per call
    with OpCount() as f:
        out = block(x)
    with OpCount() as i:
        _, state = backward_input(out, torch.randn_like(out), x, list(block.parameters()))
    with OpCount() as w:
        backward_weight(state, list(block.parameters()))
    return f.ops, i.ops, w.ops


WINDOW = SlidingWindow(4)  # 4 of the block's 8 tokens, on every layer
# Gemma 3's structure on the block's sizes: layer 0 windowed (its own plain RoPE), layer 1 full (the scaled one)
GEMMA_FIELDS = {"kv_heads": 2, "activation": "geglu", "norm": "rmsnorm", "positions": "rope", "biases": False,
                "dropout": False, "qk_norm": True, "head_width": 6, "window": SlidingWindow(4, full_every=2),
                "rotary": Rotary(theta=1e6, scaling="linear", factor=8, window_theta=1e4), "post_norms": True,
                "embedding_scale": True, "tied_embeddings": True, "norm_eps": 1e-6}
STRUCTURES = [{"window": WINDOW}, {"attention_sinks": True}, {"window": WINDOW, "attention_sinks": True},
              {"kv_heads": 2, "attention_sinks": True}, {"kv_heads": 2, "window": WINDOW},
              {"norm": "rmsnorm"}, {"positions": "rope"}, {"kv_heads": 2}, {"activation": "swiglu"},
              {"activation": "relu2"}, {"qk_norm": True}, {"norm": "rmsnorm", "qk_norm": True}, {"biases": False},
              {"biases": False, "qkv_bias": True},
              {"head_width": 6}, {"kv_heads": 1}, {"positions": "rope", "rotary": Rotary(fraction=0.5)},
              {"positions": "rope", "rotary": Rotary(theta=150_000, scaling="yarn", factor=32, original_context=4),
               "rope_mscale": 1.3466}, {"kv_heads": 2, "activation": "swiglu", "norm": "rmsnorm",
                                                   "positions": "rope", "biases": False, "qk_norm": True,
                                                   "head_width": 6},
              {"qk_l2_norm": True}, {"norm": "rmsnorm", "qk_l2_norm": True, "positions": "rope"},
              {"positions": "rope", "nope_every": 2}, {"positions": "rope", "nope_every": 2, "qk_l2_norm": True,
                                                       "kv_heads": 2, "norm": "rmsnorm"},
              {"activation": "geglu"}, {"post_norms": True}, {"norm": "rmsnorm", "post_norms": True},
              {"embedding_scale": True}, GEMMA_FIELDS]


@pytest.mark.parametrize("fields", STRUCTURES, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_the_cpu_cost_models_ops_of_a_block_are_the_executors(fields):
    """What a calibrated CPU host charges per op (pipesim.cost.executor_ops.executor_block_ops): the executor's block
    runs the GPT block's ops plus its structure's, counted here the way GPT_BLOCK_OPS is."""
    sizes = {"kind": "gpt", "hidden": 16, "heads": 4, "seq": 8, "vocab": 32, "layers": 2, "batch": 8}
    gpt, model = ModelConfig(**sizes), ModelConfig(**sizes, **fields)
    for layer in range(2):  # a NoPE model's second layer takes no RoPE: the variant layer (pipesim.model.layer_kinds)
        extra = tuple(m - g for m, g in zip(_block_ops(model, layer), _block_ops(gpt), strict=True))
        variant = is_variant_layer(model, layer)  # windowed when the model has a window, NoPE by nope_every
        assert extra == tuple(e - g for e, g in zip(executor_block_ops(model, variant), GPT_BLOCK_OPS, strict=True))


GATES = [{}, {"router_bias": True}, {"glu_clamp": 7.0}, {"glu_alpha": 1.702}, {"glu_offset": 1.0},
         {"router_bias": True, "glu_clamp": 7.0, "glu_alpha": 1.702, "glu_offset": 1.0}]  # the last GPT-OSS's


ROUTERS = [{"score": "sigmoid"}, {"score": "sigmoid", "aux_loss_coeff": 0.01},
           {"score": "sigmoid", "top_k": 1, "input_probs": True},
           {"score": "sigmoid", "top_k": 1, "input_probs": True, "aux_loss_coeff": 0.01}]  # the last Llama 4's


@pytest.mark.parametrize(("activation", "biases", "renormalize", "gate"),
                         [("swiglu", True, False, {}), ("gelu", False, False, {}), ("swiglu", False, True, {}),
                          ("gelu", True, True, {})] + [("swiglu", True, True, g) for g in GATES[1:]]
                         + [("swiglu", False, False, r) for r in ROUTERS])
def test_the_cpu_cost_models_ops_of_an_expert_block_are_the_executors(activation, biases, renormalize, gate):
    """The same for a block with experts (executor_moe_block_ops), against the GPT's expert block counted alike;
    with a renormalising router (Mixtral's, Qwen3's) too, GPT-OSS's router bias and gate shape, and sigmoid scores
    (DeepSeek-V3's, Llama 4's with the weight on the expert's input)."""
    for experts, shared in ((2, None), (4, 16)):
        moe = MoeConfig(**{"experts": experts, "top_k": 2, "expert_ffn": 32, "shared_experts": 1 if shared else 0,
                           "shared_ffn": shared, "renormalize": renormalize, **gate})
        sizes = {"kind": "gpt", "hidden": 16, "heads": 4, "seq": 8, "vocab": 32, "layers": 1, "batch": 8}
        gpt = ModelConfig(**sizes, moe=replace(moe, renormalize=False, router_bias=False, glu_clamp=None,
                                               glu_alpha=1.0, glu_offset=0.0, score="softmax", input_probs=False,
                                               aux_loss_coeff=0.0))
        model = ModelConfig(**sizes, moe=moe, activation=activation, biases=biases, norm="rmsnorm", positions="rope",
                            kv_heads=2)
        extra = tuple(m - g for m, g in zip(_block_ops(model), _block_ops(gpt), strict=True))
        opts = LayerOptions()
        assert extra == tuple(m - g for m, g in zip(executor_moe_block_ops(model, opts),
                                                    executor_moe_block_ops(gpt, opts), strict=True))


def _embed_ops(model: ModelConfig) -> tuple[int, int, int]:
    """The embedding piece's framework ops in F, I and W, as the first stage runs it: its input needs no gradient, so
    its whole backward is W (executor.stage: backward_weight's autograd.backward)."""
    torch.manual_seed(0)
    embed, idx = Embed(model), torch.randint(model.vocab, (2, model.seq))
    with OpCount() as f:
        out = embed(idx)
    grad = torch.randn_like(out)
    with OpCount() as w:
        torch.autograd.backward(out, grad)
    return f.ops, 0, w.ops


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_the_cpu_cost_models_ops_of_the_scaled_embedding_are_the_executors(positions):
    """Gemma's sqrt(hidden) on the token embeddings: the ops it adds to the embedding piece, counted as the block's
    are, are EMBED_SCALE_OPS, what the first stage's work (stage_work) charges a calibrated CPU host for it."""
    sizes = {"kind": "gpt", "hidden": 16, "heads": 4, "seq": 8, "vocab": 32, "layers": 2, "batch": 8,
             "positions": positions}
    plain, scaled = ModelConfig(**sizes), ModelConfig(**sizes, embedding_scale=True)
    measured = tuple(s - p for s, p in zip(_embed_ops(scaled), _embed_ops(plain), strict=True))
    assert measured == EMBED_SCALE_OPS
    ops = [gpt_stage_work(m, 2, StageLayers(), first=True, last=False, executor_ops=True).ops for m in (scaled, plain)]
    assert tuple(ops[0][k] - ops[1][k] for k in "FIW") == EMBED_SCALE_OPS


def test_the_windowed_layers_take_their_own_rope_only_with_a_window_base():
    """rope_of: a windowed layer rotates with plain RoPE of window_theta (no YaRN factor), a full layer with the
    model's rotary; without a window base both rotate with the model's."""
    model = ModelConfig(**{"kind": "gpt", "hidden": 16, "heads": 4, "seq": 8, "vocab": 32, "layers": 2,
                           **GEMMA_FIELDS})
    assert rope_of(model, windowed=True) == (tuple(1e4 ** (-2 * i / 6) for i in range(3)), 1.0)
    assert rope_of(model) == (tuple(1e6 ** (-2 * i / 6) / 8 for i in range(3)), 1.0)
    same = replace(model, rotary=replace(model.rotary, window_theta=0.0))
    assert rope_of(same, windowed=True) == rope_of(same) == rope_of(model)


def test_rotary_embedding_turns_each_pair_by_its_angle():
    """Position t turns the pair (x_i, x_{i + d/2}) by t / 10000^(2i/d): position 0 is untouched, norms are kept,
    and a query-key product depends on their distance only."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 8, 4, generator=gen)
    rq = rotate(q)
    torch.testing.assert_close(rq[..., 0, :], q[..., 0, :], rtol=0, atol=0)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    t, angle = 3, 3 / 10000 ** (2 * 1 / 4)  # pair 1 (features 1 and 3) at position 3
    x1, x3 = q[0, 0, t, 1], q[0, 0, t, 3]
    torch.testing.assert_close(rq[0, 0, t, [1, 3]], torch.stack([x1 * math.cos(angle) - x3 * math.sin(angle),
                                                                   x3 * math.cos(angle) + x1 * math.sin(angle)]))
    same = torch.ones(1, 1, 8, 4)  # the same query and key at every position
    scores = rotate(same)[0, 0] @ rotate(same)[0, 0].T  # (8, 8)
    for gap in range(3):
        torch.testing.assert_close(scores.diagonal(gap), scores.diagonal(gap)[:1].expand(8 - gap))


def _flags(d):
    common = ["--steps", str(STEPS), "--quiet", "--microbatches", "2"]
    return chain(
        [",".join(NAMES), "--tp", "2", *LLAMA, *common, "--save-dir", str(d / "llama")],
        [",".join(NAMES), "--tp", "2", "--sequence-parallel", *LLAMA, *common, "--save-dir", str(d / "llama_sp")],
        [",".join(NAMES), "--tp", "2", *QWEN3, *common, "--save-dir", str(d / "qwen3")],
        [",".join(NAMES), "--tp", "2", "--sequence-parallel", *QWEN3, *common, "--save-dir", str(d / "qwen3_sp")],
        [",".join(NAMES), "--tp", "2", "--sequence-parallel", *QWEN2, *common, "--save-dir", str(d / "qwen2_sp")],
        [",".join(NAMES), "--tp", "2", *NEMOTRON, *common, "--save-dir", str(d / "nemotron")],
        [",".join(NAMES), "--tp", "2", "--sequence-parallel", *TIED, *common, "--save-dir", str(d / "tied_sp")],
        [",".join(NAMES), "--tp", "2", *SINKS, *common, "--save-dir", str(d / "sinks")],
        ["interleaved-1f1b,zb-v", *TIED_GPT, "--steps", str(STEPS), "--quiet", "--microbatches", "4",
         "--save-dir", str(d / "tied_pp4")],
        [",".join(NAMES), *GPT_OSS_TP, *GPT_OSS, *common, "--save-dir", str(d / "gpt_oss")],
        [",".join(NAMES), *GPT_OSS_TP, *GPT_OSS, *common, "--recompute", "selective", "--save-dir",
         str(d / "gpt_oss_selective")],
        [",".join(NAMES), *GPT_OSS_TP, *LLAMA4, *common, "--save-dir", str(d / "llama4")],
        [",".join(NAMES), *GPT_OSS_TP, *QWEN2_MOE, *common, "--save-dir", str(d / "qwen2_moe")],
        [",".join(NAMES), "--tp", "2", "--sequence-parallel", *GEMMA3, *common, "--save-dir", str(d / "gemma3")],
    )


FOUR_RANKS = register_run("executor_structure", 4, _flags)


@pytest.fixture(scope="module")
def runs(shared_launches):
    return shared_launches.case(FOUR_RANKS).check()


@pytest.mark.dist
@pytest.mark.parametrize(("folder", "flags"), [("llama", LLAMA), ("llama_sp", LLAMA), ("qwen3", QWEN3),
                                               ("qwen3_sp", QWEN3), ("qwen2_sp", QWEN2), ("nemotron", NEMOTRON),
                                               ("tied_sp", TIED),
                                               ("sinks", SINKS)])
def test_tp2_pp2_trains_the_structure_like_the_reference(runs, folder, flags):
    for name in NAMES:
        assert_matches_reference(runs / folder, name, model_from(flags), STEPS)


@pytest.mark.dist
@pytest.mark.parametrize("folder", ["gpt_oss", "gpt_oss_selective"])
def test_tp2_sp_ep2_pp2_trains_gpt_oss_like_the_reference(runs, folder):
    """GPT-OSS's windows, sinks (each tp rank its heads': their gradients summed over tp), router bias and gate, on
    pp 2 x tp 2 with sequence parallelism and the experts over ep 2; selective recomputation re-runs the windowed and
    sink-weighted core."""
    for name in NAMES:
        assert_matches_reference(runs / folder, name, model_from(GPT_OSS), STEPS)


@pytest.mark.dist
def test_tp2_sp_ep2_pp2_trains_llama4_like_the_reference(runs):
    """Llama 4's NoPE layers, L2 QK-norm, interleaved experts with a shared one and the sigmoid router on the
    expert's input, on pp 2 x tp 2 with sequence parallelism and the experts over ep 2."""
    model = model_from(LLAMA4)
    assert (model.nope_every, model.qk_l2_norm, model.moe.every, model.moe.score, model.moe.input_probs) == (
        2, True, 2, "sigmoid", True)
    for name in NAMES:
        assert_matches_reference(runs / "llama4", name, model, STEPS)


@pytest.mark.dist
def test_tp2_sp_ep2_pp2_trains_qwen2_moe_like_the_reference(runs):
    """Qwen2-MoE's q, k and v biases and its shared expert behind the sigmoid gate (whole on every tp rank, on its
    sequence shard: the gate's gradient summed over tp as the router's), on pp 2 x tp 2 with sequence parallelism and
    the experts over ep 2."""
    model = model_from(QWEN2_MOE)
    assert (model.qkv_bias, model.biases, model.moe.shared_gate, model.moe.shared_ffn, model.moe.renormalize) == (
        True, False, True, 64, False)
    for name in NAMES:
        assert_matches_reference(runs / "qwen2_moe", name, model, STEPS)
    _, params = load_run(runs / "qwen2_moe", "1f1b")
    assert {f"pieces.{i}.moe.shared_gate.weight" for i in range(1, 5)} <= params.keys()


@pytest.mark.dist
def test_tp2_sp_pp2_trains_gemma3_like_the_reference(runs):
    """Gemma 3's post-norms (on each rank's sequence shard of the reduce-scattered output, their gradients summed
    over tp), GeGLU split by columns, scaled embeddings tied to the head, and the windowed layers' own RoPE, on pp 2 x
    tp 2 with sequence parallelism."""
    model = model_from(GEMMA3)
    assert (model.post_norms, model.embedding_scale, model.activation, model.rotary.window_theta) == (
        True, True, "geglu", 10_000.0)
    for name in NAMES:
        assert_matches_reference(runs / "gemma3", name, model, STEPS)


@pytest.mark.dist
def test_a_tied_head_trains_like_the_reference_beside_or_away_from_its_embedding(runs):
    """pp 4: interleaved 1F1B keeps the head on the last rank (its copy's gradients summed with the first rank's,
    and both copies saved equal bit for bit: executor_helpers.load_run), zb-v on the first (one Parameter)."""
    for name in ("interleaved-1f1b", "zb-v"):
        assert_matches_reference(runs / "tied_pp4", name, model_from(TIED_GPT), STEPS)
    sizes = json.loads((runs / "tied_pp4" / "interleaved-1f1b" / "result.json").read_text())["param_elements_per_rank"]
    assert sizes[3] - sizes[1] == 16 + 16 + 32 * 16  # the last rank: the final norm and its copy of the embedding


def test_typed_dropout_is_refused_by_the_executor_in_one_line():
    with pytest.raises(PipesimError) as err:
        model_from([*SIZES, "--dropout"])
    assert str(err.value) == "--dropout: the executor trains without dropout (pipesim simulate costs it)"
    assert model_from([*SIZES, "--no-dropout"]).dropout is False  # what it trains anyway


def test_a_tied_head_on_two_chains_is_refused_in_one_line():
    with pytest.raises(PipesimError) as err:
        config_from_args(build_parser().parse_args(["run", "dualpipe", "--nproc", "4", *TIED_GPT])).check(4)
    assert str(err.value) == ("dualpipe runs each model stage on two ranks, and this model's head is tied to its "
                              "embedding: the executor ties them on schedules with one chain")
