"""Qwen3-Next (pipesim.model.linear_attention, mixer_layer, output_gate, hf_qwen3_next): Gated DeltaNet on three layers
in four, gated softmax attention on the fourth, each kind costed once and counted per stage."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipesim.cli import main
from pipesim.cost.kernel_costs import gpt_stage_seconds, layer_seconds
from pipesim.cost.stage_work import gpt_stage_work
from pipesim.errors import PipesimError
from pipesim.model.activations import layer_saved_tensors
from pipesim.model.flops import dense_flops, model_flops
from pipesim.model.gdn_mixer import gdn_flops, gdn_params
from pipesim.model.hf_config import load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.layer_collectives import tp_layer_collectives
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.layer_kinds import LayerKind, StageLayers, kind_options, stage_layers
from pipesim.model.layer_parts import mlp_half
from pipesim.model.options import LayerOptions
from pipesim.model.output_gate import gate_forward_bytes
from pipesim.model.param_counts import active_params, block_params, model_params
from pipesim.model.weight_tensors import layer_params

NEXT = "qwen3-next-80b-a3b"
GDN, FULL = LayerKind(moe=True, mixer="gdn"), LayerKind(moe=True)


def test_qwen3_next_80b_is_its_checkpoints_size():
    """Qwen3-Next-80B-A3B's shapes (Qwen3-Coder-Next's too): 48 layers of hidden 2048, Gated DeltaNet of 16 key and 32
    value heads of 128 on three in four, gated attention of 16 heads of 256 (2 key/value heads) on the fourth, 512
    experts of 512 (10 per token) and a gated shared expert of 512 on every layer, vocabulary 151,936, untied. Its
    count is the checkpoint's total as Hugging Face lists it for Qwen/Qwen3-Coder-Next, 79,674,391,296 (as a
    third-party test citing that repository's config.json gives it); active: the total less the 502 unused experts of
    every layer."""
    model = load_hf_config(NEXT)
    assert model_params(model) == 79_674_391_296
    assert active_params(model) == model_params(model) - 48 * 502 * 3 * 2048 * 512 == 3_874_929_408


def test_qwen3_next_counts_its_layers_by_mixer():
    model = load_hf_config(NEXT, seq=4096)
    assert model.linear_attention.full_every == 4 and model.attention_gate and model.qk_norm
    assert stage_layers(model, [24, 24]) == [StageLayers(((FULL, 6), (GDN, 18)))] * 2
    assert model.qkv_width == 2 * 16 * 256 + 2 * 2 * 256  # queries and their gate, keys, values


def test_the_gated_attention_widens_qkv_and_adds_the_eager_gate():
    """Megatron-core's attention_output_gate: linear_qkv of h_q more outputs (its parameters and FLOPs), and
    x * sigmoid(gate.float()) after the core, eager (pipesim.model.output_gate)."""
    model = load_hf_config(NEXT, seq=4096)
    plain = replace(model, attention_gate=False, linear_attention=None)
    h, hq = 2048, 16 * 256
    assert block_params(model) - block_params(plain) == h * hq
    opts = LayerOptions(attention="flash")
    assert dense_flops(model, 1, opts) - dense_flops(plain, 1, opts) == 2 * 4096 * h * hq
    gated = {k.name: k for k in layer_kernels(model, 1, opts).F}
    n = 4096 * hq
    assert [gated[name].nbytes for name, _ in gate_forward_bytes(n, 2)] == [4 * n, 6 * n, 8 * n, 10 * n]
    saved = {x.name: x.nbytes for x in layer_saved_tensors(model, 1, opts)}
    assert saved["attention output before the gate"] == 2 * n and saved["attention output gate's sigmoid"] == 4 * n


def test_a_linear_attention_layer_is_its_norm_its_mixer_its_add_and_the_blocks_mlp():
    model = load_hf_config(NEXT, seq=4096)
    mixer, h, t = model.linear_attention.mixer, 2048, 4096
    opts = LayerOptions(attention="flash", ep=8, mixer="gdn")
    kernels = layer_kernels(model, 1, opts, moe=True)
    mlp = layer_kernels(model, 1, mlp_half(opts), moe=True)
    assert kernels.F[0].name == "GDN RMSNorm" and kernels.F[-len(mlp.F):] == mlp.F
    assert tuple(kernels.flops(p) for p in "FIW") == tuple(
        a + mlp.flops(p) for a, p in zip(gdn_flops(mixer, h, t, 1, batch=1), "FIW", strict=True))
    assert layer_params(model, opts, moe=True) == \
        h + gdn_params(mixer, h) + layer_params(model, mlp_half(opts), moe=True)
    assert layer_saved_tensors(model, 1, opts, moe=True)[0].name == "GDN norm input"
    colls = tp_layer_collectives(model, 1, replace(opts, tp=2, sp=True), moe=True)
    assert colls[0].what == "GDN input (before in_proj)" and colls[-1].what == "GDN input gradient"


def test_a_stage_costs_each_kind_once():
    model = load_hf_config(NEXT, seq=4096)
    mix = stage_layers(model, [24, 24])[0]
    opts = LayerOptions(attention="flash", ep=8)
    stage = gpt_stage_seconds(model, 1, mix, opts, first=False, last=False, fused=True, family="H100")
    expected = sum(n * layer_seconds(model, 1, kind_options(model, opts, kind), True, "H100", moe=kind.moe).F
                   for kind, n in mix)
    assert stage.F == pytest.approx(expected, rel=1e-12)
    works = [gpt_stage_work(model, 1, m, first=s == 0, last=s == 1, opts=LayerOptions(attention="flash"))
             for s, m in enumerate(stage_layers(model, [24, 24]))]
    assert sum(w.param_count for w in works) == model_params(model)


def test_model_flops_count_the_full_layers_core_over_its_causal_half():
    model = load_hf_config(NEXT, seq=4096)
    one = LayerOptions(attention="eager")
    per = {kind: sum(map(layer_kernels(model, 2, kind_options(model, one, kind), moe=True).flops, "FIW"))
           for kind in (GDN, FULL)}
    core = 3 * 4 * 2 * 4096 * 4096 * 16 * 256  # the eager core's F + I over the full square, halved below
    head = 3 * 2 * 2 * 4096 * 2048 * 151936
    assert model_flops(model, 2) == 36 * per[GDN] + 12 * (per[FULL] - core // 2) + head


@pytest.mark.parametrize("change,message", [
    ({"layer_types": ["linear_attention"] * 47 + ["full_attention"]}, "puts full attention on layers \\[47\\]"),
    ({"full_attention_interval": None, "layer_types": None}, "'full_attention_interval' or 'layer_types' is missing"),
    ({"linear_num_value_heads": 24}, "value"),
    ({"attention_bias": True}, "biases"),
])
def test_what_pipesim_does_not_model_in_a_qwen3_next_file_is_refused_in_one_line(tmp_path, change, message):
    cfg = {**read_hf_config(resolve_model_config(NEXT)), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(PipesimError, match=message):
        load_hf_config(path, seq=4096)


def test_on_the_command_line_qwen3_next_simulates_and_the_executor_and_cp_refuse_it(capsys):
    common = ["--model-config", NEXT, "--seq", "4096", "--batch", "256", "--hardware", "dgx-h100", "--nodes", "4"]
    assert main(["simulate", "1f1b", "--microbatch-size", "1", "--stages", "4", "--dp", "8", "--ep", "8", "--etp",
                 "1", "--attention", "flash", "--zero", "1", "--framework", "megatron-core", *common, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 0 < out["mfu"] < 1 and out["step_time"] > 0
    assert main(["simulate", "1f1b", "--microbatch-size", "1", "--stages", "4", "--dp", "4", "--cp", "2", "--ep",
                 "8", "--attention", "flash", "--zero", "1", *common]) == 2
    assert "with linear attention (Gated DeltaNet) is not modelled" in capsys.readouterr().err
    assert main(["run", "1f1b", "--stages", "1", "--microbatches", "1", "--model-config", NEXT, "--seq", "64",
                 "--batch", "1", "--nproc", "1"]) == 2
    assert "linear attention (Gated DeltaNet)" in capsys.readouterr().err
    assert active_params(model := load_hf_config(NEXT)) < model_params(model)


def test_a_plan_exports_megatrons_linear_attention_flags_and_a_stack_without_it_is_refused(capsys):
    common = ["--model-config", NEXT, "--seq", "4096", "--batch", "256", "--hardware", "dgx-h100", "--nodes", "4"]
    assert main(["plan", *common, "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert ("# linear attention: --experimental-attention-variant gated_delta_net --linear-attention-freq 4 "
            "--linear-num-key-heads 16 --linear-num-value-heads 32 --linear-key-head-dim 128 --linear-value-head-dim "
            "128 --linear-conv-kernel-dim 4 --attention-output-gate") in text
    assert "# torchtitan has no linear-attention (Gated DeltaNet) model" in text
    assert main(["simulate", "1f1b", "--microbatch-size", "1", "--stages", "4", "--dp", "8", "--ep", "8", "--zero",
                 "1", "--attention", "flash", "--framework", "torchtitan", *common]) == 2
    assert "--framework torchtitan has no linear-attention (Gated DeltaNet) model" in capsys.readouterr().err


def test_a_gated_deltanet_layer_refuses_what_pipesim_does_not_model_with_it():
    model = load_hf_config(NEXT, seq=4096)
    with pytest.raises(PipesimError, match="a Gated DeltaNet layer's options for a model without linear attention"):
        LayerOptions(mixer="gdn").check(load_hf_config("qwen3-30b-a3b"))
    with pytest.raises(PipesimError, match="--recompute op .* with linear attention \\(Gated DeltaNet\\) is not"):
        LayerOptions(attention="flash", recompute="op").check(replace(model, moe=None))
    with pytest.raises(PipesimError, match="tp 32 does not split the Gated DeltaNet"):
        LayerOptions(tp=32).check(replace(model, heads=32, kv_heads=32, ffn_hidden=5120))
