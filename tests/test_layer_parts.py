"""A block cut into its sublayers (pipesim.model.layer_parts): the attention part and the MLP part are the block,
nothing lost and nothing counted twice, in kernels, saved tensors, collectives, weights, parameters and FLOPs."""

from collections import Counter
from dataclasses import replace

import pytest

from pipesim.cost.stage_work import gpt_stage_work
from pipesim.errors import PipesimError
from pipesim.model.activations import layer_saved_tensors
from pipesim.model.fp8 import Fp8Options
from pipesim.model.hf_config import load_hf_config
from pipesim.model.layer_collectives import tp_layer_collectives
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.layer_parts import kernel_sublayer, saved_sublayer, tensor_sublayer
from pipesim.model.options import LayerOptions
from pipesim.model.weight_tensors import layer_params, layer_tensors

SELECTIVE = ("core_attn", "layernorm", "moe_act")
CASES = [  # (bundled model, its options, with experts)
    ("llama3.1-8b", LayerOptions(tp=2, sp=True, attention="flash", recompute="selective",
                                 recompute_modules=("core_attn", "mlp")), False),
    ("nemotron4-15b", LayerOptions(tp=4, sp=True, attention="flash"), False),
    ("gemma3-4b", LayerOptions(tp=2, attention="eager"), False),
    ("qwen3-30b-a3b", LayerOptions(tp=2, sp=True, attention="flash", ep=4, recompute="selective",
                                   recompute_modules=SELECTIVE,
                                   fp8=Fp8Options("hybrid", "tensorwise")), True),
    ("qwen1.5-moe-a2.7b", LayerOptions(tp=2, sp=True, attention="flash", ep=2, recompute="selective",
                                       recompute_modules=(*SELECTIVE, "shared_experts")), True),
    ("gpt-oss-20b", LayerOptions(attention="flash", ep=4, recompute="full"), True),
    ("deepseek-v3", LayerOptions(tp=2, sp=True, attention="flash", ep=8, recompute="selective",
                                 recompute_modules=("mla_up_proj", "layernorm", "moe_act")), True),
]


def _parts(opts):
    return replace(opts, part="attention"), replace(opts, part="mlp")


def _part(model, opts, moe):
    """A part's kernels per phase, saved tensors, tp collectives and weights: what a filter by sublayer gives."""
    kernels = layer_kernels(model, 1, opts, moe=moe)
    return (kernels.phases(), layer_saved_tensors(model, 1, opts, moe=moe),
            tp_layer_collectives(model, 1, opts, moe=moe), layer_tensors(model, opts, moe=moe))


def _other_mlp(model, moe):
    """(the model, with experts or not) with only its MLP changed: the experts off, or a dense MLP twice as wide."""
    return (model, False) if moe else (replace(model, ffn_hidden=2 * model.ffn_size), False)


def _other_attention(model):
    """The model with only its attention changed: a wider KV latent (latent attention), else QK-norm toggled."""
    if model.mla is not None:
        return replace(model, mla=replace(model.mla, kv_lora_rank=2 * model.mla.kv_lora_rank))
    return replace(model, qk_norm=not model.qk_norm)


@pytest.mark.parametrize(("name", "opts", "moe"), CASES, ids=[c[0] for c in CASES])
def test_the_attention_and_mlp_parts_are_the_block(name, opts, moe):
    """Each part holds its sublayer's items and no other's: the attention part does not move when only the MLP
    changes, the MLP part does not move when only the attention changes (a name put in the wrong sublayer would);
    the parts' parameters are the block's count and their FLOPs the block's closed form (pipesim.model.flops)."""
    model = load_hf_config(name, seq=4096)
    attention, mlp = _parts(opts)
    other_mlp, other_moe = _other_mlp(model, moe)
    assert _part(model, attention, moe) == _part(other_mlp, attention, other_moe)
    assert _part(model, mlp, moe) == _part(_other_attention(model), mlp, moe)
    assert _part(model, attention, moe) != _part(_other_attention(model), attention, moe)  # each variant moves its own
    assert _part(model, mlp, moe) != _part(other_mlp, mlp, other_moe)
    assert layer_params(model, opts, moe=moe) == \
        layer_params(model, attention, moe=moe) + layer_params(model, mlp, moe=moe)
    saved = [layer_saved_tensors(model, 1, o, moe=moe) for o in (opts, attention, mlp)]
    if opts.recompute == "full":  # each part is a layer of its own there: it keeps its input, as the block does
        assert saved[0] == saved[1] == saved[2] == [saved[0][0]] and saved[0][0].name == "layer input"
    else:
        assert Counter(saved[0]) == Counter(saved[1]) + Counter(saved[2]) and saved[1] and saved[2]
    work = [gpt_stage_work(model, 1, StageLayers.uniform(1, int(moe)), first=False, last=False, opts=o)
            for o in (opts, attention, mlp)]
    for key in "FIW":
        assert work[0].flops[key] == work[1].flops[key] + work[2].flops[key]
    assert work[0].param_count == work[1].param_count + work[2].param_count


def test_the_sublayers_are_told_apart_by_name():
    assert [kernel_sublayer(n) for n in ("QKV", "flash attention backward", "attention RMSNorm", "RoPE on Q and K",
                                         "projection wgrad", "KV up dgrad", "softmax")] == ["attention"] * 7
    assert [kernel_sublayer(n) for n in ("FC1", "MLP RMSNorm", "SwiGLU backward", "expert FC2 wgrad", "router",
                                         "token permute", "shared gate sigmoid", "squared ReLU: square",
                                         "MLP bias-dropout-add")] == ["mlp"] * 9
    assert saved_sublayer("attention output (projection input)") == "attention"
    assert saved_sublayer("MLP norm input") == saved_sublayer("ReLU output (squared ReLU's input)") == "mlp"
    assert tensor_sublayer("MLP norm weight") == tensor_sublayer("shared expert gate") == "mlp"
    assert tensor_sublayer("attention sinks") == "attention"


def test_an_unknown_part_is_refused_in_one_line():
    with pytest.raises(PipesimError, match="unknown layer part 'ffn'; choose block, attention, mlp, mamba"):
        LayerOptions(part="ffn")


def test_a_llama_layers_parts_run_what_each_sublayer_runs():
    """Llama 3.1 8B (tp 1): the attention part's forward is its norm, QKV, the flash kernel, RoPE, the projection and
    its residual add; the MLP part's its norm, gate-and-up, SwiGLU, down and its residual add, 2 t h (2 f) + 2 t f h
    FLOPs forward."""
    model = load_hf_config("llama3.1-8b", seq=4096)
    attention, mlp = _parts(LayerOptions(attention="flash"))
    assert sorted(k.name for k in layer_kernels(model, 1, attention).F) == \
        ["QKV", "RoPE on Q and K", "attention RMSNorm", "attention residual add", "flash attention", "projection"]
    mlp_kernels = layer_kernels(model, 1, mlp)
    assert sorted(k.name for k in mlp_kernels.F) == ["FC1", "FC2", "MLP RMSNorm", "MLP residual add", "SwiGLU"]
    t, h, f = 4096, 4096, 14336
    assert mlp_kernels.flops("F") == 2 * t * h * 2 * f + 2 * t * f * h
    assert layer_params(model, mlp) == 3 * h * f + h  # gate, up, down and the MLP's RMSNorm weight
