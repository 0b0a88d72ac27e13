"""Hugging Face config.json: the bundled Llama 3 configs, every field's errors, and ModelConfig's compatibility."""

from __future__ import annotations

import json

import pytest

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.hf_config import bundled_configs, load_hf_config
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
])
def test_bundled_llama3_configs(name, layers, hidden, heads, ffn, max_seq, params):
    model = load_hf_config(name)
    assert (model.layers, model.hidden, model.heads, model.num_kv_heads, model.ffn_size, model.vocab, model.seq) == \
        (layers, hidden, heads, 8, ffn, 128256, max_seq)
    assert (model.activation, model.norm, model.dropout, model.biases, model.positions, model.tied_embeddings,
            model.dtype) == ("swiglu", "rmsnorm", False, False, "rope", False, "bfloat16")
    assert model_params(model) == params  # the parameter counts Meta publishes with the weights


def test_bundled_names_and_overrides():
    assert bundled_configs() == ["llama3-405b", "llama3-70b", "llama3-8b"]
    model = load_hf_config("llama3-8b", seq=4096, batch=512, dtype="float32")
    assert (model.seq, model.batch, model.dtype) == (4096, 512, "float32")


def test_a_config_file_round_trips_through_to_dict(tmp_path):
    model = load_hf_config(_write(tmp_path, LLAMA))
    assert model == ModelConfig(kind="gpt", hidden=64, layers=2, heads=4, seq=128, vocab=500, dtype="bfloat16",
                                kv_heads=2, ffn_hidden=172, activation="swiglu", norm="rmsnorm", dropout=False,
                                biases=False, positions="rope")
    assert ModelConfig(**model.to_dict()) == model


def test_gelu_layernorm_tied_and_defaults(tmp_path):
    cfg = {k: v for k, v in LLAMA.items() if k not in ("num_key_value_heads", "rms_norm_eps", "torch_dtype")}
    model = load_hf_config(_write(tmp_path, {**cfg, "hidden_act": "gelu", "tie_word_embeddings": True,
                                             "attention_dropout": 0.1, "mlp_bias": True}))
    assert (model.num_kv_heads, model.activation, model.norm, model.tied_embeddings, model.dropout, model.biases,
            model.dtype) == (4, "gelu", "layernorm", True, True, True, "bfloat16")


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
                             "gelu_pytorch_tanh, gelu_fast"),
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
                              "(bundled: llama3-405b, llama3-70b, llama3-8b)")
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
                        ({"activation": "relu"}, "unknown activation 'relu'; choose gelu or swiglu"),
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
