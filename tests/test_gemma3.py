"""Gemma 3's language model (pipesim.model.hf_gemma, gemma_layer): the bundled files read as transformers builds them,
their exact parameter counts written out from the modules' shapes, the "gemma3" wrapper read as its text_config with
Gemma3TextConfig's defaults, transformers 5's per-type RoPE, what is refused, and what the post-norms, GeGLU and the
embedding scale cost."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from executor.transformer import attention_core
from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.model.activations import layer_saved_tensors
from pipesim.model.config import ModelConfig
from pipesim.model.elementwise import layer_elementwise_bytes
from pipesim.model.flops import layer_flops
from pipesim.model.hf_config import hf_key_report, load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.layer_kinds import stage_layers
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import block_params, model_params
from pipesim.model.piece_kernels import embedding_kernels
from pipesim.model.rotary import Rotary

# (hidden, intermediate, layers, heads, kv heads, head_dim, vocabulary, window) of the four text models
SHAPES = {"gemma3-1b": (1152, 6912, 26, 4, 1, 256, 262_144, 512),
          "gemma3-4b": (2560, 10240, 34, 8, 4, 256, 262_208, 1024),
          "gemma3-12b": (3840, 15360, 48, 16, 8, 256, 262_208, 1024),
          "gemma3-27b": (5376, 21504, 62, 32, 16, 128, 262_208, 1024)}
# Gemma Team, "Gemma 3 Technical Report" (arXiv:2503.19786), Table 1: non-embedding parameters, in millions (the
# vision encoder apart, as pipesim leaves it out)
REPORT_NON_EMBEDDING = {"gemma3-1b": 698, "gemma3-4b": 3209, "gemma3-12b": 10759, "gemma3-27b": 25600}


def _params(h: int, f: int, layers: int, heads: int, kv: int, d: int, vocab: int) -> int:
    """q, k, v, o (bias-free), gate, up, down, four RMSNorms of h and two of head_dim a layer; the tied embedding and
    the final norm."""
    layer = h * (heads + 2 * kv) * d + heads * d * h + 3 * h * f + 4 * h + 2 * d
    return layers * layer + vocab * h + h


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_bundled_files_are_read_as_transformers_builds_them(name):
    h, f, layers, heads, kv, d, vocab, window = SHAPES[name]
    model = load_hf_config(name, seq=8192)
    assert (model.hidden, model.ffn_size, model.layers, model.heads, model.num_kv_heads, model.head_dim,
            model.vocab) == (h, f, layers, heads, kv, d, vocab)
    assert (model.activation, model.norm, model.qk_norm, model.post_norms, model.embedding_scale,
            model.tied_embeddings, model.biases, model.dropout) == ("geglu", "rmsnorm", True, True, True, True,
                                                                    False, False)
    assert (model.window.size, model.window.full_every) == (window, 6)  # 5 local layers to 1 global
    scaled = name != "gemma3-1b"  # the 4B and up stretch the global layers' RoPE 8 times
    assert model.rotary == Rotary(theta=1_000_000.0, scaling="linear" if scaled else "none",
                                  factor=8.0 if scaled else 1.0, window_theta=10_000.0)
    assert model_params(model) == _params(h, f, layers, heads, kv, d, vocab)
    assert round((model_params(model) - vocab * h) / 1e6) == REPORT_NON_EMBEDDING[name]  # less the tied embedding


def test_the_27b_count_written_out():
    assert model_params(load_hf_config("gemma3-27b")) == 27_009_346_304


def test_the_repositorys_wrapper_is_read_as_its_text_config_with_the_text_configs_defaults(tmp_path):
    """google/gemma-3-27b-pt's config.json gives text_config only what differs from Gemma3TextConfig's defaults (the
    vocabulary, the norms' epsilon, the RoPE bases, the window pattern and the tied head come from them)."""
    text = {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
            "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}
    wrapper = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
               "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
               "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3", "text_config": text,
               "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
               "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(wrapper))
    assert load_hf_config(path, seq=8192) == load_hf_config("gemma3-27b", seq=8192)
    report = hf_key_report(path)
    assert {"vision_config", "mm_tokens_per_image", "image_token_index"} <= set(report.ignored)
    assert "vocab_size" not in report.read  # a default, not the file's
    del wrapper["model_type"]  # the class alone names it
    path.write_text(json.dumps(wrapper))
    assert load_hf_config(path, seq=8192) == load_hf_config("gemma3-27b", seq=8192)


def test_transformers_5s_rope_parameters_per_layer_type_read_as_the_older_keys(tmp_path):
    cfg = read_hf_config(resolve_model_config("gemma3-4b"))
    for key in ("rope_theta", "rope_scaling", "rope_local_base_freq"):
        del cfg[key]
    cfg["rope_parameters"] = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert load_hf_config(path) == load_hf_config("gemma3-4b")
    cfg["rope_parameters"]["sliding_attention"] = {"rope_type": "linear", "factor": 2.0}
    path.write_text(json.dumps(cfg))
    with pytest.raises(PipesimError, match="scales the sliding layers' RoPE"):
        load_hf_config(path)


@pytest.mark.parametrize("change, message", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping \\(logit soft-capping\\)"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping \\(logit soft-capping\\)"),
    ({"use_bidirectional_attention": True}, "bidirectional attention"),
    ({"hidden_activation": "silu"}, "Gemma 3's MLP is a gated GeLU"),
    ({"attention_bias": True}, "biases would sit on q, k, v and o only"),
    ({"sliding_window_pattern": 0}, "'sliding_window_pattern' must be a positive integer"),
    ({"rope_local_base_freq": 0}, "the sliding layers' RoPE base must be a positive number"),
    ({"layer_types": ["sliding_attention", "full_attention"] * 13}, None),  # every other layer: read (below)
    ({"layer_types": ["full_attention"] + ["sliding_attention"] * 25}, "puts full attention on layers \\[0\\]"),
    ({"model_type": "gemma2"}, "'gemma2': pipesim models"),
])
def test_what_pipesim_cannot_say_is_refused_in_one_line(tmp_path, change, message):
    cfg = {**read_hf_config(resolve_model_config("gemma3-1b")), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    if message is None:
        assert load_hf_config(path).window.full_every == 2
        return
    with pytest.raises(PipesimError, match=message):
        load_hf_config(path)


def _small(**fields) -> ModelConfig:
    base = dict(kind="gpt", hidden=256, layers=6, heads=4, seq=512, vocab=1024, batch=8, dtype="bfloat16",
                kv_heads=2, head_width=128, ffn_hidden=1024, norm="rmsnorm", dropout=False, biases=False,
                positions="rope", activation="swiglu")
    return ModelConfig(**{**base, **fields})


def test_post_norms_add_a_norm_on_each_blocks_output_its_input_saved_and_its_weights():
    """Two RMSNorms more a layer on the (sp: scattered) residual stream: F 2, B 3 bytes per element and dtype byte,
    inside the layer's order (after the projection, after FC2), their inputs kept, h weights each."""
    plain, gemma = _small(), _small(post_norms=True)
    for sp, tp in ((False, 1), (True, 2)):
        opts = LayerOptions(attention="flash", tp=tp, sp=sp)
        n, d = 512 * 256 // tp if sp else 512 * 256, 2
        ew = layer_elementwise_bytes(gemma, 1, opts)
        assert {k: v for k, v in ew.forward.items() if "output" in k} == {"attention output RMSNorm": 2 * n * d,
                                                                          "MLP output RMSNorm": 2 * n * d}
        assert ew.backward_total - layer_elementwise_bytes(plain, 1, opts).backward_total == 2 * 3 * n * d
        names = [k.name for k in layer_kernels(gemma, 1, opts).F]  # the GEMMs first, then the elementwise ops in order
        assert names.index("attention output RMSNorm") < names.index("attention residual add") < names.index(
            "MLP RMSNorm") < names.index("GeGLU" if gemma.activation == "geglu" else "SwiGLU") < names.index(
            "MLP output RMSNorm") < names.index("MLP residual add")
        saved = {x.name: x.nbytes for x in layer_saved_tensors(gemma, 1, opts)}
        extra = set(saved) - {x.name for x in layer_saved_tensors(plain, 1, opts)}
        assert {name: saved[name] for name in extra} == {"attention output norm input": n * d,
                                                         "MLP output norm input": n * d}
        assert block_params(gemma, tp) - block_params(plain, tp) == 2 * 256
    assert layer_flops(gemma, 1, LayerOptions()) == layer_flops(plain, 1, LayerOptions())
    # Megatron-core's mlp checkpoint re-runs FC2's module, the post-norm inside it, and drops its input
    mlp = LayerOptions(attention="flash", recompute="selective", recompute_modules=("mlp",))
    assert "MLP output norm input" not in {x.name for x in layer_saved_tensors(gemma, 1, mlp)}
    assert "recompute MLP output RMSNorm" in layer_elementwise_bytes(gemma, 1, mlp).backward


def test_geglu_has_swiglus_matrices_and_bytes_and_the_embedding_scale_a_pass_each_way():
    """Megatron-core's fused bias_geglu (core_v0.15.3 fused_bias_geglu.py) reads gate and up and writes their product,
    as the fused SwiGLU: the same kernels, GEMMs and saved tensors under another name."""
    swiglu, geglu = _small(), _small(activation="geglu")
    opts = LayerOptions(attention="flash")
    for phase in "FIW":
        a, b = layer_kernels(swiglu, 1, opts).phase(phase), layer_kernels(geglu, 1, opts).phase(phase)
        assert [replace(k, name=k.name.replace("SwiGLU", "GeGLU")) for k in a] == list(b)
    assert model_params(geglu) == model_params(swiglu)
    assert layer_flops(geglu, 1, opts) == layer_flops(swiglu, 1, opts)
    scaled = replace(geglu, embedding_scale=True)
    for sp, tp in ((False, 1), (True, 2)):
        o = LayerOptions(tp=tp, sp=sp)
        n = 512 * 256 // tp if sp else 512 * 256
        plain_k, scaled_k = embedding_kernels(geglu, 1, o), embedding_kernels(scaled, 1, o)
        assert [k for k in scaled_k.F if k not in plain_k.F][0].nbytes == 2 * n * 2
        assert [k.name for k in scaled_k.W] == ["embedding scale backward", "embedding backward"]
        assert scaled_k.W[0].nbytes == 2 * n * 2
    with pytest.raises(PipesimError, match="GeGLU experts are not modelled"):
        _small(activation="geglu", moe={"experts": 4, "top_k": 2, "expert_ffn": 512})


def test_the_1b_has_four_global_layers_and_a_stage_counts_each_kind():
    """26 layers, full attention on layers 5, 11, 17 and 23 (transformers: (l + 1) % 6 == 0), the rest over 512 keys:
    the cost model's variant layers are the windowed ones."""
    model = load_hf_config("gemma3-1b", seq=4096)
    assert [layer for layer in range(26) if not model.window.windowed(layer)] == [5, 11, 17, 23]
    assert [(m.layers, m.variant_layers) for m in stage_layers(model, [13, 13])] == [(13, 11), (13, 11)]


def test_a_27b_step_simulates_and_plans_a_megatron_export_that_says_what_pretrain_gpt_lacks(capsys):
    common = ["--model-config", "gemma3-27b", "--seq", "8192", "--batch", "256", "--hardware", "dgx-h100",
              "--attention", "flash", "--zero", "1"]
    assert main(["simulate", "1f1b", "--nodes", "4", "--microbatch-size", "1", "--stages", "1", "--tp", "4",
                 "--sequence-parallel", "--dp", "8",
                 "--recompute", "selective", "--framework", "megatron-core", *common, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 0 < out["mfu"] < 1 and out["step_time"] > 0
    assert main(["plan", *common, "--gpus", "32", "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert "# pretrain_gpt.py has no flag for Gemma's GeGLU, post-norms, scaled embeddings" in text


def test_the_scores_scale_is_query_pre_attn_scalar_and_the_executor_builds_it():
    """The 27B scales its scores by 168 ** -0.5 over heads of 128 (transformers' Gemma3Attention.scaling): read as
    ModelConfig.softmax_scale (None where it is head_dim's, the other three), costing nothing, built by the
    executor's attention core."""
    big, small = load_hf_config("gemma3-27b"), load_hf_config("gemma3-1b")
    assert (big.softmax_scale, small.softmax_scale) == (168 ** -0.5, None)
    assert layer_flops(big, 1, LayerOptions()) == layer_flops(replace(big, softmax_scale=None), 1, LayerOptions())
    assert ModelConfig(**big.to_dict()) == big
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    kk, vv = (z.repeat_interleave(2, dim=1) for z in (k, v))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    for window, scale in ((None, 0.3), (3, 0.3), (None, None)):
        seen = causal if window is None else causal & ~torch.ones(6, 6, dtype=torch.bool).tril(-window)
        scores = (q @ kk.transpose(-2, -1)) * (8 ** -0.5 if scale is None else scale)
        expected = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1) @ vv
        torch.testing.assert_close(attention_core(q, k, v, window, None, scale), expected)
    with pytest.raises(PipesimError, match="softmax_scale must be a positive number"):
        replace(small, softmax_scale=0.0)
