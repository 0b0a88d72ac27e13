"""Llama 4's language model (pipesim.model.hf_llama4, llama4_attention): Scout's and Maverick's files read as
transformers builds them, their exact parameter counts against the model cards' totals, the "llama4" wrapper read as
its text_config, what is refused, and what a NoPE layer, the L2 QK-norm and the sigmoid router on the expert's input
cost and compute."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from executor.experts import MoeMLP
from executor.transformer import Block
from pipesim.cli import build_parser, main
from pipesim.commands.common import model_config
from pipesim.cost.kernel_costs import gpt_stage_seconds, layer_seconds
from pipesim.errors import PipesimError
from pipesim.model.activations import layer_activation_bytes
from pipesim.model.config import ModelConfig
from pipesim.model.hf_config import hf_key_report, load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.layer_kinds import DENSE, MOE, LayerKind, StageLayers, stage_layers
from pipesim.model.moe import MoeConfig
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import active_params, model_params

H, A, KV, D, V, L = 5120, 40, 8, 128, 202048, 48  # hidden, heads, kv heads, head_dim, vocabulary, layers
FE, FD = 8192, 16384  # the experts' (and the shared expert's) width, the dense layers'
ATTENTION = H * (A + 2 * KV) * D + A * D * H + 2 * H  # q, k, v, o (bias-free) and the layer's two RMSNorms
EXPERT = 3 * H * FE  # gate, up, down
EMBEDDINGS = 2 * V * H + H  # the embedding, the untied head, the final norm


def _bundled(name: str) -> dict:
    return read_hf_config(resolve_model_config(name))


def _load(tmp_path, cfg: dict, seq: int = 8192) -> ModelConfig:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return load_hf_config(path, seq=seq)


def test_scout_and_maverick_are_read_as_transformers_builds_them():
    scout, maverick = (load_hf_config(n, seq=8192) for n in ("llama4-scout-17b-16e", "llama4-maverick-17b-128e"))
    moe = MoeConfig(experts=16, top_k=1, expert_ffn=FE, shared_experts=1, every=1, score="sigmoid", input_probs=True)
    assert scout.moe == moe and maverick.moe == replace(moe, experts=128, every=2)
    assert (scout.ffn_size, maverick.ffn_size) == (FE, FD)  # Scout has no dense layer; Maverick's odd ones are
    assert [maverick.moe.is_moe_layer(layer) for layer in range(4)] == [False, True, False, True]
    for model in (scout, maverick):
        assert (model.head_dim, model.num_kv_heads, model.nope_every, model.attention_chunk, model.norm,
                model.activation, model.tied_embeddings, model.biases) == (D, KV, 4, 8192, "rmsnorm", "swiglu",
                                                                           False, False)
    assert (scout.qk_l2_norm, maverick.qk_l2_norm) == (True, False)
    assert (scout.rotary.theta, scout.rotary.scaling, scout.rotary.factor, scout.rotary.original_context) == (
        500_000.0, "llama3", 8.0, 8192)
    assert (maverick.rotary.theta, maverick.rotary.scaling) == (500_000.0, "none")


def test_exact_parameter_counts_round_to_the_model_cards_totals():
    """Scout: 48 layers, each the router, 16 experts and the shared one; 107.77B for the language model, of the
    card's "109B total" with the vision encoder. Maverick: 24 dense layers and 24 of 128 experts: 400.7B, the card's
    "400B". Active (one routed expert and the shared one, the embedding and head whole): 17.2B each, the names'
    "17B"."""
    scout, maverick = (load_hf_config(n, seq=8192) for n in ("llama4-scout-17b-16e", "llama4-maverick-17b-128e"))
    moe_layer = ATTENTION + H * 16 + 16 * EXPERT + EXPERT
    assert model_params(scout) == EMBEDDINGS + L * moe_layer == 107_769_861_120
    dense_layer, wide = ATTENTION + 3 * H * FD, ATTENTION + H * 128 + 128 * EXPERT + EXPERT
    assert model_params(maverick) == EMBEDDINGS + 24 * dense_layer + 24 * wide == 400_711_848_960
    assert round(model_params(maverick) / 1e9) == 401 and int(model_params(scout) / 1e9) == 107
    assert active_params(scout) == EMBEDDINGS + L * (ATTENTION + H * 16 + 2 * EXPERT) == 17_172_894_720
    assert active_params(maverick) == EMBEDDINGS + 24 * dense_layer + 24 * (ATTENTION + H * 128 + 2 * EXPERT) \
        == 17_184_691_200


def test_the_repositorys_wrapper_is_read_as_its_text_config(tmp_path):
    """meta-llama's config.json holds the language model under text_config beside the vision encoder's: the same
    model, the vision keys listed as ignored, an unknown wrapper key refused."""
    text = _bundled("llama4-scout-17b-16e")
    wrapper = {"architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080,
               "eoi_token_index": 200081, "image_token_index": 200092, "model_type": "llama4",
               "text_config": {**text, "model_type": "llama4_text"}, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
               "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408}}
    assert _load(tmp_path, wrapper) == load_hf_config("llama4-scout-17b-16e", seq=8192)
    report = hf_key_report(tmp_path / "config.json", seq=8192)
    assert {"vision_config", "image_token_index", "attn_temperature_tuning"} <= set(report.ignored)
    assert {"text_config", "no_rope_layers", "use_qk_norm", "intermediate_size_mlp"} <= set(report.read)
    with pytest.raises(PipesimError, match=r"keys that change the model and pipesim does not model: "
                                           r"projector_hidden_act \(unknown to pipesim beside a llama4"):
        _load(tmp_path, {**wrapper, "projector_hidden_act": "gelu"})


@pytest.mark.parametrize(("change", "message"), [
    ({"no_rope_layers": [1, 0, 1, 1] * 12}, r"'no_rope_layers' leaves RoPE out of layers \[1, 5, 9"),
    ({"no_rope_layers": [1, 1, 1, 0, 0] + [1] * 43}, "pipesim models NoPE on every k-th layer"),
    ({"moe_layers": [0, 1, 5]}, r"field 'moe_layers': experts on layers \[0, 1, 5\]; pipesim places them after the "
                                "first dense layers"),
    ({"attention_bias": True}, "biases would sit on q, k, v and o alone"),
    ({"output_router_logits": True}, r"output_router_logits \(mixture of experts\)"),
    ({"layer_types": ["full_attention"] * 48}, "must chunk the RoPE layers and keep the NoPE layers full"),
    ({"no_rope_layer_interval": 1, "no_rope_layers": []}, "nope_every 1 leaves every layer without positions"),
    ({"use_qk_norm": 1}, "field 'use_qk_norm' must be true or false"),
])
def test_what_pipesim_cannot_say_is_refused_in_one_line(tmp_path, change, message):
    with pytest.raises(PipesimError, match=message):
        _load(tmp_path, {**_bundled("llama4-scout-17b-16e"), **change})


def test_chunked_attention_past_its_chunk_is_refused_and_a_missing_head_dim_too(tmp_path):
    with pytest.raises(PipesimError, match="chunked attention over --seq 16384, longer than its chunk of 8192 tokens"):
        load_hf_config("llama4-scout-17b-16e", seq=16384)
    text = {k: v for k, v in _bundled("llama4-maverick-17b-128e").items() if k != "head_dim"}
    with pytest.raises(PipesimError, match="field 'head_dim' is missing"):
        _load(tmp_path, text)
    unchunked = _load(tmp_path, {**_bundled("llama4-scout-17b-16e"), "attention_chunk_size": None}, seq=16384)
    assert unchunked.attention_chunk is None  # no chunk: full causal attention on every layer, any length


def _small(**kw) -> ModelConfig:
    return ModelConfig(kind="gpt", hidden=256, layers=8, heads=4, seq=512, vocab=512, batch=8, dtype="bfloat16",
                       kv_heads=2, activation="swiglu", norm="rmsnorm", dropout=False, biases=False, positions="rope",
                       **kw)


def test_a_nope_layer_runs_every_kernel_but_ropes():
    """Layer l (0-based) takes no RoPE when (l + 1) % 4 == 0; its kernels are the RoPE layer's less the RoPE kernel
    each way, and a stage's seconds count each kind once per layer."""
    model, opts = _small(nope_every=4), LayerOptions(attention="flash")
    nope = replace(opts, nope=True)
    rope_k, nope_k = layer_kernels(model, 1, opts), layer_kernels(model, 1, nope)
    for phase in "FI":
        names = [k.name for k in rope_k.phase(phase)]
        assert [k.name for k in nope_k.phase(phase)] == [n for n in names if not n.startswith("RoPE on Q and K")]
        assert len(names) == len(nope_k.phase(phase)) + 1
    mix = StageLayers(((DENSE, 4), (LayerKind(variant=True), 1)))
    assert stage_layers(model, [5, 3]) == [mix, StageLayers(((DENSE, 2), (LayerKind(variant=True), 1)))]  # 3, 7
    full, narrow = (layer_seconds(model, 1, o, True, "H100") for o in (opts, nope))
    stage = gpt_stage_seconds(model, 1, mix, opts, first=False, last=False, fused=True, family="H100")
    assert stage.F == pytest.approx(4 * full.F + narrow.F, rel=1e-12) and narrow.F < full.F
    with pytest.raises(PipesimError, match="a NoPE layer's options for a model without NoPE layers"):
        nope.check(_small())


def test_the_l2_qk_norm_moves_a_norms_bytes_and_holds_no_parameter():
    """Megatron-core's L2Norm (one jit-fused kernel each way, no weight): a weightless RMSNorm's bytes on the
    queries and the keys, their inputs saved, and no parameter, where Qwen3's QK-norm holds 2 x head_dim."""
    l2, rms, plain = _small(qk_l2_norm=True), _small(qk_norm=True), _small()
    opts = LayerOptions(attention="flash")
    n_q, n_k, d = 512 * 256, 512 * 128, 2  # one sequence's query and key elements, bf16
    fwd = {k.name: k.nbytes for k in layer_kernels(l2, 1, opts).F if "head" in k.name}
    assert fwd == {"Q head L2 norm": 2 * n_q * d, "K head L2 norm": 2 * n_k * d}
    bwd = {k.name: k.nbytes for k in layer_kernels(l2, 1, opts).I if "head" in k.name}
    assert bwd == {"Q head L2 norm backward": 3 * n_q * d, "K head L2 norm backward": 3 * n_k * d}
    assert model_params(l2) == model_params(plain) == model_params(rms) - 8 * 2 * 64
    assert layer_activation_bytes(l2, 1, opts) == layer_activation_bytes(rms, 1, opts) \
        == layer_activation_bytes(plain, 1, opts) + (n_q + n_k) * d
    with pytest.raises(PipesimError, match="qk_l2_norm and qk_norm together"):
        _small(qk_l2_norm=True, qk_norm=True)


def test_the_executor_rotates_nothing_on_a_nope_layer_and_norms_without_weight():
    cfg = ModelConfig(kind="gpt", hidden=16, heads=4, seq=8, vocab=32, layers=2, batch=2, positions="rope",
                      nope_every=2, qk_l2_norm=True, norm="rmsnorm")
    x = torch.randn(2, 8, 16)
    torch.manual_seed(0)
    nope = Block(cfg, 1)
    torch.manual_seed(0)
    unrotated = Block(replace(cfg, positions="learned", nope_every=0), 1)  # the same draws: no rotary table
    assert nope.rope is None and Block(cfg, 0).rope is not None
    torch.testing.assert_close(nope(x), unrotated(x), rtol=0, atol=0)
    q = torch.randn(2, 4, 8, 4)
    assert list(nope.q_norm.parameters()) == []
    torch.testing.assert_close(nope.q_norm(q), q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + cfg.norm_eps))


def test_the_executors_sigmoid_router_weighs_the_chosen_experts_input():
    """Llama 4's routing (Llama4TextMoe; Megatron-core's sigmoid score with --moe-apply-probs-on-input): each token
    through its top expert with its input times sigmoid(that logit), plus the shared expert."""
    torch.manual_seed(0)
    moe = MoeMLP(8, MoeConfig(experts=4, top_k=1, expert_ffn=12, shared_experts=1, score="sigmoid",
                              input_probs=True), "swiglu", False)
    x = torch.randn(1, 6, 8)
    tokens = x.reshape(-1, 8)
    logits = moe.router(tokens).float()
    top = logits.argmax(dim=-1)
    expected = torch.stack([moe.experts[str(int(e))](t * torch.sigmoid(logits[i, e]))
                            for i, (t, e) in enumerate(zip(tokens, top, strict=True))]) + moe.shared(tokens)
    torch.testing.assert_close(moe(x).reshape(-1, 8), expected)
    with pytest.raises(PipesimError, match="input_probs .* needs top_k 1"):
        MoeConfig(experts=4, top_k=2, expert_ffn=12, input_probs=True)


def test_a_scout_step_simulates_and_a_longer_sequence_is_one_line(capsys):
    common = ["simulate", "1f1b", "--stages", "4", "--model-config", "llama4-scout-17b-16e", "--batch", "64",
              "--microbatch-size", "1", "--dp", "16", "--ep", "16", "--etp", "1", "--hardware", "dgx-h100",
              "--nodes", "8", "--zero", "1", "--recompute", "full", "--attention", "flash", "--json"]
    assert main([*common, "--seq", "8192"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] > 0
    assert main([*common, "--seq", "16384"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chunked attention over --seq 16384" in err[0]


# a Megatron-LM launch of Llama 4 Scout's language model (core_v0.15.3's flags), Meta's vocabulary unpadded
SCOUT_MEGATRON = (
    "--num-layers 48 --hidden-size 5120 --ffn-hidden-size 16384 --num-attention-heads 40 --group-query-attention "
    "--num-query-groups 8 --kv-channels 128 --seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 "
    "--global-batch-size 64 --position-embedding-type rope --rotary-base 500000 --use-rope-scaling --no-rope-freq 4 "
    "--qk-l2-norm --normalization RMSNorm --swiglu --disable-bias-linear --untie-embeddings-and-output-weights "
    "--attention-dropout 0 --hidden-dropout 0 --num-experts 16 --moe-router-topk 1 --moe-ffn-hidden-size 8192 "
    "--moe-shared-expert-intermediate-size 8192 --moe-router-score-function sigmoid --moe-apply-probs-on-input "
    "--moe-grouped-gemm --moe-token-dispatcher-type alltoall --expert-model-parallel-size 16 "
    "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --use-distributed-optimizer "
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 --bf16 --vocab-size 202048 "
    "--make-vocab-size-divisible-by 64 --use-flash-attn --train-iters 10 --lr 1e-4")
SCOUT_LAYOUT = ["1f1b", "--stages", "4", "--batch", "64", "--microbatch-size", "1", "--dp", "16", "--ep", "16",
                "--etp", "1", "--hardware", "dgx-h100", "--nodes", "8", "--zero", "1", "--recompute", "full",
                "--attention", "flash", "--seq", "8192", "--framework", "megatron-core"]


def _json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_megatron_launch_of_scout_simulates_as_its_config_json(tmp_path, capsys):
    """--qk-l2-norm, --no-rope-freq 4 and the router's --moe-router-score-function sigmoid and
    --moe-apply-probs-on-input: the same step and parameters as --model-config llama4-scout-17b-16e."""
    path = tmp_path / "scout.sh"
    path.write_text(f"torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py {SCOUT_MEGATRON}\n")
    mine = _json(capsys, ["simulate", "--from-megatron", str(path), "--hardware", "dgx-h100", "--nodes", "8"])
    theirs = _json(capsys, ["simulate", "--model-config", "llama4-scout-17b-16e", *SCOUT_LAYOUT])
    assert mine["step_time"] == theirs["step_time"]
    assert mine["memory"]["param_bytes"] == theirs["memory"]["param_bytes"]


def _model(argv: list[str]) -> ModelConfig:
    return model_config(build_parser().parse_args(["simulate", "1f1b", *argv]))


def test_megatrons_flags_for_llama4s_pieces():
    gpt = ["--model", "gpt", "--layers", "8", "--hidden", "256", "--heads", "4", "--seq", "512", "--batch", "8",
           "--position-embedding-type", "rope"]
    assert _model([*gpt, "--no-rope-freq", "([0]*3+[1])*2", "--qk-l2-norm"]).nope_every == 4
    assert _model([*gpt, "--no-rope-freq", "[0]*8"]).nope_every == 0
    over = _model(["--model-config", "qwen3-30b-a3b", "--seq", "4096", "--qk-l2-norm",
                   "--moe-router-score-function", "sigmoid"])
    assert (over.qk_l2_norm, over.qk_norm, over.moe.score) == (True, False, "sigmoid")  # L2Norm in place
    for argv, line in (([*gpt, "--no-rope-freq", "[0,1,0,0,0,1,0,0]"], r"RoPE skipped on layers \[1, 5\]"),
                       ([*gpt, "--no-rope-freq", "1"], "pipesim models NoPE on every N-th layer"),
                       ([*gpt, "--no-rope-freq", "[0]*3"], "3 entries of 0 and 1 for 8 layers"),
                       ([*gpt, "--moe-router-score-function", "sigmoid"], "needs a mixture-of-experts model"),
                       (["--model", "moe", "--moe-router-topk", "2", "--moe-apply-probs-on-input"],
                        r"input_probs \(--moe-apply-probs-on-input\) needs top_k 1"),
                       (["--model", "gpt", "--no-rope-freq", "2"], "NoPE layers .* need rotary positions")):
        with pytest.raises(PipesimError, match=line):
            _model(argv)


def test_a_scout_plans_megatron_export_carries_llama4s_flags_and_simulates_back(tmp_path, capsys):
    """The plan's Megatron-LM arguments with Scout's own (SCOUT_MEGATRON's model flags): the plan's step, the NoPE
    layers, L2 QK-norm and sigmoid router on the expert's input included (--qk-l2-norm: Megatron's spec, on every
    layer, as the launch above)."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--model-config", "llama4-scout-17b-16e", "--qk-l2-norm", "--seq", "8192", "--batch", "64",
                 "--hardware", "dgx-h100", "--nodes", "8", "--framework", "megatron-core", "--schedules", "1f1b",
                 "--max-candidates", "3", "--top", "1", "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    lines = plan["winner"]["megatron_args"]
    assert {"--moe-router-score-function sigmoid", "--moe-apply-probs-on-input"} <= set(lines)
    assert "--moe-router-pre-softmax" not in lines
    # Meta's vocabulary unpadded at the plan's tp (Megatron pads to a multiple of the divisor x tp)
    model = SCOUT_MEGATRON.replace("--make-vocab-size-divisible-by 64", "--make-vocab-size-divisible-by 8")
    layout = {"--micro-batch-size", "--global-batch-size", "--seq-length", "--tensor-model-parallel-size",
              "--pipeline-model-parallel-size", "--expert-model-parallel-size", "--moe-token-dispatcher-type",
              "--moe-grouped-gemm", "--use-distributed-optimizer", "--recompute-granularity", "--recompute-method",
              "--recompute-num-layers", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
              "--moe-shared-expert-intermediate-size", "--moe-router-score-function", "--moe-apply-probs-on-input"}
    words, keep, skip = model.split(), [], False
    for w in words:  # Scout's model flags alone: the plan gives the layout, the batch and the router
        if w.startswith("--"):
            skip = w in layout
        if not skip:
            keep.append(w)
    path = tmp_path / "scout_plan.sh"
    path.write_text("pretrain_gpt.py " + " ".join(keep) + "\n" + "\n".join(lines) + "\n")
    again = _json(capsys, ["simulate", "--from-megatron", str(path), "--hardware", "dgx-h100", "--nodes", "8"])
    assert again["step_time"] == plan["rows"][0]["step_time"]


def test_maverick_s_nope_layers_are_all_expert_layers_and_a_stage_counts_each_kind():
    """Maverick: experts on layers l with (l + 1) % 2 == 0, NoPE where (l + 1) % 4 == 0, so every NoPE layer is an
    expert layer; a 12-layer stage holds 6 dense RoPE, 3 expert RoPE and 3 expert NoPE layers, each kind costed once
    and counted (the NoPE one less its RoPE kernels)."""
    model = load_hf_config("llama4-maverick-17b-128e", seq=8192)
    mix = StageLayers(((DENSE, 6), (MOE, 3), (LayerKind(moe=True, variant=True), 3)))
    assert stage_layers(model, [12] * 4) == [mix] * 4
    opts = LayerOptions(attention="flash", ep=8)
    nope = replace(opts, nope=True)
    dense, moe, moe_nope = (layer_seconds(model, 1, o, True, "H100", moe=m)
                            for o, m in ((opts, False), (opts, True), (nope, True)))
    stage = gpt_stage_seconds(model, 1, mix, opts, first=False, last=False, fused=True, family="H100")
    for phase in ("F", "I", "W"):
        expected = 6 * getattr(dense, phase) + 3 * getattr(moe, phase) + 3 * getattr(moe_nope, phase)
        assert getattr(stage, phase) == pytest.approx(expected, rel=1e-12)
    assert moe_nope.F < moe.F and moe_nope.W == moe.W  # RoPE is a forward and input-gradient kernel, no weights


def test_moe_layers_after_dense_first_layers_are_placed_as_moeconfig_places_them(tmp_path):
    """A `moe_layers` list MoeConfig can say (dense first layers, then every k-th) is read exactly, the dense layers at
    intermediate_size_mlp (pipesim.model.moe_layer_freq.placement, the one reader of such patterns)."""
    model = _load(tmp_path, {**_bundled("llama4-scout-17b-16e"), "moe_layers": list(range(2, 48))})
    assert (model.moe.dense_layers, model.moe.every, model.ffn_size) == (2, 1, FD)
    maverick = _load(tmp_path, {**_bundled("llama4-maverick-17b-128e"), "moe_layers": list(range(1, 48, 2))})
    assert maverick == load_hf_config("llama4-maverick-17b-128e", seq=8192)  # its interleaving, spelled out
