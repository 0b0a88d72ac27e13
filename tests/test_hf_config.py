"""Hugging Face config.json: the bundled Llama 3 configs, every field's errors, and ModelConfig's compatibility."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from pipesim.cli import main
from pipesim.commands.common import add_model_args, add_transformer_args, model_config
from pipesim.errors import PipesimError
from pipesim.model.attention_window import SlidingWindow
from pipesim.model.config import ModelConfig
from pipesim.model.hf_config import bundled_configs, hf_key_report, load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.param_counts import model_params

LLAMA = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 172, "vocab_size": 500, "max_position_embeddings": 128, "hidden_act": "silu",
         "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "model_type": "llama"}


def _write(tmp_path, cfg) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
    return str(path)


@pytest.mark.parametrize("name,layers,hidden,heads,ffn,max_seq,params", [
    ("llama3-8b", 32, 4096, 32, 14336, 8192, 8_030_261_248),
    ("llama3-70b", 80, 8192, 64, 28672, 8192, 70_553_706_496),
    ("llama3-405b", 126, 16384, 128, 53248, 131072, 405_853_388_800),
    ("llama3.1-8b", 32, 4096, 32, 14336, 131072, 8_030_261_248),  # Llama 3's shapes, 128k positions
    ("llama3.1-70b", 80, 8192, 64, 28672, 131072, 70_553_706_496),
])
def test_bundled_llama3_configs(name, layers, hidden, heads, ffn, max_seq, params):
    model = load_hf_config(name)
    assert (model.layers, model.hidden, model.heads, model.num_kv_heads, model.ffn_size, model.vocab, model.seq) == \
        (layers, hidden, heads, 8, ffn, 128256, max_seq)
    assert (model.activation, model.norm, model.dropout, model.biases, model.positions, model.tied_embeddings,
            model.dtype) == ("swiglu", "rmsnorm", False, False, "rope", False, "bfloat16")
    assert model_params(model) == params  # the parameter counts Meta publishes with the weights


def test_bundled_names_and_overrides():
    assert bundled_configs() == ["deepseek-v3", "gemma3-12b", "gemma3-1b", "gemma3-27b", "gemma3-4b", "gpt-oss-120b",
                                 "gpt-oss-20b", "kimi-k2", "llama3-405b",
                                 "llama3-70b", "llama3-8b", "llama3.1-70b", "llama3.1-8b",
                                 "llama4-maverick-17b-128e", "llama4-scout-17b-16e", "mixtral-8x22b",
                                 "mixtral-8x7b", "nemotron-3-nano-30b-a3b", "nemotron-h-56b", "nemotron-h-8b",
                                 "nemotron4-15b", "nemotron4-340b", "qwen1.5-moe-a2.7b",
                                 "qwen2-57b-a14b", "qwen3-235b-a22b", "qwen3-30b-a3b", "qwen3-next-80b-a3b"]
    model = load_hf_config("llama3-8b", seq=4096, batch=512, dtype="float32")
    assert (model.seq, model.batch, model.dtype) == (4096, 512, "float32")


def test_expert_flags_override_a_moe_config_and_are_refused_on_a_dense_one(capsys):
    """Megatron's expert flags beside --model-config: over a mixture of experts' own fields, exactly; on a dense
    model refused in one line (before, ignored: the dense model was simulated)."""
    def model(*flags: str) -> ModelConfig:
        parser = argparse.ArgumentParser()
        add_model_args(parser)
        add_transformer_args(parser)
        return model_config(parser.parse_args(["--model-config", "qwen3-30b-a3b", *flags]))

    base = model().moe
    assert (base.experts, base.top_k, base.expert_ffn, base.shared_experts) == (128, 8, 768, 0)
    over = model("--num-experts", "64", "--moe-router-topk", "4", "--moe-ffn-hidden-size", "1536",
                 "--moe-shared-expert-intermediate-size", "2048").moe
    assert over == replace(base, experts=64, top_k=4, expert_ffn=1536, shared_experts=1, shared_ffn=2048)
    argv = ["simulate", "1f1b", "--model-config", "llama3.1-8b", "--seq", "4096", "--batch", "8", "--stages", "1",
            "--hardware", "dgx-h100", "--num-experts", "8"]
    assert main(argv) == 2
    assert capsys.readouterr().err == ("pipesim: error: --num-experts: --model-config llama3.1-8b is a dense model "
                                       "(give a mixture-of-experts config, or --model moe)\n")
    for kind in ("mlp", "moe"):  # the file says what the model is
        assert main([*argv[:-2], "--model", kind]) == 2
        assert capsys.readouterr().err == (f"pipesim: error: --model-config describes the model, experts or not; "
                                           f"drop --model {kind}\n")


def test_a_config_file_round_trips_through_to_dict(tmp_path):
    model = load_hf_config(_write(tmp_path, LLAMA))
    assert model == ModelConfig(kind="gpt", hidden=64, layers=2, heads=4, seq=128, vocab=500, dtype="bfloat16",
                                kv_heads=2, ffn_hidden=172, activation="swiglu", norm="rmsnorm", dropout=False,
                                biases=False, positions="rope")
    assert ModelConfig(**model.to_dict()) == model


def test_gelu_layernorm_tied_and_defaults(tmp_path):
    """A file without a model_type: a GeLU MLP is the two-matrix one. In a llama file the MLP is gated whatever
    hidden_act says (transformers' LlamaMLP), which pipesim models with silu only: refused."""
    cfg = {k: v for k, v in LLAMA.items() if k not in ("num_key_value_heads", "rms_norm_eps", "torch_dtype",
                                                       "model_type")}
    model = load_hf_config(_write(tmp_path, {**cfg, "hidden_act": "gelu", "tie_word_embeddings": True,
                                             "attention_dropout": 0.1, "mlp_bias": True}))
    assert (model.num_kv_heads, model.activation, model.norm, model.tied_embeddings, model.dropout, model.biases,
            model.dtype) == (4, "gelu", "layernorm", True, True, True, "bfloat16")
    path = _write(tmp_path, {**LLAMA, "hidden_act": "gelu"})
    with pytest.raises(PipesimError) as err:
        load_hf_config(path)
    assert str(err.value) == (f"{path}: field 'hidden_act' 'gelu': a llama MLP is gated whatever its activation "
                              "(down(act(gate x) * up x)); pipesim models the gated MLP with silu or swish only")
    olmo2 = _write(tmp_path, {**LLAMA, "model_type": "olmo2"})  # QK-norm over the whole width, norms after blocks
    with pytest.raises(PipesimError, match=r"model_type \('olmo2': pipesim models llama, mistral, mixtral, "
                                           r"deepseek_v3, qwen2, qwen3, qwen3_moe, qwen2_moe, nemotron, gpt_oss, "
                                           r"glm4_moe, llama4_text, gemma3_text, nemotron_h, qwen3_next, kimi_k2, "
                                           r"deepseek_v2, "
                                           r"llama4, "
                                           r"gemma3\)"):
        load_hf_config(olmo2)


# Qwen2-72B's config.json (Qwen/Qwen2-72B on the Hugging Face hub, transformers 4.40.1): Qwen2ForCausalLM
QWEN2_72B = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
             "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 8192, "initializer_range": 0.02,
             "intermediate_size": 29568, "max_position_embeddings": 131072, "max_window_layers": 80,
             "model_type": "qwen2", "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
             "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
             "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True,
             "use_sliding_window": False, "vocab_size": 152064}


def test_a_qwen2_file_is_llamas_layer_with_biases_on_q_k_and_v_alone(tmp_path):
    """Qwen2Attention builds q_proj, k_proj and v_proj with biases, o_proj and the MLP without: ModelConfig.qkv_bias,
    Megatron's --add-qkv-bias. The count, written out from those modules' shapes: per layer QKV 8192 x (8192 + 2 x
    1024) and its bias, o_proj 8192 x 8192, gate, up and down 3 x 8192 x 29568, two RMSNorms; an untied embedding and
    head of 152,064 x 8192 and the final norm (the model card's 72.7B)."""
    model = load_hf_config(_write(tmp_path, QWEN2_72B), seq=4096)
    assert (model.qkv_bias, model.biases, model.activation, model.norm, model.num_kv_heads, model.positions) == (
        True, False, "swiglu", "rmsnorm", 8, "rope")
    layer = 8192 * 10240 + 10240 + 8192 * 8192 + 3 * 8192 * 29568 + 2 * 8192
    assert model_params(model) == 80 * layer + 2 * 152064 * 8192 + 8192 == 72_706_203_648
    assert model_params(replace(model, qkv_bias=False)) == model_params(model) - 80 * 10240
    path = _write(tmp_path, {**QWEN2_72B, "attention_bias": True})
    with pytest.raises(PipesimError) as err:
        load_hf_config(path, seq=4096)
    assert str(err.value) == (f"{path}: field 'attention_bias' or 'mlp_bias' is true, but a qwen2 layer's biases sit "
                              "on q, k and v alone (Qwen2Attention builds them whatever the file says), o_proj and the "
                              "MLP are bias-free")
    path = _write(tmp_path, {**QWEN2_72B, "use_sliding_window": True, "sliding_window": 4096})
    with pytest.raises(PipesimError, match="sliding_window, use_sliding_window \\(sliding-window attention\\)"):
        load_hf_config(path, seq=8192)


@pytest.mark.parametrize("change,message", [
    ({"num_hidden_layers": None}, "field 'num_hidden_layers' is missing"),
    ({"vocab_size": None}, "field 'vocab_size' is missing"),
    ({"hidden_size": -64}, "field 'hidden_size' must be a positive integer, got -64"),
    ({"intermediate_size": "172"}, "field 'intermediate_size' must be a positive integer, got '172'"),
    ({"num_key_value_heads": True}, "field 'num_key_value_heads' must be a positive integer, got True"),
    ({"num_key_value_heads": 3}, "field 'num_key_value_heads' 3 does not divide num_attention_heads 4"),
    ({"num_attention_heads": 5}, "field 'num_attention_heads' 5 does not divide hidden_size 64"),
    ({"torch_dtype": "float32", "max_position_embeddings": 64, "vocab_size": 0},
     "field 'vocab_size' must be a positive integer, got 0"),
    ({"hidden_act": "relu"}, "field 'hidden_act' 'relu' is not supported; choose one of silu, swish, gelu, gelu_new, "
                             "gelu_pytorch_tanh, gelu_fast, relu2"),
    ({"tie_word_embeddings": "no"}, "field 'tie_word_embeddings' must be true or false, got 'no'"),
    ({"head_dim": 8}, "field 'head_dim' 8 is not hidden_size / num_attention_heads (64 / 4); pipesim needs them equal"),
    ({"attention_dropout": 2}, "field 'attention_dropout' must be a number in [0, 1), got 2"),
])
def test_a_bad_field_is_one_line_naming_field_and_file(tmp_path, change, message):
    cfg = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    path = _write(tmp_path, cfg)
    with pytest.raises(PipesimError) as err:
        load_hf_config(path)
    assert str(err.value) == f"{path}: {message}"


def test_unreadable_files_and_unknown_names(tmp_path):
    with pytest.raises(PipesimError, match=r"config.json: not valid JSON \(Expecting value at line 1 column 1\)$"):
        load_hf_config(_write(tmp_path, "nope"))
    with pytest.raises(PipesimError, match=r"config.json: expected a JSON object, got list$"):
        load_hf_config(_write(tmp_path, "[1]"))
    with pytest.raises(PipesimError) as err:
        load_hf_config("llama9-1t")
    assert str(err.value) == ("--model-config llama9-1t: no such file or bundled config "
                              "(bundled: deepseek-v3, gemma3-12b, gemma3-1b, gemma3-27b, gemma3-4b, gpt-oss-120b, "
                              "gpt-oss-20b, kimi-k2, llama3-405b, llama3-70b, "
                              "llama3-8b, llama3.1-70b, llama3.1-8b, llama4-maverick-17b-128e, llama4-scout-17b-16e, "
                              "mixtral-8x22b, mixtral-8x7b, nemotron-3-nano-30b-a3b, nemotron-h-56b, nemotron-h-8b, "
                              "nemotron4-15b, "
                              "nemotron4-340b, qwen1.5-moe-a2.7b, qwen2-57b-a14b, qwen3-235b-a22b, "
                              "qwen3-30b-a3b, qwen3-next-80b-a3b)")
    with pytest.raises(PipesimError, match="is longer than .*'s max_position_embeddings 8192$"):
        load_hf_config("llama3-8b", seq=8193)


def test_model_config_stays_as_it_was_for_mlp_and_gpt():
    """The new fields' defaults are today's GPT; to_dict (timelines, sweep JSON) leaves them out."""
    for kind in ("mlp", "gpt"):
        assert list(ModelConfig(kind=kind).to_dict()) == ["kind", "hidden", "layers", "heads", "seq", "vocab",
                                                          "batch", "dtype", "seed"]
    gpt = ModelConfig(kind="gpt")
    assert (gpt.num_kv_heads, gpt.ffn_size, gpt.head_dim) == (8, 4096, 128)
    assert ModelConfig(kind="gpt", kv_heads=2).to_dict()["kv_heads"] == 2
    for kw, message in (({"kind": "llama"}, "unknown --model 'llama'; choose mlp or gpt"),
                        ({"activation": "relu"}, "unknown activation 'relu'; choose gelu or swiglu or relu2 or geglu"),
                        ({"ffn_hidden": 0}, "--ffn-hidden must be a positive integer, got 0")):
        with pytest.raises(PipesimError) as err:
            ModelConfig(**kw)
        assert str(err.value) == message


def test_microbatches_from_either_spelling():
    model = ModelConfig(batch=64)
    assert model.microbatches_for(2, microbatch_size=4) == 8 == model.microbatches_for(2, microbatches=8)
    assert model.microbatches_for(2, microbatches=8, microbatch_size=4) == 8
    for kw, message in (
            ({"microbatches": 8, "microbatch_size": 2}, "--microbatches 8 and --microbatch-size 2 disagree: dp(2) x 8 "
                                                        "x 2 = 32, not --batch 64"),
            ({"microbatch_size": 3}, "--batch 64 does not split into dp(2) x microbatches of --microbatch-size 3"),
            ({"microbatches": 3}, "--batch 64 does not split into dp(2) x 3 microbatches evenly"),
            ({"microbatch_size": 0}, "--microbatch-size must be a positive integer, got 0"),
            ({}, "give --microbatches or --microbatch-size")):
        with pytest.raises(PipesimError) as err:
            model.microbatches_for(2, **kw)
        assert str(err.value) == message


# -- keys pipesim does not model: refused, never simulated as a different (dense) model ------------------------

# mistralai/Mixtral-8x7B-v0.1's config.json (Hugging Face hub), every key as published (bundled as mixtral-8x7b)
MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
                "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
                "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
                "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
                "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
                "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000}


def test_mixtral_loads_and_a_mixture_of_experts_with_an_unmodelled_key_is_refused_naming_its_keys(tmp_path):
    """Mixtral's experts are read into ModelConfig.moe (tests/test_moe_config.py); in a deepseek_v3 file Mixtral's
    expert keys are not DeepSeek's (its code would drop them): the file is refused, never simulated as another model.
    DeepSeek-V3 itself loads (tests/test_deepseek_v3.py)."""
    model = load_hf_config(_write(tmp_path, MIXTRAL_8X7B))
    assert model == load_hf_config("mixtral-8x7b") and model.moe.experts == 8 and model.moe.top_k == 2
    path = _write(tmp_path, {**MIXTRAL_8X7B, "model_type": "deepseek_v3", "q_lora_rank": 1536,
                             "n_shared_experts": 1})
    with pytest.raises(PipesimError) as err:
        load_hf_config(path)
    assert str(err.value) == (
        f"{path}: keys that change the model and pipesim does not model: num_local_experts, router_aux_loss_coef "
        "(mixture of experts); refused rather than simulated as a different model")


def test_latent_attention_multi_token_prediction_and_unknown_keys_are_refused(tmp_path):
    cfg = {**LLAMA, "q_lora_rank": 1536, "kv_lora_rank": 512, "num_nextn_predict_layers": 1, "qk_norm": True}
    path = _write(tmp_path, cfg)
    with pytest.raises(PipesimError) as err:
        load_hf_config(path)
    assert str(err.value) == (
        f"{path}: keys that change the model and pipesim does not model: q_lora_rank, kv_lora_rank (multi-head "
        "latent attention); num_nextn_predict_layers (multi-token prediction); qk_norm (unknown to pipesim); "
        "refused rather than simulated as a different model")


def test_switched_off_keys_and_a_window_as_long_as_the_sequence_change_nothing(tmp_path):
    """Mistral 7B v0.1 attends in a 4096-token window on every layer (MistralAttention): read, it windows a longer
    sequence and at --seq 4096 is the whole causal mask. Experts at 0 and a null window are off; in a file whose type
    has no window (llama) `use_sliding_window: false` (Qwen2's key) leaves any window off."""
    mistral = {**LLAMA, "model_type": "mistral", "max_position_embeddings": 32768, "sliding_window": 4096}
    path = _write(tmp_path, mistral)
    model = load_hf_config(path)
    assert (model.window, model.window_size, model.windowed_layers(0, model.layers)) == \
        (SlidingWindow(4096), 4096, model.layers)
    assert load_hf_config(path, seq=4096).window_size is None
    assert "sliding_window" in hf_key_report(path, seq=4096).read
    off = {**LLAMA, "num_experts": 0, "sliding_window": None, "hidden_dropout": 0.0, "model_type": "llama",
           "use_sliding_window": False, "max_window_layers": 28}
    assert load_hf_config(_write(tmp_path, {**off, "sliding_window": 64})) == load_hf_config(_write(tmp_path, LLAMA))
    report = hf_key_report(_write(tmp_path, off))
    assert report.ignored == ("num_experts", "sliding_window", "hidden_dropout", "use_sliding_window",
                              "max_window_layers")
    assert report.read == tuple(LLAMA)  # every key of the Llama-style file is read
    with pytest.raises(PipesimError, match=r"sliding_window \(sliding-window attention\); refused"):
        load_hf_config(_write(tmp_path, {**off, "sliding_window": 64, "use_sliding_window": True}))


def test_bundled_llama_configs_read_every_key_or_ignore_it_as_no_effect():
    report = hf_key_report("llama3-8b")
    assert report.ignored == ("_name_or_path", "architectures", "bos_token_id", "eos_token_id", "initializer_range",
                              "pretraining_tp", "rope_scaling", "rope_theta", "use_cache")
    assert set(report.read) | set(report.ignored) == set(read_hf_config(resolve_model_config("llama3-8b")))


def test_the_cli_refuses_an_unmodelled_moe_in_one_line_and_lists_ignored_keys_in_json(tmp_path, capsys):
    path = _write(tmp_path, {**MIXTRAL_8X7B, "n_shared_experts": 2})
    code = main(["simulate", "1f1b", "-p", "4", "-m", "8", "--tp", "2", "--model-config", path,
                 "--hardware", "dgx-h100", "--json", str(tmp_path / "out.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "n_shared_experts" in err and "Traceback" not in err
    assert not (tmp_path / "out.json").exists()
    assert main(["simulate", "1f1b", "-p", "2", "-m", "2", "--model-config", "llama3-8b", "--seq", "1024",
                 "--layers", "4", "--hardware", "dgx-h100", "--json", str(tmp_path / "ok.json")]) == 0
    keys = json.loads((tmp_path / "ok.json").read_text())["model_config"]
    assert keys["source"] == "llama3-8b" and keys["ignored"] == list(hf_key_report("llama3-8b").ignored)


def test_a_file_without_model_type_is_read_as_its_class_and_long_integers_are_refused(tmp_path):
    """A qwen2 file that lost its model_type but names Qwen2ForCausalLM keeps its q/k/v biases (it was read as a
    bias-free Llama); a class pipesim does not model is refused; a 5,000-digit integer is one line, not ValueError."""
    cfg = {k: v for k, v in QWEN2_72B.items() if k != "model_type"}
    assert load_hf_config(_write(tmp_path, cfg), seq=4096).qkv_bias is True
    path = _write(tmp_path, {**cfg, "architectures": ["Olmo2ForCausalLM"]})
    with pytest.raises(PipesimError, match=r"model_type \('Olmo2ForCausalLM': pipesim models llama"):
        load_hf_config(path, seq=4096)
    path = _write(tmp_path, json.dumps(QWEN2_72B).replace('"vocab_size": 152064', '"vocab_size": ' + "9" * 5000))
    with pytest.raises(PipesimError) as err:
        load_hf_config(path, seq=4096)
    assert str(err.value).startswith(f"{path}: cannot read (Exceeds the limit")
    path = _write(tmp_path, "[" * 100_000 + "]" * 100_000)  # deeper than Python's parser goes (pipesim.errors)
    with pytest.raises(PipesimError) as err:
        load_hf_config(path, seq=4096)
    assert str(err.value) == f"{path}: cannot read (its JSON nests deeper than Python's parser goes)"
