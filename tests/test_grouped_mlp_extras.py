"""Megatron-core's grouped experts beside their fused activation (pipesim.model.grouped_mlp_extras): a clamped GLU
input (GPT-OSS's swiglu_limit) and a probability-weighted FC2 bias, counted by hand: kernels and bytes per phase and
their order, recomputation, saved tensors, the host's launches, and the refusals."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.model.activations import layer_saved_tensors
from pipesim.model.config import ModelConfig
from pipesim.model.executor_scope import unbuilt_structure
from pipesim.model.grouped_mlp_extras import BIAS, CLAMP
from pipesim.model.hf_config import load_hf_config, resolve_model_config
from pipesim.model.host_ops import moe_layer_host_ops
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.moe import MoeConfig
from pipesim.model.options import LayerOptions

H, FE, E, K, S, EP = 256, 128, 8, 2, 128, 2  # hidden, expert width, experts, top-k, seq, expert parallelism
D = 2  # bfloat16
LOCAL = E // EP
PLAIN = ModelConfig(kind="gpt", hidden=H, layers=4, heads=8, kv_heads=2, ffn_hidden=512, vocab=512, seq=S, batch=8,
                    dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                    positions="rope", moe=MoeConfig(E, K, FE))
CLAMPED = replace(PLAIN, moe=replace(PLAIN.moe, glu_clamp=7.0))
BIASED = replace(PLAIN, biases=True)
BOTH = replace(CLAMPED, biases=True)
ROUTED = S * K  # b = 1, balanced: this rank's experts compute as many pairs as its tokens make
OPTS = LayerOptions(attention="flash", ep=EP)
ACT = replace(OPTS, recompute="selective", recompute_modules=("moe_act",))


def _names(model, opts, phase):
    return [k.name for k in layer_kernels(model, 1, opts, moe=True).phase(phase)]


def _bytes(model, opts, phase):
    return {k.name: k.nbytes for k in layer_kernels(model, 1, opts, moe=True).phase(phase) if hasattr(k, "nbytes")}


def test_each_extra_adds_exactly_its_kernels():
    for model, added in ((CLAMPED, {"F": {CLAMP: 8 * ROUTED * FE * D},
                                    "I": {f"{CLAMP} backward": 10 * ROUTED * FE * D}, "W": {}}),
                         (BIASED, {"F": {BIAS: 6 * ROUTED * H * D}, "I": {f"{BIAS} backward": 5 * ROUTED * H * D},
                                   "W": {f"{BIAS} gradient": 3 * ROUTED * H * D}})):
        for phase in "FIW":
            plain = _bytes(replace(model, moe=PLAIN.moe, biases=False), OPTS, phase)
            extra = _bytes(model, OPTS, phase)
            # biases also add the dense layer's own bias kernels: compare the experts' part only
            extra = {n: b for n, b in extra.items() if n not in plain and (CLAMP in n or BIAS in n)}
            assert extra == added[phase]


def test_where_they_run():
    """The clamp between FC1 and the activation, its backward after the activation's; the bias after FC2, its
    backward before FC2's dgrad (after the unsort), its gradient with the weight gradients."""
    f, i, w = (_names(BOTH, OPTS, p) for p in "FIW")
    assert f[f.index("expert FC1") + 1: f.index("expert FC1") + 3] == [CLAMP, "expert SwiGLU"]
    assert f[f.index("expert FC2") + 1: f.index("expert FC2") + 3] == [BIAS, "token unsort by local expert"]
    assert i[i.index("token unsort backward") + 1: i.index("token unsort backward") + 3] == \
        [f"{BIAS} backward", "expert FC2 dgrad"]
    assert i[i.index("expert SwiGLU backward") + 1: i.index("expert SwiGLU backward") + 3] == \
        [f"{CLAMP} backward", "expert FC1 dgrad"]
    assert f"{BIAS} gradient" in w


def test_moe_act_reruns_the_clamp_not_the_bias():
    assert _names(BOTH, OPTS, "I").count(CLAMP) == 0
    rerun = _names(BOTH, ACT, "I")
    assert rerun.count(CLAMP) == 1 and rerun.count(BIAS) == 0
    whole = _names(BOTH, replace(OPTS, recompute="selective", recompute_modules=("moe",)), "I")
    assert whole.count(CLAMP) == 1 and whole.count(BIAS) == 1  # the whole MoE block again


def test_the_clamped_copy_is_saved_unless_recomputed():
    def saved(model, opts):
        return {x.name: x.nbytes for x in layer_saved_tensors(model, 1, opts, moe=True)}

    plain, clamped = saved(PLAIN, OPTS), saved(CLAMPED, OPTS)
    assert clamped.pop("expert FC1 output, clamped") == 2 * ROUTED * FE * D and clamped == plain
    assert saved(CLAMPED, ACT) == saved(PLAIN, ACT)
    assert saved(BIASED, OPTS).keys() == plain.keys()  # _apply_bias keeps nothing new (its probabilities are kept)
    # --activation-func-fp8-input-store: the fused activation stores the clamped copy as FP8; the clamps' input (the
    # FC1 output) stays in the dtype
    stored = saved(CLAMPED, replace(OPTS, act_fp8_store=True))
    assert stored["expert FC1 output, clamped (FP8 store)"] == 2 * ROUTED * FE
    assert stored["expert FC1 output"] == 2 * ROUTED * FE * D


def test_the_host_launches_them():
    def delta(model, opts):
        a, b = moe_layer_host_ops(PLAIN, opts), moe_layer_host_ops(model, opts)
        return b.launches_f - a.launches_f, b.launches_i - a.launches_i, b.launches_w - a.launches_w

    assert delta(CLAMPED, OPTS) == (3, 3, 0)
    assert delta(BIASED, OPTS) == (2 * LOCAL + 1, 2 * LOCAL + 2, 2 * LOCAL)
    assert delta(CLAMPED, ACT) == (3, 3 + 3, 0)  # the clamps again before the backward


def test_gpt_oss_carries_its_gate():
    """GPT-OSS's clamp at swiglu_limit, transformers' sigmoid gain 1.702 and (up + 1); the executor builds them."""
    model = load_hf_config("gpt-oss-20b", seq=4096)
    assert (model.moe.glu_clamp, model.moe.glu_alpha, model.moe.glu_offset) == (7.0, 1.702, 1.0) and model.biases
    assert unbuilt_structure(model) == []
    assert "glu_alpha" not in load_hf_config("mixtral-8x7b", seq=4096).to_dict()["moe"]  # at SwiGLU's: left out


def test_a_config_file_sets_or_refuses_the_limit(tmp_path, capsys):
    cfg = json.loads(resolve_model_config("gpt-oss-20b").read_text())
    cfg["swiglu_limit"], cfg["swiglu_alpha"] = 3.5, 1.5
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    moe = load_hf_config(path, seq=4096).moe
    assert (moe.glu_clamp, moe.glu_alpha) == (3.5, 1.5)
    cfg["swiglu_limit"] = -1
    path.write_text(json.dumps(cfg))
    args = ["simulate", "1f1b", "--model-config", str(path), "--stages", "1", "--microbatches", "1"]
    assert main(args) == 2
    assert "field 'swiglu_limit' must be a positive number, got -1" in capsys.readouterr().err


@pytest.mark.parametrize("build,message", [
    (lambda: replace(PLAIN.moe, glu_clamp=0), "moe glu_clamp must be a positive finite number or null, got 0"),
    (lambda: replace(PLAIN.moe, glu_clamp=True), "moe glu_clamp must be a positive finite number or null, got True"),
    (lambda: replace(CLAMPED, activation="gelu"), "moe glu_clamp, glu_alpha and glu_offset shape a gated "
                                                  "activation; activation 'gelu' has none (use swiglu)"),
    (lambda: replace(PLAIN.moe, glu_alpha=0), "moe glu_alpha must be a positive finite number, got 0"),
    (lambda: replace(PLAIN.moe, glu_offset=float("nan")), "moe glu_offset must be a finite number, got nan"),
    (lambda: layer_kernels(BIASED, 1, LayerOptions(attention="flash", tp=2, sp=True, ep=EP, etp=2),
                           moe=True),
     "experts with biases cannot be split over --etp 2: Transformer Engine's GroupedLinear has no bias under tensor "
     "parallelism"),
])
def test_refusals(build, message):
    with pytest.raises(PipesimError, match=re.escape(message)):
        build()
