"""A stage's layers counted by kind (pipesim.model.layer_kinds): the one place a layer's kind is decided and counted."""

from dataclasses import replace

import pytest

from pipesim.errors import PipesimError
from pipesim.model.attention_window import SlidingWindow
from pipesim.model.config import ModelConfig
from pipesim.model.hf_config import load_hf_config
from pipesim.model.layer_kinds import (
    DENSE,
    MOE,
    LayerKind,
    StageLayers,
    kind_options,
    layer_kind,
    stage_layers,
)
from pipesim.model.moe import MoeConfig
from pipesim.model.options import LayerOptions

WINDOW = LayerKind(variant=True)
MOE_WINDOW = LayerKind(moe=True, variant=True)
# 8 layers: experts on every other layer after the first dense one (1, 3, 5, 7), a 64-key window on all but every
# third layer (2 and 5 full)
MIXED = ModelConfig(kind="gpt", hidden=64, layers=8, heads=4, seq=256, vocab=128, batch=4, dtype="bfloat16",
                    kv_heads=2, activation="swiglu", norm="rmsnorm", dropout=False, biases=False, positions="rope",
                    moe=MoeConfig(experts=4, top_k=2, expert_ffn=32, dense_layers=1, every=2),
                    window=SlidingWindow(64, 3))


def test_each_layer_has_the_kind_its_placements_give():
    kinds = [layer_kind(MIXED, layer) for layer in range(MIXED.layers)]
    assert kinds == [WINDOW, MOE_WINDOW, DENSE, MOE_WINDOW, WINDOW, MOE, WINDOW, MOE_WINDOW]


def test_a_stage_counts_its_layers_by_kind_in_one_canonical_order():
    assert StageLayers.of(MIXED, 0, 4) == StageLayers(((MOE_WINDOW, 2), (DENSE, 1), (WINDOW, 1)))
    assert StageLayers.of(MIXED, 0, 4).counts == ((DENSE, 1), (WINDOW, 1), (MOE_WINDOW, 2))
    assert StageLayers(((DENSE, 1), (MOE, 0), (DENSE, 2))).counts == ((DENSE, 3),)  # merged, zeros dropped
    mix = StageLayers.of(MIXED, 4, 4)
    assert (mix.layers, mix.moe_layers, mix.variant_layers) == (4, 2, 3)
    assert StageLayers.uniform(5, 2) == StageLayers(((DENSE, 3), (MOE, 2)))
    assert StageLayers() == StageLayers.uniform(0) and StageLayers().layers == 0


def test_the_stages_of_a_split_add_up_to_the_model():
    split = [3, 2, 3]
    mixes = stage_layers(MIXED, split)
    assert [m.layers for m in mixes] == split
    whole = StageLayers()
    for mix in mixes:
        whole = whole.plus(mix)
    assert whole == StageLayers.of(MIXED, 0, MIXED.layers)
    assert whole.minus(mixes[0]).minus(mixes[1]) == mixes[2]


def test_a_bundled_model_counts_its_experts_and_windows():
    """GPT-OSS 120B: 36 layers, every one with experts, every other one windowed over 128 keys."""
    model = load_hf_config("gpt-oss-120b", seq=4096)
    assert stage_layers(model, [18, 18]) == [StageLayers(((MOE, 9), (MOE_WINDOW, 9)))] * 2


def test_a_variant_layer_is_costed_under_its_own_options():
    opts = LayerOptions(attention="flash")
    assert kind_options(MIXED, opts, MOE) is opts
    assert kind_options(MIXED, opts, MOE_WINDOW) == replace(opts, window=64)
    nope = replace(MIXED, window=None, nope_every=4)
    assert kind_options(nope, opts, WINDOW) == replace(opts, nope=True)


def test_counts_that_do_not_fit_are_refused_in_one_line():
    with pytest.raises(PipesimError, match="3 MoE layers among 2 layers"):
        StageLayers.uniform(2, 3)
    with pytest.raises(PipesimError, match="LayerKind, count >= 0"):
        StageLayers(((DENSE, -1),))
    with pytest.raises(PipesimError, match="are not among this stage's"):
        StageLayers.uniform(2).minus(StageLayers.uniform(1, 1))
