"""A mixture-of-experts layer on one rank, in closed form: tokens, parameters, kernels, saved tensors, exchanges
(pipesim.model.moe_layer, layer_kernels, activations, layer_collectives; pipesim.cost.stage_work)."""

from __future__ import annotations

import pytest

from pipesim.errors import PipesimError
from pipesim.model.activations import layer_activation_bytes, layer_saved_tensors
from pipesim.model.config import ModelConfig
from pipesim.model.layer_collectives import ep_layer_exchanges, tp_layer_collectives
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.moe import MoeConfig
from pipesim.model.moe_layer import expert_params_here, expert_shapes, moe_block_params, routed_tokens
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import block_params

H, F, E, K = 4096, 14336, 8, 2  # Mixtral 8x7B: hidden, expert width, experts, top-k
MIXTRAL = ModelConfig(kind="gpt", hidden=H, layers=32, heads=32, kv_heads=8, ffn_hidden=F, vocab=32000, seq=4096,
                      batch=16, dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                      positions="rope", moe=MoeConfig(E, K, F))


def test_moe_config_places_experts_after_the_dense_layers_every_nth_layer():
    moe = MoeConfig(64, 6, 1408, shared_experts=2, dense_layers=1, every=2)
    assert [layer for layer in range(8) if moe.is_moe_layer(layer)] == [1, 3, 5, 7]
    assert moe.moe_layers(0, 4) == 2 and moe.moe_layers(4, 4) == 2 and moe.shared_width == 1408
    assert MoeConfig(8, 2, 64, dense_layers=3).moe_layers(0, 4) == 1
    assert MoeConfig(8, 2, 64, capacity_factor=1.25).load_factor() == 1.25
    assert MoeConfig(8, 2, 64, imbalance=1.5).load_factor() == 1.5


@pytest.mark.parametrize("kwargs,message", [
    ({"experts": 0}, "moe experts must be a positive integer, got 0"),
    ({"top_k": 9}, "moe top_k 9 is more than its 8 experts"),
    ({"imbalance": 0.9}, "moe imbalance (the most-loaded expert's tokens / the mean) must be in [1, E / k = 4] (an "
                         "expert receives at most every token), got 0.9"),
    ({"capacity_factor": 0}, "moe capacity_factor must be a number in (0, E / k = 4] (an expert holds at most every "
                             "token), got 0"),
    ({"capacity_factor": 1.0, "imbalance": 1.2},
     "moe imbalance applies to dropless routing; with a capacity_factor the most-loaded expert takes capacity_factor "
     "x the mean"),
    ({"dense_layers": -1}, "moe dense_layers must be a non-negative integer, got -1"),
])
def test_moe_config_refuses_in_one_line(kwargs, message):
    with pytest.raises(PipesimError) as err:
        MoeConfig(**{"experts": 8, "top_k": 2, "expert_ffn": 64, **kwargs})
    assert str(err.value) == message


def test_routed_tokens_conserve_the_token_expert_pairs_over_the_expert_group():
    """Per microbatch a stage's tp x cp x dp ranks hold dp b s tokens, k pairs each, computed by ep x edp expert
    instances (etp ranks each): per rank b s k etp / (tp cp) with sp, whatever ep (as Megatron-core's dispatcher)."""
    b, s = 2, MIXTRAL.seq
    for tp, etp, ep, dp in ((1, 1, 1, 1), (1, 1, 8, 8), (2, 1, 8, 8), (2, 2, 4, 8), (4, 4, 2, 2)):
        opts = LayerOptions(tp=tp, sp=tp > 1, ep=ep, etp=etp)
        per_rank = routed_tokens(MIXTRAL, b, opts)
        edp = tp * dp // (ep * etp)
        assert per_rank * ep * edp == dp * b * s * K  # each instance's etp ranks all compute its pairs (1 / etp wide)
    no_sp = LayerOptions(tp=2, ep=1, etp=2)  # every tp rank holds all tokens; the experts split as the MLP
    assert routed_tokens(MIXTRAL, b, no_sp) == b * s * K
    skewed = ModelConfig(**{**MIXTRAL.to_dict(), "moe": MoeConfig(E, K, F, imbalance=1.25)})
    assert routed_tokens(skewed, b, LayerOptions(ep=8)) == b * s * K * 5 // 4


def test_moe_block_parameters_on_one_rank():
    """Router h x E whole; E / ep experts of 3 h f / etp (SwiGLU); attention and norms as the dense block."""
    opts = LayerOptions(tp=2, sp=True, ep=4, etp=1)
    assert expert_params_here(MIXTRAL, opts) == E // 4 * 3 * H * F
    assert moe_block_params(MIXTRAL, opts) == H * E + E // 4 * 3 * H * F
    attention_and_norms = block_params(MIXTRAL, 2) - 3 * H * F // 2
    assert attention_and_norms == (H * (H + 2 * 1024) + H * H) // 2 + 2 * H
    shared = ModelConfig(**{**MIXTRAL.to_dict(), "moe": MoeConfig(64, 6, 1408, shared_experts=2)})
    assert moe_block_params(shared, LayerOptions(tp=2, sp=True, ep=8, etp=2)) == \
        H * 64 + 64 // 8 * 3 * H * 1408 // 2 + 3 * H * 2 * 1408 // 2


def test_expert_kernels_are_grouped_gemms_of_the_slowest_ranks_tokens():
    b = 2
    opts = LayerOptions(tp=2, sp=True, ep=4, etp=1, attention="flash")
    shapes = expert_shapes(MIXTRAL, b, opts)
    routed = b * MIXTRAL.seq * K // 2  # b s k etp / tp
    assert (shapes.local_experts, shapes.tokens_per_expert, shapes.fc1_out, shapes.ffn) == (2, routed // 2, 2 * F, F)
    moe, dense = layer_kernels(MIXTRAL, b, opts, moe=True), layer_kernels(MIXTRAL, b, opts)
    names = [k.name for k in moe.F]
    assert names.index("router") < names.index("token permute") < names.index("expert FC1") \
        < names.index("expert SwiGLU") < names.index("expert FC2") < names.index("token unpermute")
    assert "FC1" not in names and "SwiGLU" not in names
    here = b * MIXTRAL.seq // 2  # tokens entering the block on this rank (sp)
    expert_flops = 2 * routed * H * 3 * F  # FC1 (gate and up) and FC2 over the pairs
    router = 2 * here * E * H
    dense_mlp = 2 * b * MIXTRAL.seq * H * 3 * F // 2  # the dense MLP's GEMMs (all-gathered tokens, f / tp)
    assert moe.flops("F") - dense.flops("F") == expert_flops + router - dense_mlp
    assert moe.flops("I") - dense.flops("I") == expert_flops + router - dense_mlp
    assert moe.flops("W") - dense.flops("W") == expert_flops + router - dense_mlp


def test_the_alltoall_dispatcher_sorts_received_tokens_by_local_expert_and_back():
    """Megatron-core's permutation 2 (sort_chunks_by_idxs) with more than one local expert: a read and a write of every
    routed token before the experts and after them, and again in the backward; DeepEP's layout and one local expert
    need neither."""
    b, d = 2, 2
    two = LayerOptions(tp=2, sp=True, ep=4, etp=1, attention="flash")  # 8 experts over ep 4: 2 local
    routed = b * MIXTRAL.seq * K // 2
    kernels = layer_kernels(MIXTRAL, b, two, moe=True)
    names = [k.name for k in kernels.F]
    assert names.index("token permute") < names.index("token sort by local expert") < names.index("expert FC1")
    assert names.index("expert FC2") < names.index("token unsort by local expert") < names.index("token unpermute")
    sorts = {k.name: k.nbytes for phase in ("F", "I") for k in getattr(kernels, phase) if "sort" in k.name}
    assert sorts == dict.fromkeys(("token sort by local expert", "token unsort by local expert",
                                   "token unsort backward", "token sort backward"), 2 * routed * H * d)
    for opts in (LayerOptions(tp=2, sp=True, ep=4, etp=1, attention="flash", moe_dispatcher="deepep"),  # DeepEP
                 LayerOptions(tp=1, ep=8, attention="flash")):  # one local expert
        assert not [k for phase in ("F", "I") for k in getattr(layer_kernels(MIXTRAL, b, opts, moe=True), phase)
                    if "sort" in k.name]
    with pytest.raises(PipesimError, match="unknown MoE token dispatcher 'nccl'"):
        LayerOptions(moe_dispatcher="nccl")


def test_moe_saved_tensors_replace_the_dense_mlps():
    b = 1
    opts = LayerOptions(tp=1, ep=8, attention="flash")
    saved = {x.name: x.nbytes for x in layer_saved_tensors(MIXTRAL, b, opts, moe=True)}
    tokens, d = MIXTRAL.seq * b, 2
    assert saved["router probabilities"] == 4 * tokens * E
    assert saved["dispatched tokens (expert FC1 input)"] == d * tokens * K * H
    assert saved["expert FC1 output"] == d * tokens * K * 2 * F
    assert saved["expert FC2 input"] == d * tokens * K * F
    assert saved["routed probabilities (weighted activation input)"] == 4 * tokens * K
    assert "expert outputs (unpermute input)" not in saved  # Megatron-core >= 0.13: the unpermute keeps nothing
    assert "gate and up" not in saved
    dense = layer_activation_bytes(MIXTRAL, b, opts)
    dense_mlp = d * tokens * 3 * F
    moe_mlp = 4 * tokens * E + d * tokens * K * (H + 3 * F) + 4 * tokens * K
    assert layer_activation_bytes(MIXTRAL, b, opts, moe=True) == dense - dense_mlp + moe_mlp


def test_expert_parallel_exchanges_per_layer():
    """F: dispatch, combine; backward: the combine's gradient, the dispatch's; full recomputation re-runs the
    forward's first. Each carries the rank's tokens' k copies."""
    b = 1
    sent = MIXTRAL.seq * K * H * 2
    opts = LayerOptions(tp=1, ep=8, attention="flash")
    assert [(c.phase, c.what, c.nbytes) for c in ep_layer_exchanges(MIXTRAL, b, opts)] == [
        ("F", "MoE dispatch", sent), ("F", "MoE combine", sent),
        ("I", "MoE combine backward", sent), ("I", "MoE dispatch backward", sent)]
    full = LayerOptions(tp=1, ep=8, attention="flash", recompute="full")
    assert [c.what for c in ep_layer_exchanges(MIXTRAL, b, full)][2:4] == ["recompute: MoE dispatch",
                                                                            "recompute: MoE combine"]
    assert ep_layer_exchanges(MIXTRAL, b, LayerOptions(attention="flash")) == []
    # with sp and etp 1 the MoE MLP has no tp collective: the attention block's alone
    tp2 = LayerOptions(tp=2, sp=True, ep=4, etp=1, attention="flash")
    whats = [c.what for c in tp_layer_collectives(MIXTRAL, b, tp2, moe=True)]
    assert whats == ["attention input (before QKV)", "attention output", "attention output gradient",
                     "attention input, again (for the QKV weight gradient)", "attention input gradient"]
    etp2 = LayerOptions(tp=2, sp=True, ep=4, etp=2, attention="flash")
    routed = routed_tokens(MIXTRAL, b, etp2) * H * 2
    assert [(c.kind, c.nbytes) for c in tp_layer_collectives(MIXTRAL, b, etp2, moe=True) if "expert" in c.what
            or "dispatched" in c.what] == [("all_gather", routed), ("reduce_scatter", routed),
                                           ("all_gather", routed), ("reduce_scatter", routed)]


@pytest.mark.parametrize("opts,message", [
    (LayerOptions(ep=3), "--ep 3 does not divide the 8 experts"),
    (LayerOptions(tp=2, ep=2), "expert parallelism with tp(2) needs --sequence-parallel (as Megatron-LM)"),
    (LayerOptions(tp=2, sp=True, ep=2, etp=4), "--etp 4: pipesim models expert tensor parallelism of 1 or --tp (2)"),
    (LayerOptions(tp=2, ep=1, etp=1), "--etp 1 with tp(2) and no sequence parallelism: the tp ranks hold the same "
                                      "tokens, so the experts split as the MLP does (--etp equal to --tp)"),
])
def test_expert_layouts_pipesim_does_not_model_are_refused(opts, message):
    with pytest.raises(PipesimError) as err:
        opts.check(MIXTRAL)
    assert str(err.value) == message
    with pytest.raises(PipesimError, match=r"^--ep 2 needs a mixture-of-experts model$"):
        LayerOptions(ep=2).check(ModelConfig(kind="gpt"))
