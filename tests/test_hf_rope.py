"""YaRN's attention factor (pipesim.model.hf_rope): transformers' rule by hand for each way a config.json gives it,
the keys report, and its one cost: Megatron-core's RoPE unfused where the factor is not 1."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import pytest

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.hf_config import hf_key_report, load_hf_config, resolve_model_config
from pipesim.model.hf_rope import yarn_attention_factor
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.options import LayerOptions


@pytest.mark.parametrize("params,factor", [
    (None, 1.0),
    ({"rope_type": "llama3", "factor": 8.0}, 1.0),  # another scaling: frequencies only
    ({"rope_type": "yarn", "factor": 32.0}, 0.1 * math.log(32) + 1),  # GPT-OSS: no mscale pair
    ({"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0}, 1.0),  # DeepSeek-V3
    ({"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 1.0},
     (0.1 * 0.707 * math.log(40) + 1) / (0.1 * math.log(40) + 1)),
    ({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.25}, 1.25),  # given outright
    ({"rope_type": "yarn", "factor": 0.5}, 1.0),  # no stretch: get_mscale is 1 at s <= 1
])
def test_transformers_rule_by_hand(params, factor):
    assert yarn_attention_factor({"rope_scaling": params}, "f") == pytest.approx(factor, rel=1e-12)
    assert yarn_attention_factor({"rope_parameters": params}, "f") == pytest.approx(factor, rel=1e-12)


def test_the_bundled_files():
    gpt_oss = load_hf_config("gpt-oss-20b", seq=4096)
    assert gpt_oss.rope_mscale == pytest.approx(0.1 * math.log(32) + 1)
    assert "rope_scaling" in hf_key_report("gpt-oss-20b").read
    for name in ("llama3.1-8b", "deepseek-v3", "kimi-k2", "qwen3-30b-a3b"):
        assert load_hf_config(name, seq=4096).rope_mscale == 1.0
    assert "rope_scaling" in hf_key_report("llama3.1-8b").ignored  # Llama 3's scaling: frequencies only


def test_the_factor_unfuses_rope_and_nothing_else():
    model = ModelConfig(kind="gpt", hidden=256, layers=2, heads=8, kv_heads=2, ffn_hidden=512, vocab=512, seq=128,
                        batch=4, dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                        positions="rope")
    opts = LayerOptions(attention="flash")
    qk = 128 * (256 + 2 * 32)  # b = 1: the tokens' Q (8 heads of 32) and K (2 heads)
    for phase in "FI":
        plain = {k.name: k for k in layer_kernels(model, 1, opts).phase(phase)}
        yarn = {k.name: k for k in layer_kernels(replace(model, rope_mscale=1.3), 1, opts).phase(phase)}
        suffix = "" if phase == "F" else " backward"
        assert plain.pop(f"RoPE on Q and K{suffix}").nbytes < yarn[f"RoPE on Q and K (unfused){suffix}"].nbytes
        assert yarn.pop(f"RoPE on Q and K (unfused){suffix}").nbytes == 9 * qk * 2
        assert yarn == plain


@pytest.mark.parametrize("params,message", [
    ("yarn", "field 'rope_scaling' must be an object, got 'yarn'"),
    ({"rope_type": "yarn"}, "field 'rope_scaling' names YaRN without its 'factor'"),
    ({"rope_type": "yarn", "factor": -2}, "field 'rope_scaling''s 'factor' must be a positive number, got -2"),
])
def test_bad_values_are_refused(tmp_path, params, message):
    cfg = json.loads(resolve_model_config("llama3.1-8b").read_text())
    cfg["rope_scaling"] = params
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(PipesimError) as err:
        load_hf_config(path)
    assert str(err.value) == f"{path}: {message}"  # the file named once


def test_only_standard_rotary_attention_takes_it():
    with pytest.raises(PipesimError, match=re.escape("rope_mscale 1.3 (YaRN's attention factor) scales rotary "
                                                     "embeddings of standard attention; this model has learned "
                                                     "positions")):
        ModelConfig(kind="gpt", positions="learned", rope_mscale=1.3)
    with pytest.raises(PipesimError, match="rope_mscale must be a positive finite number, got 0"):
        ModelConfig(kind="gpt", positions="rope", rope_mscale=0)
