"""A transformer layer's communication in closed form (pipesim.model.layer_collectives): the tensor-parallel
collectives with and without sequence parallelism, DTensor's and Transformer Engine's FP8 gathers, recomputation's
replays, the embedding's and head's, and ring attention's K/V exchanges."""

from __future__ import annotations

from fractions import Fraction

from pipesim.model.activations import layer_saved_tensors
from pipesim.model.cp_exchanges import cp_layer_exchanges
from pipesim.model.fp8 import Fp8Options
from pipesim.model.layer_collectives import (
    tp_embedding_collectives,
    tp_head_collectives,
    tp_layer_collectives,
)
from pipesim.model.options import LayerOptions

from .test_layer_costs import _gpt, _llama


def test_tp_collectives_without_and_with_sequence_parallelism():
    model = _gpt(64, 256, 8)
    x = 2 * 64 * 256 * 2  # b s h d
    plain = tp_layer_collectives(model, 2, LayerOptions(tp=4))
    assert [(c.kind, c.nbytes, c.phase) for c in plain] == [("all_reduce", x, "F")] * 2 + [("all_reduce", x, "I")] * 2
    assert [c.overlaps for c in plain if c.phase == "I"] == ["W: MLP up weight-gradient GEMM",
                                                              "W: QKV weight-gradient GEMM"]
    sp = tp_layer_collectives(model, 2, LayerOptions(tp=4, sp=True))
    forward = [(c.kind, c.nbytes) for c in sp if c.phase == "F"]
    assert forward == [("all_gather", x), ("reduce_scatter", x)] * 2
    ring = {"all_reduce": Fraction(2 * 3, 4), "all_gather": Fraction(3, 4), "reduce_scatter": Fraction(3, 4)}
    assert sum(ring[k] * n for k, n in forward) == sum(ring[c.kind] * c.nbytes for c in plain if c.phase == "F")
    backward = [(c.kind, c.overlaps.split(":")[0]) for c in sp if c.phase == "I"]
    assert backward == [("all_gather", ""), ("all_gather", "I"), ("reduce_scatter", "W")] * 2
    assert tp_layer_collectives(model, 2, LayerOptions()) == []


def test_dtensor_tp_saves_the_gathered_inputs_and_gathers_tensorwise_fp8_in_fp8():
    """torchtitan's tensor parallelism (PrepareModuleInput then ColwiseParallel): autograd keeps the all-gathered input
    of the column-parallel matmuls, so the backward gathers nothing again, and the saved input is the whole
    sequence's; under tensorwise FP8 (torchao's PrepareFloat8ModuleInput) the forward gather moves one byte each."""
    model = _llama()
    s, b, h = 64, 3, 256
    x = b * s * h * 2
    megatron = tp_layer_collectives(model, b, LayerOptions(tp=2, sp=True, attention="flash"))
    dtensor = tp_layer_collectives(model, b, LayerOptions(tp=2, sp=True, attention="flash", dtensor_tp=True))
    assert [c for c in megatron if "again" not in c.what] == dtensor
    assert [(c.kind, c.nbytes, c.phase) for c in dtensor] == [("all_gather", x, "F"), ("reduce_scatter", x, "F")] * 2 \
        + [("all_gather", x, "I"), ("reduce_scatter", x, "I")] * 2
    for recipe, gathered in (("tensorwise", x // 2), ("delayed", x)):
        fp8 = LayerOptions(tp=2, sp=True, attention="flash", dtensor_tp=True, fp8=Fp8Options("hybrid", recipe),
                           recompute="full")
        got = [(c.nbytes, c.phase) for c in tp_layer_collectives(model, b, fp8) if c.kind == "all_gather"]
        assert got == [(gathered, "F")] * 2 + [(gathered, "I")] * 2 + [(x, "I")] * 2  # recompute; output grads
    saved = {x.name: x.nbytes for x in layer_saved_tensors(model, b, LayerOptions(tp=2, sp=True, attention="flash",
                                                                                   dtensor_tp=True))}
    sharded = {x.name: x.nbytes for x in layer_saved_tensors(model, b, LayerOptions(tp=2, sp=True,
                                                                                    attention="flash"))}
    assert saved["QKV input"] == saved["MLP input"] == 2 * s * b * h == 2 * sharded["QKV input"]
    assert {k: v for k, v in saved.items() if k not in ("QKV input", "MLP input")} == \
        {k: v for k, v in sharded.items() if k not in ("QKV input", "MLP input")}


def test_transformer_engine_gathers_fp8_and_reduce_scatters_in_the_dtype():
    """Under FP8 TE's LayerNormLinear all-gathers its quantized norm output (forward, and again for the weight
    gradient) and its row-parallel backward the quantized output gradient: one byte per element plus the recipe's
    block scales; every reduce-scatter stays in the dtype."""
    model = _llama()
    s, b, h = 64, 3, 256
    x = b * s * h * 2
    for recipe, fp8_bytes in (("tensorwise", x // 2), ("blockwise", x // 2 + x // 2 // 32)):
        opts = LayerOptions(tp=2, sp=True, attention="flash", fp8=Fp8Options("hybrid", recipe))
        got = [(c.kind, c.nbytes, c.phase) for c in tp_layer_collectives(model, b, opts)
               if not c.what.endswith(" amax")]
        assert got == [("all_gather", fp8_bytes, "F"), ("reduce_scatter", x, "F")] * 2 + \
            [("all_gather", fp8_bytes, "I"), ("all_gather", fp8_bytes, "I"), ("reduce_scatter", x, "I")] * 2


def test_a_per_tensor_scale_reduces_its_amax_over_tp_before_each_quantized_gather():
    """Current scaling and NVFP4 quantize a block's input (forward) and a row-parallel output gradient (backward)
    on the rank's shard with one scale for the whole tensor, so TE all-reduces the amax over tp first (NVFP4 its
    row-wise and column-wise amax together); block-scaled and delayed recipes, bf16, and gathers that move the dtype
    (DTensor's output gradients) reduce nothing. Full recomputation re-runs the forward's."""
    model = _llama()
    b = 3

    def whats(opts):
        return [(c.kind, c.nbytes, c.phase, c.what) for c in tp_layer_collectives(model, b, opts)]

    for recipe, fmt, amax in (("tensorwise", "hybrid", 4), ("nvfp4", "e2m1", 8)):
        got = whats(LayerOptions(tp=2, sp=True, attention="flash", fp8=Fp8Options(fmt, recipe)))
        assert [w for w in got if w[3].endswith("amax")] == [
            ("all_reduce", amax, "F", "attention input amax"), ("all_reduce", amax, "F", "MLP input amax"),
            ("all_reduce", amax, "I", "MLP output gradient amax"),
            ("all_reduce", amax, "I", "attention output gradient amax")]
        order = [w[3] for w in got]  # each amax right before the gather of its tensor
        for tensor in ("attention input", "MLP input"):
            assert order.index(f"{tensor} amax") + 1 == order.index(next(w for w in order
                                                                         if w.startswith(f"{tensor} (before")))
        for tensor in ("MLP output gradient", "attention output gradient"):
            assert order.index(f"{tensor} amax") + 1 == order.index(tensor)
    for recipe in ("delayed", "blockwise", "mxfp8"):
        assert not any(w[3].endswith("amax") for w in whats(LayerOptions(tp=2, sp=True, attention="flash",
                                                                         fp8=Fp8Options("hybrid", recipe))))
    assert not any(w[3].endswith("amax") for w in whats(LayerOptions(tp=2, sp=True, attention="flash")))
    assert not any(w[3].endswith("amax") for w in whats(LayerOptions(tp=2, attention="flash",
                                                                     fp8=Fp8Options("hybrid", "tensorwise"))))
    dtensor = whats(LayerOptions(tp=2, sp=True, attention="flash", dtensor_tp=True,
                                 fp8=Fp8Options("hybrid", "tensorwise", impl="torchao")))
    assert [w[3] for w in dtensor if w[3].endswith("amax")] == ["attention input amax", "MLP input amax"]
    full = whats(LayerOptions(tp=2, sp=True, attention="flash", recompute="full",
                              fp8=Fp8Options("hybrid", "tensorwise")))
    assert [w[3] for w in full if w[3].endswith("amax")] == [
        "attention input amax", "MLP input amax", "recompute: attention input amax", "recompute: MLP input amax",
        "MLP output gradient amax", "attention output gradient amax"]


def test_full_recompute_reruns_the_forward_collectives_in_backward():
    model = _gpt(64, 256, 8)
    none = tp_layer_collectives(model, 2, LayerOptions(tp=4, sp=True))
    full = tp_layer_collectives(model, 2, LayerOptions(tp=4, sp=True, recompute="full"))
    rerun = [c for c in full if c.what.startswith("recompute:")]
    assert [(c.kind, c.nbytes, c.phase) for c in rerun] == [(c.kind, c.nbytes, "I") for c in none if c.phase == "F"]
    assert len(full) == len(none) + len(rerun)
    assert len(tp_layer_collectives(model, 2, LayerOptions(tp=4, recompute="selective"))) == 4


def test_embedding_and_head_collectives():
    model = _gpt(64, 256, 8)
    x = 2 * 64 * 256 * 2
    assert [(c.kind, c.nbytes, c.phase) for c in tp_embedding_collectives(model, 2, LayerOptions(tp=2))] == \
        [("all_reduce", x, "F")]
    head = tp_head_collectives(model, 2, LayerOptions(tp=2))
    assert [(c.kind, c.nbytes, c.phase) for c in head] == [("all_reduce", 4 * 128, "F")] * 3 + [("all_reduce", x, "I")]


def test_ring_attention_exchanges_kv_blocks():
    model = _llama(seq=256)
    opts = LayerOptions(tp=2, cp=4, attention="flash")
    kv = 2 * (256 // 4) * 3 * (64 // 2) * 2  # K and V of s/cp tokens, h_kv / t wide, bf16
    ex = cp_layer_exchanges(model, 3, opts)
    assert [(c.what, c.nbytes, c.phase, c.count) for c in ex] == [
        ("K/V block", kv, "F", 3), ("K/V block", kv, "I", 3), ("dK/dV block", kv, "I", 4)]
    full = cp_layer_exchanges(model, 3, LayerOptions(tp=2, cp=4, attention="flash", recompute="full"))
    assert sum(c.total_bytes for c in full) == sum(c.total_bytes for c in ex) + 3 * kv
    assert cp_layer_exchanges(model, 3, LayerOptions(attention="flash")) == []


# --- parameters ---
