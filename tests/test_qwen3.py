"""Qwen3 and Qwen3-MoE: heads of an explicit head_dim and QK-norm (ModelConfig.head_width, qk_norm), the bundled
qwen3-30b-a3b config.json, exact parameter counts against hand counts and the Qwen3 model cards' figures, and what
is refused in one line (by ModelConfig, by the config reader, by the executor)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from executor.run_config import RunConfig
from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.model.activations import layer_saved_tensors
from pipesim.model.config import ModelConfig
from pipesim.model.elementwise import layer_elementwise_bytes
from pipesim.model.flops import attention_core_flops, dense_flops, layer_flops
from pipesim.model.hf_config import hf_key_report, load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.kernel_types import FlashAttention, Gemm, MemoryBound
from pipesim.model.latent_attention import LatentAttention
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.moe import MoeConfig
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import active_params, block_params, model_params, qk_norm_params
from tests.config_files import config_refusal, write_config

# Qwen/Qwen3-30B-A3B's config.json (the Hugging Face hub), bundled as pipesim/model/configs/qwen3-30b-a3b.json
H, L, A, KV, HD = 2048, 48, 32, 4, 128  # hidden, layers, query heads, key/value heads, head_dim
FD, FE, E, K, V = 6144, 768, 128, 8, 151936  # dense MLP width (unused: every layer has experts), expert width, ...
Q30 = load_hf_config("qwen3-30b-a3b", seq=4096, batch=32)

# Qwen/Qwen3-8B's config.json (the Hugging Face hub): dense, head_dim 128 = 4096 / 32
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
            "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
            "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
            "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}


# --- the bundled config ---

def test_bundled_config_loads_every_key_read_or_ignored():
    cfg = read_hf_config(resolve_model_config("qwen3-30b-a3b"))
    assert cfg["model_type"] == "qwen3_moe" and cfg["architectures"] == ["Qwen3MoeForCausalLM"] and len(cfg) == 34
    report = hf_key_report("qwen3-30b-a3b")
    assert set(report.read) | set(report.ignored) == set(cfg)
    assert {"max_window_layers", "sliding_window", "use_sliding_window", "rope_theta", "rope_scaling"} <= \
        set(report.ignored)
    assert {"head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
            "mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef", "output_router_logits"} <= set(report.read)
    # every layer, no shared expert, no bias; the k weights renormalised (norm_topk_prob: the executor's router)
    assert Q30.moe == MoeConfig(experts=E, top_k=K, expert_ffn=FE, renormalize=True)
    assert (Q30.hidden, Q30.layers, Q30.heads, Q30.num_kv_heads, Q30.head_dim, Q30.head_width, Q30.qk_norm) == \
        (H, L, A, KV, HD, HD, True)
    assert (Q30.attention_width, Q30.kv_width) == (A * HD, KV * HD) == (4096, 512)  # not the 2048 hidden
    assert (Q30.ffn_size, Q30.vocab, Q30.activation, Q30.norm, Q30.biases, Q30.dropout, Q30.tied_embeddings,
            Q30.dtype) == (FD, V, "swiglu", "rmsnorm", False, False, False, "bfloat16")
    assert ModelConfig(**json.loads(json.dumps(Q30.to_dict()))) == Q30  # to_dict round-trips head_width, qk_norm


def test_the_new_fields_stay_out_of_to_dict_at_their_defaults():
    for model in (ModelConfig(), ModelConfig(kind="gpt"), load_hf_config("llama3-8b"), load_hf_config("deepseek-v3")):
        assert not {"head_width", "qk_norm"} & set(model.to_dict())
        assert (model.head_width, model.qk_norm) == (None, False)
    spelled = ModelConfig(kind="gpt", hidden=512, heads=8, head_width=64)  # hidden / heads spelled out: the default
    assert spelled == ModelConfig(kind="gpt", hidden=512, heads=8) and spelled.head_width is None


def test_parameter_counts_are_a_hand_count_and_the_model_cards_figures():
    """Per layer: q_proj h -> a d, k_proj and v_proj h -> kv d, o_proj a d -> h (no biases), q_norm and k_norm (d each),
    the two RMSNorms (h each), the router h -> E and E SwiGLU experts of 3 h f_e. Qwen's model card: "Number of
    Parameters: 30.5B in total and 3.3B activated". The total rounds to 30.5B; the activated 3,353,032,704 (the
    embedding and the head counted whole, as for Mixtral's and DeepSeek-V3's figures) is 3.35B, the card's 3.3B
    truncated (without the embedding and the head it would be 2.73B, without the embedding 3.04B)."""
    attention = H * A * HD + 2 * H * KV * HD + A * HD * H  # 18,874,368
    norms = 2 * HD + 2 * H  # q_norm, k_norm; input and post-attention RMSNorm
    router, expert = H * E, 3 * H * FE
    ends = V * H + H + H * V  # embedding, final norm, untied LM head
    total = ends + L * (attention + norms + router + E * expert)
    active = ends + L * (attention + norms + router + K * expert)
    assert (model_params(Q30), active_params(Q30)) == (total, active) == (30_532_122_624, 3_353_032_704)
    assert round(total / 1e9, 1) == 30.5 and int(active / 1e8) / 10 == 3.3
    assert qk_norm_params(Q30) == 2 * HD


def test_bundled_qwen3_235b_a22b_counts_exactly_against_the_model_card():
    """Qwen/Qwen3-235B-A22B's config.json (bundled as qwen3-235b-a22b): the 30B-A3B's keys with 94 layers, hidden
    4096, 64 query heads (4 key/value heads, head_dim 128), 128 experts of width 1536, 8 per token. The hand count of
    the test above: 235,093,634,560 in total and 22,190,763,520 activated (the embedding and the head whole), the
    model card's "235B in total and 22B activated"."""
    q235 = load_hf_config("qwen3-235b-a22b", seq=4096, batch=2048)
    h, layers, a, kv, hd, fe = 4096, 94, 64, 4, 128, 1536
    cfg = read_hf_config(resolve_model_config("qwen3-235b-a22b"))
    assert {k: v for k, v in cfg.items() if v != read_hf_config(resolve_model_config("qwen3-30b-a3b"))[k]} == {
        "hidden_size": h, "intermediate_size": 12288, "max_window_layers": layers, "moe_intermediate_size": fe,
        "num_attention_heads": a, "num_hidden_layers": layers}
    assert (cfg["num_key_value_heads"], cfg["head_dim"], cfg["num_experts"], cfg["num_experts_per_tok"],
            cfg["vocab_size"], cfg["rope_theta"], cfg["tie_word_embeddings"], cfg["max_position_embeddings"],
            cfg["decoder_sparse_step"], cfg["mlp_only_layers"]) == (kv, hd, E, K, V, 1e6, False, 40960, 1, [])
    assert q235.moe == MoeConfig(experts=E, top_k=K, expert_ffn=fe, renormalize=True)
    assert q235.qk_norm and q235.head_width == hd
    attention = h * a * hd + 2 * h * kv * hd + a * hd * h
    norms = 2 * hd + 2 * h
    ends = V * h + h + h * V
    total = ends + layers * (attention + norms + h * E + E * 3 * h * fe)
    active = ends + layers * (attention + norms + h * E + K * 3 * h * fe)
    assert (model_params(q235), active_params(q235)) == (total, active) == (235_093_634_560, 22_190_763_520)
    assert round(total / 1e9) == 235 and round(active / 1e9) == 22


def test_dense_qwen3_8b_counts_exactly_and_reads_as_llama_with_qk_norm(tmp_path):
    """Qwen3-8B (model card: 8.2B parameters, 6.95B non-embedding): its head_dim 128 is 4096 / 32, so the only
    difference from a Llama layer is QK-norm's 2 x 128 weights per layer."""
    model = load_hf_config(write_config(tmp_path, QWEN3_8B))
    h, layers, a, kv, d, f, v = 4096, 36, 32, 8, 128, 12288, 151936
    assert (model.moe, model.head_width, model.head_dim, model.qk_norm, model.num_kv_heads) == (None, None, d, True, kv)
    layer = h * a * d + 2 * h * kv * d + a * d * h + 2 * d + 2 * h + 3 * h * f
    total = v * h + layers * layer + h + h * v
    assert model_params(model) == active_params(model) == total == 8_190_735_360
    assert round(total / 1e9, 1) == 8.2 and round((total - 2 * v * h) / 1e9, 2) == 6.95
    assert block_params(model) - block_params(replace(model, qk_norm=False)) == 2 * d


# --- head_width: the attention's shapes ---

def test_head_width_sizes_the_attention_gemms_and_kernels():
    """Qwen3-30B-A3B at tp 2, one sequence of 4096: QKV h -> (a + 2 kv) d / t, the projection a d / t -> h, the flash
    kernel a / t heads of d = 128 (kv / t key/value heads); with heads of hidden / heads (64) every one is narrower."""
    opts, tokens = LayerOptions(tp=2, etp=2, attention="flash"), 4096
    kernels = layer_kernels(Q30, 1, opts, moe=True)
    gemms = {k.name: k for k in kernels.F if isinstance(k, Gemm)}
    assert gemms["QKV"] == Gemm("QKV", tokens, (A + 2 * KV) * HD // 2, H) == Gemm("QKV", 4096, 2560, 2048)
    assert gemms["projection"] == Gemm("projection", tokens, H, A * HD // 2) == Gemm("projection", 4096, 2048, 2048)
    assert [k for k in kernels.F if isinstance(k, FlashAttention)] == [
        FlashAttention("flash attention", 1, 4096, A // 2, HD, 4096, KV // 2, False)]
    narrow = replace(Q30, head_width=None)  # heads of 2048 / 32 = 64
    gemms = {k.name: k for k in layer_kernels(narrow, 1, opts, moe=True).F if isinstance(k, Gemm)}
    assert (gemms["QKV"], gemms["projection"]) == (Gemm("QKV", 4096, 1280, 2048), Gemm("projection", 4096, 2048, 1024))
    eager = {k.name: k for k in layer_kernels(Q30, 1, LayerOptions(tp=2, etp=2)).F if isinstance(k, Gemm)}
    assert (eager["Q K^T"], eager["A V"]) == (Gemm("Q K^T", 4096, 4096, HD, 16), Gemm("A V", 4096, HD, 4096, 16))


def test_head_width_flops_and_the_kernels_carry_the_same():
    """dense_flops 2 n h (a d + 2 kv d) + 2 n a d h + 6 n h f; the core 4 n s a d forward (all / t); the dense layer's
    kernels carry exactly layer_flops' F, I and W."""
    n, t = 4096, 2
    opts = LayerOptions(tp=t, etp=t, attention="flash")
    assert dense_flops(Q30, 1, opts) == (2 * n * H * (A * HD + 2 * KV * HD) + 2 * n * A * HD * H + 6 * n * H * FD) // t
    assert attention_core_flops(Q30, 1, opts).F == 4 * n * 4096 * A * HD // t
    for recompute in ("none", "selective", "full"):
        opts = LayerOptions(tp=t, etp=t, attention="flash", recompute=recompute)
        kernels, flops = layer_kernels(Q30, 1, opts), layer_flops(Q30, 1, opts)
        assert (kernels.flops("F"), kernels.flops("I"), kernels.flops("W")) == (flops.F, flops.I, flops.W)


# --- QK-norm: parameters, memory-bound kernels, saved tensors ---

def test_qk_norm_parameters_are_two_norms_over_head_dim_whole_on_every_tp_rank():
    plain = replace(Q30, qk_norm=False)
    for tp in (1, 2, 4):
        assert block_params(Q30, tp) - block_params(plain, tp) == 2 * HD == 256
    gpt = ModelConfig(kind="gpt", hidden=64, heads=4, head_width=32, qk_norm=True)  # LayerNorm: weight and bias
    assert qk_norm_params(gpt) == block_params(gpt) - block_params(replace(gpt, qk_norm=False)) == 2 * 2 * 32
    assert qk_norm_params(plain) == 0


def test_qk_norm_reads_and_writes_queries_and_keys_as_the_other_norms():
    """One norm kernel on the rank's a d / t query elements per token, one on its kv d / t key elements: F reads and
    writes (2 n d bytes), B reads the gradient and the input and writes one (3 n d); RoPE on Q and K of a d and kv d."""
    opts, n, dt = LayerOptions(tp=2, etp=2, attention="flash"), 4096, 2
    ew = layer_elementwise_bytes(Q30, 1, opts)
    q, k = n * A * HD // 2, n * KV * HD // 2
    assert (ew.forward["Q head RMSNorm"], ew.backward["Q head RMSNorm"]) == (2 * q * dt, 3 * q * dt)
    assert (ew.forward["K head RMSNorm"], ew.backward["K head RMSNorm"]) == (2 * k * dt, 3 * k * dt)
    assert ew.forward["RoPE on Q and K"] == 2 * (q + k) * dt
    assert "Q head RMSNorm" not in layer_elementwise_bytes(replace(Q30, qk_norm=False), 1, opts).forward
    kernels = layer_kernels(Q30, 1, opts, moe=True)
    assert MemoryBound("Q head RMSNorm", 2 * q * dt) in kernels.F and MemoryBound("K head RMSNorm", 2 * k * dt) in \
        kernels.F
    assert MemoryBound("Q head RMSNorm backward", 3 * q * dt) in kernels.I
    full = layer_elementwise_bytes(Q30, 1, replace(opts, recompute="full")).backward
    assert full["recompute Q head RMSNorm"] == 2 * q * dt  # re-run with the layer's forward


def test_qk_norm_saves_its_inputs_and_q_and_the_projection_input_are_heads_x_head_dim():
    opts, n, dt = LayerOptions(tp=2, etp=2, attention="flash"), 4096, 2
    saved = {x.name: x.nbytes for x in layer_saved_tensors(Q30, 1, opts, moe=True)}
    assert (saved["Q head norm input"], saved["K head norm input"]) == (dt * n * A * HD // 2, dt * n * KV * HD // 2)
    assert saved["Q"] == saved["attention output (projection input)"] == dt * n * A * HD // 2
    assert saved["K"] == saved["V"] == dt * n * KV * HD // 2
    plain = {x.name for x in layer_saved_tensors(replace(Q30, qk_norm=False), 1, opts, moe=True)}
    assert plain == set(saved) - {"Q head norm input", "K head norm input"}
    full = layer_saved_tensors(Q30, 1, replace(opts, recompute="full"), moe=True)
    assert [x.name for x in full] == ["layer input"]


# --- reading qwen3_moe's layouts ---

def test_mlp_only_layers_read_as_dense_first_layers_when_moe_config_can_say_it(tmp_path):
    cfg = read_hf_config(resolve_model_config("qwen3-30b-a3b"))
    model = load_hf_config(write_config(tmp_path, {**cfg, "mlp_only_layers": [0, 1]}))
    assert model.moe == MoeConfig(experts=E, top_k=K, expert_ffn=FE, dense_layers=2, renormalize=True)
    dense_block = block_params(model)  # Qwen3MoeMLP of intermediate_size on layers 0 and 1
    moe_block = dense_block - 3 * H * FD + H * E + E * 3 * H * FE
    assert model_params(model) == V * H + H + H * V + 2 * dense_block + 46 * moe_block
    step = load_hf_config(write_config(tmp_path, {**cfg, "decoder_sparse_step": 2, "mlp_only_layers": [1]}))
    # layers 3, 5, ...
    assert step.moe == MoeConfig(experts=E, top_k=K, expert_ffn=FE, dense_layers=2, every=2, renormalize=True)
    assert [layer for layer in range(6) if step.moe.is_moe_layer(layer)] == [3, 5]
    assert load_hf_config(write_config(tmp_path, {**cfg, "num_experts": 0})).moe is None  # Qwen3MoeMLP everywhere
    plain = load_hf_config(write_config(tmp_path, {k: v for k, v in cfg.items() if k != "norm_topk_prob"}))
    assert plain.moe.renormalize is False  # Qwen3MoeConfig's default: the k weights as the softmax gave them
    with pytest.raises(PipesimError, match="field 'norm_topk_prob' must be true or false, got 1"):
        load_hf_config(write_config(tmp_path, {**cfg, "norm_topk_prob": 1}))


@pytest.mark.parametrize("change,message", [
    ({"mlp_only_layers": [5]}, "field 'mlp_only_layers' [5]: pipesim places dense MLPs on the first layers only (then "
                               "every decoder_sparse_step-th layer has experts); these dense layers are not first"),
    ({"mlp_only_layers": "0"}, "field 'mlp_only_layers' must be a list of layer indices, got '0'"),
    ({"num_experts_per_tok": 200}, "field 'num_experts_per_tok' 200 is more than num_experts 128"),
    ({"decoder_sparse_step": 0}, "field 'decoder_sparse_step' must be a positive integer, got 0"),
    ({"head_dim": None}, "field 'head_dim' is missing"),
    ({"num_key_value_heads": None}, "field 'num_key_value_heads' is missing"),
    ({"attention_bias": True}, "field 'attention_bias' or 'mlp_bias' is true, but Qwen3's biases would sit on q, k, v "
                               "and o only (its MLP is built bias-free), which pipesim's biases (every linear) cannot "
                               "say"),
    ({"hidden_act": "gelu"}, "field 'hidden_act' 'gelu': a qwen3_moe MLP is gated whatever its activation "
                             "(down(act(gate x) * up x)); pipesim models the gated MLP with silu or swish only"),
    ({"n_shared_experts": 1}, "keys that change the model and pipesim does not model: n_shared_experts (mixture of "
                              "experts); refused rather than simulated as a different model"),
])
def test_what_qwen3_moe_cannot_be_is_refused_in_one_line(tmp_path, change, message):
    cfg = {k: v for k, v in {**read_hf_config(resolve_model_config("qwen3-30b-a3b")), **change}.items()
           if v is not None}
    path = write_config(tmp_path, cfg)
    assert config_refusal(path) == f"{path}: {message}"


def test_expert_keys_in_a_dense_qwen3_file_refuse(tmp_path):
    """Qwen3ForCausalLM's code has no experts: a qwen3 file that asks for them is not Qwen3 (read as dense it would
    be a model its author did not mean)."""
    path = write_config(tmp_path, {**QWEN3_8B, "num_experts": 8, "num_experts_per_tok": 2})
    assert config_refusal(path) == (f"{path}: keys that change the model and pipesim does not model: num_experts, "
                              "num_experts_per_tok (mixture of experts); refused rather than simulated as a different "
                              "model")


# --- ModelConfig's and the executor's refusals ---

@pytest.mark.parametrize("kwargs,message", [
    ({"head_width": 0}, "head_width must be a positive integer, got 0"),
    ({"head_width": True}, "head_width must be a positive integer, got True"),
    ({"head_width": 64.0}, "head_width must be a positive integer, got 64.0"),
    ({"qk_norm": "yes"}, "qk_norm must be true or false, got 'yes'"),
    ({"kind": "mlp", "qk_norm": True}, "qk_norm needs a transformer (--model gpt or --model-config)"),
    ({"kind": "mlp", "head_width": 32}, "head_width needs a transformer (--model gpt or --model-config)"),
    ({"head_width": 32, "norm": "rmsnorm", "dropout": False, "biases": False, "positions": "rope",
      "mla": LatentAttention(None, 32, 16, 8, 16)},
     "head_width with latent attention (mla): its heads' widths are mla's (qk_nope_dim, qk_rope_dim, v_head_dim)"),
    ({"hidden": 66}, "--hidden 66 must be divisible by --heads 4"),
])
def test_model_config_refuses_bad_head_fields_in_one_line(kwargs, message):
    with pytest.raises(PipesimError) as err:
        ModelConfig(**{"kind": "gpt", "hidden": 64, "heads": 4, **kwargs})
    assert str(err.value) == message


def test_a_head_width_frees_the_hidden_size_from_the_heads():
    model = ModelConfig(kind="gpt", hidden=66, heads=4, head_width=32)  # as Qwen3-4B's 2560 / 32 = 80 against 128
    assert (model.head_dim, model.attention_width, model.kv_width) == (32, 128, 128)


def test_the_executor_takes_qwen3_attention():
    """Heads of their own width and QK-norm are built (their training: tests/test_executor_structure.py)."""
    for kwargs in ({"head_width": 32}, {"qk_norm": True}, {"head_width": 32, "qk_norm": True}):
        model = ModelConfig(kind="gpt", hidden=64, heads=4, layers=2, batch=8, **kwargs)
        assert RunConfig(names=("1f1b",), microbatches=4, model=model).check(2)[0].name == "1f1b"


# --- end to end ---

def test_simulate_runs_qwen3_30b_a3b_with_expert_parallelism(tmp_path):
    out = tmp_path / "qwen3.json"
    assert main(["simulate", "1f1b", "-p", "4", "-m", "8", "--model-config", "qwen3-30b-a3b", "--seq", "4096",
                 "--batch", "64", "--dp", "8", "--ep", "8", "--hardware", "dgx-h100", "--nodes", "4",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {k: data["parallel"][k] for k in ("dp", "ep", "etp", "edp")} == {"dp": 8, "ep": 8, "etp": 1, "edp": 1}
    assert data["model_config"]["source"] == "qwen3-30b-a3b" and all(r["ep_all_to_all"] > 0 for r in data["ranks"])
