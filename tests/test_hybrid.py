"""Hybrid Mamba models (pipesim.model.hybrid, mixer_layer, hf_nemotron_h): Nemotron-H and Nemotron 3, one layer per
pattern symbol, each costed as its kind and counted per stage."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipesim.cli import main
from pipesim.cost.kernel_costs import fp8_layer, gpt_stage_seconds, layer_seconds
from pipesim.cost.stage_work import gpt_stage_work
from pipesim.errors import PipesimError
from pipesim.model.activations import layer_saved_tensors
from pipesim.model.flops import model_flops
from pipesim.model.fp8 import Fp8Options
from pipesim.model.hf_config import load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.hybrid import HybridLayers
from pipesim.model.layer_collectives import tp_layer_collectives
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.layer_kinds import LayerKind, StageLayers, kind_options, stage_layers
from pipesim.model.mamba_mixer import MambaMixer, mamba_flops, mamba_params
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import active_params, model_params
from pipesim.model.weight_tensors import layer_params

NANO = "nemotron-3-nano-30b-a3b"
MAMBA, ATTENTION = LayerKind(part="mamba"), LayerKind(part="attention")
MLP, EXPERTS = LayerKind(part="mlp"), LayerKind(moe=True, part="mlp")


def test_nemotron_3_nano_is_23_mamba_23_expert_and_6_attention_layers_of_its_stated_size():
    """Nemotron 3 Nano 30B-A3B (Megatron-Bridge's recipe, src/megatron/bridge/recipes/nemotronh/h100/
    nemotron_3_nano.py at 067f987df): 52 layers, 23 Mamba-2, 23 MoE (128 routed experts of 1,856 and one shared of
    3,712, 6 per token) and 6 GQA layers (32 heads of 128, 2 key/value heads), hidden 2,688, vocabulary 131,072, untied.
    Its parameters written out from those shapes: 31.58B in all and 3.58B active, NVIDIA's "31.6B total" and "3.6B
    active including embeddings" (3.2B without the input embedding)."""
    model = load_hf_config(NANO, seq=8192)
    assert [model.hybrid.count(s) for s in "ME*-"] == [23, 23, 6, 0] and model.positions == "none"
    h, v = 2688, 131072
    mamba = h + h * (2 * 4096 + 2 * 8 * 128 + 64) + (4096 + 2 * 8 * 128) * (4 + 1) + 3 * 64 + 4096 + 4096 * h
    attention = h + h * (32 * 128 + 2 * 2 * 128) + 32 * 128 * h
    shared = 2 * h * 3712  # squared ReLU: up and down
    experts = h + 128 * h + 128 + shared  # the norm, the router, its expert bias, the shared expert
    routed = 2 * h * 1856
    ends = 2 * v * h + h  # embedding, output layer, final norm
    total = ends + 23 * mamba + 6 * attention + 23 * (experts + 128 * routed)
    assert model_params(model) == total == 31_577_940_288
    assert active_params(model) == total - 23 * 122 * routed == 3_580_076_352
    assert active_params(model) - v * h == 3_227_754_816


def test_the_8b_and_56b_are_nemotron_h_of_their_size():
    """Nemotron-H 8B and 56B (Megatron-Bridge's recipes/nemotronh/h100/nemotronh.py): 52 and 118 layers of M, - and *
    (24 + 24 + 4, 54 + 54 + 10), squared-ReLU MLPs of 21,504 and 32,768."""
    small, large = (load_hf_config(name) for name in ("nemotron-h-8b", "nemotron-h-56b"))
    assert [small.hybrid.count(s) for s in "M-*"] == [24, 24, 4] and [large.hybrid.count(s) for s in "M-*"] == \
        [54, 54, 10]
    assert model_params(small) == 8_100_852_736 and model_params(large) == 56_324_350_464
    assert active_params(small) == model_params(small)


def test_a_stage_counts_its_layers_by_symbol_and_costs_each_kind_once():
    model = load_hf_config(NANO, seq=4096)
    mixes = stage_layers(model, [26, 26])
    assert mixes[0] == StageLayers(((MAMBA, 12), (ATTENTION, 3), (EXPERTS, 11)))  # MEMEM*EMEMEM*... to layer 25
    assert mixes[0].plus(mixes[1]) == StageLayers(((MAMBA, 23), (ATTENTION, 6), (EXPERTS, 23)))
    opts = LayerOptions(attention="flash", ep=8)
    stage = gpt_stage_seconds(model, 1, mixes[0], opts, first=False, last=False, fused=True, family="H100")
    for phase in ("F", "I", "W"):
        expected = sum(n * getattr(layer_seconds(model, 1, kind_options(model, opts, kind), True, "H100",
                                                 moe=kind.moe), phase) for kind, n in mixes[0])
        assert getattr(stage, phase) == pytest.approx(expected, rel=1e-12)


def test_a_mamba_layer_is_its_norm_its_mixer_and_its_residual_add():
    model = load_hf_config(NANO, seq=4096)
    mixer, h, t = model.hybrid.mamba, 2688, 2 * 4096
    opts = LayerOptions(part="mamba", tp=2, sp=True)
    kernels = layer_kernels(model, 2, opts)
    assert kernels.F[0].name == "Mamba RMSNorm" and kernels.F[-1].name == "Mamba residual add"
    assert kernels.F[0].nbytes == 2 * (t // 2) * h * 2  # the residual stream's shard, read and written in bf16
    assert tuple(kernels.flops(p) for p in "FIW") == mamba_flops(mixer, h, t, 2, batch=2)
    assert layer_params(model, opts) == h + mamba_params(mixer, h, 2)  # the pre-norm whole, the mixer split
    saved = layer_saved_tensors(model, 2, opts)
    assert saved[0].name == "Mamba norm input" and saved[0].nbytes == 2 * (t // 2) * h
    assert [x.name for x in layer_saved_tensors(model, 2, LayerOptions(part="mamba", recompute="full"))] == \
        ["layer input"]
    colls = tp_layer_collectives(model, 2, opts)  # the attention sublayer's, around in_proj and out_proj
    assert [c.what for c in colls][:2] == ["Mamba input (before in_proj)", "Mamba output"]
    assert any(c.overlaps == "W: in_proj weight-gradient GEMM" for c in colls)
    full = layer_kernels(model, 2, LayerOptions(part="mamba", recompute="full"))
    assert full.I[:len(full.F)] == full.F  # the re-run forward first


def test_model_flops_count_each_kind_and_the_attention_cores_causal_half():
    """A dense Nemotron-H: MFU's count is each Mamba layer's kernels (its linears and its scan's chunked GEMMs), each
    MLP's, each attention layer's block less its MLP (the core's causal half), and the head, over F, I and W."""
    model = load_hf_config("nemotron-h-8b", seq=4096)
    one = LayerOptions(attention="eager")
    tokens = 4 * 4096
    per_kind = {kind: sum(map(layer_kernels(model, 4, kind_options(model, one, kind), moe=kind.moe).flops, "FIW"))
                for kind in (MAMBA, MLP, ATTENTION)}
    h, q, kv = 4096, 32 * 128, 8 * 128
    linear = 3 * 2 * tokens * h * (q + 2 * kv + q)  # QKV and the projection, F, I and W
    core = 3 * 4 * 4096 * 4096 * 4 * q // 2  # Q K^T and A V over the causal half: 4 b s^2 h_q forward, 2x backward
    assert per_kind[ATTENTION] == linear + 2 * core  # the full square, eager
    head = 3 * 2 * tokens * h * 131072
    assert model_flops(model, 4) == 24 * per_kind[MAMBA] + 24 * per_kind[MLP] + 4 * (linear + core) + head


def test_the_parameters_the_stages_count_are_the_models():
    """The stages' trained parameters (their tensors) are the model's count less the experts' routing-score biases,
    which Megatron-core keeps as buffers outside the optimizer (a checkpoint's count holds them: 128 per MoE layer)."""
    model = load_hf_config(NANO, seq=4096)
    opts = LayerOptions(attention="flash")
    works = [gpt_stage_work(model, 1, mix, first=s == 0, last=s == 1, opts=opts)
             for s, mix in enumerate(stage_layers(model, [30, 22]))]
    assert sum(w.param_count for w in works) == model_params(model) - 23 * 128


@pytest.mark.parametrize("change,message", [
    ({"residual_in_fp32": True}, "a float32 residual stream in a hybrid model is not modelled"),
    ({"moe_latent_size": 1024}, "latent experts"),
    ({"mlp_hidden_act": "silu"}, "'mlp_hidden_act' 'silu'"),
    ({"use_bias": True}, "biases on the linears"),
    ({"hybrid_override_pattern": "MEMEM|*EMEMEM"}, "pipeline stage boundaries"),
    ({"hybrid_override_pattern": "MEMEMGEMEME" * 4 + "MEMEMEMEM"}, "symbol 'G' is not modelled"),
    ({"hybrid_override_pattern": "ME*"}, "has 3 layers, the model 52"),
    ({"n_shared_experts": 2}, "one shared expert of that width, or none"),
    ({"num_nextn_predict_layers": 1}, "multi-token prediction"),
    ({"expand": 2}, "'expand' 2 x hidden_size 2688 is not mamba_num_heads x mamba_head_dim"),
])
def test_what_pipesim_does_not_model_in_a_nemotron_h_file_is_refused_in_one_line(tmp_path, change, message):
    cfg = {**read_hf_config(resolve_model_config(NANO)), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(PipesimError, match=message):
        load_hf_config(path, seq=8192)


def test_a_hybrid_model_refuses_what_pipesim_does_not_model_with_it():
    model = load_hf_config(NANO, seq=8192)
    with pytest.raises(PipesimError, match="--cp 2 with Mamba layers"):
        LayerOptions(attention="flash", cp=2, part="mamba").check(model)
    with pytest.raises(PipesimError, match="a Mamba layer's options for a model without Mamba layers"):
        LayerOptions(part="mamba").check(load_hf_config("llama3-8b"))
    with pytest.raises(PipesimError, match=r"moe placement \(1,\) is not the hybrid pattern's E layers"):
        replace(model, moe=replace(model.moe, placement=(1,)))
    with pytest.raises(PipesimError, match="experts \\(moe\\) need E layers in the pattern"):
        replace(model, hybrid=HybridLayers("M*" * 26, MambaMixer(heads=64)))
    with pytest.raises(PipesimError, match="a hybrid \\(Mamba\\) model with dropout is not modelled"):
        replace(model, dropout=True)


def test_on_the_command_line_nemotron_3_nano_simulates_plans_and_the_executor_refuses_it(capsys):
    common = ["--model-config", NANO, "--seq", "8192", "--batch", "1024", "--hardware", "dgx-h100", "--nodes", "2"]
    assert main(["simulate", "1f1b", "--microbatch-size", "1", "--stages", "1", "--dp", "16", "--ep", "8", "--etp",
                 "1", "--attention", "flash", "--zero", "1", "--framework", "megatron-core", "--fp8-format",
                 "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather", "--recompute", "selective",
                 "--recompute-modules", "moe", "layernorm", "core_attn", "moe_act", "--cuda-graph-impl",
                 "transformer_engine", "--cuda-graph-scope", "mamba", *common, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 0 < out["mfu"] < 1 and out["step_time"] > 0
    assert main(["run", "1f1b", "--stages", "1", "--microbatches", "1", "--model-config", NANO, "--seq", "64",
                 "--batch", "1", "--nproc", "1"]) == 2
    assert "a hybrid model's Mamba, attention-only and MLP-only layers" in capsys.readouterr().err
    assert main(["simulate", "1f1b", "--model", "gpt", "--stages", "1", "--microbatches", "1", "--hardware",
                 "dgx-h100", "--attention", "flash", "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope",
                 "mamba"]) == 2
    assert "the model has no Mamba layers" in capsys.readouterr().err


def test_a_plan_for_nemotron_h_exports_megatrons_hybrid_script_and_says_torchtitan_has_none(capsys):
    assert main(["plan", "--model-config", "nemotron-h-8b", "--seq", "8192", "--batch", "256", "--hardware",
                 "dgx-h100", "--nodes", "2", "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert ("# a hybrid model: pretrain_hybrid.py with --hybrid-layer-pattern M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-"
            "M-M*-M-M-M-M-M- --mamba-num-heads 128 --mamba-head-dim 64 --mamba-state-dim 128 --mamba-num-groups 8 "
            "--position-embedding-type none --squared-relu") in text
    assert "# torchtitan has no hybrid (Mamba) model" in text
    assert "`pipesim run` refuses this model" in text


def test_a_stack_without_hybrid_models_and_a_module_with_no_layer_to_recompute_are_refused(capsys):
    common = ["simulate", "1f1b", "--model-config", NANO, "--seq", "4096", "--batch", "256", "--microbatch-size", "1",
              "--stages", "1", "--dp", "16", "--ep", "8", "--zero", "1", "--hardware", "dgx-h100", "--nodes", "2",
              "--attention", "flash"]
    assert main([*common, "--framework", "torchtitan"]) == 2
    assert "--framework torchtitan has no hybrid (Mamba) model" in capsys.readouterr().err
    assert main([*common, "--recompute", "selective", "--recompute-modules", "mlp"]) == 2
    assert "--recompute-modules mlp: the hybrid model has no MLP layer ('-' in its pattern)" in capsys.readouterr().err


def test_under_fp8_a_mamba_layers_linears_run_in_fp8_and_its_scan_in_the_dtype():
    """Transformer Engine's linears (in_proj, out_proj) take the FP8 recipe; the SSD scan's Triton GEMMs do not."""
    model = load_hf_config(NANO, seq=4096)
    kernels = fp8_layer(model, 1, LayerOptions(part="mamba", fp8=Fp8Options("hybrid", "tensorwise")), True, "H100")
    gemms = {k.name: k.dtype for phase in kernels.phases() for k in phase if hasattr(k, "m")}
    assert {name: dtype for name, dtype in gemms.items() if not name.startswith("SSD")} == {
        "in_proj": "float8", "out_proj": "float8", "out_proj dgrad": "float8", "in_proj dgrad": "float8",
        "in_proj wgrad": "float8", "out_proj wgrad": "float8"}
    assert {dtype for name, dtype in gemms.items() if name.startswith("SSD")} == {None}
    assert any(k.name == "in_proj input cast" or k.name.startswith("in_proj input") for k in kernels.F)
