"""Megatron-core's --activation-func-fp8-input-store: the fused SwiGLU keeps its input (gate and up) for the backward
as FP8, one byte per element, cast there and back by two memory-bound kernels (fused_bias_swiglu.py), counted by hand
for the dense MLP, the experts and the shared experts, with recomputation and the MoE host's launches."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace

import pytest

from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.job import Job
from pipesim.model.activations import layer_saved_tensors
from pipesim.model.config import ModelConfig
from pipesim.model.host_ops import moe_layer_host_ops
from pipesim.model.layer_kernels import FP8_RESTORE, FP8_STORE, layer_kernels
from pipesim.model.moe import MoeConfig
from pipesim.model.options import LayerOptions
from pipesim.parallel_dims import ParallelDims

H, F, FE, E, K, S = 256, 512, 128, 8, 2, 128  # hidden, dense and expert width, experts, top-k, seq
D = 2  # bfloat16
LLAMA = ModelConfig(kind="gpt", hidden=H, layers=4, heads=8, kv_heads=2, ffn_hidden=F, vocab=512, seq=S, batch=8,
                    dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                    positions="rope")
MOE = replace(LLAMA, moe=MoeConfig(E, K, FE, shared_experts=1))
ROUTED = S * K  # b = 1, ep 1: every token-expert pair on this rank
STORE = LayerOptions(attention="flash", act_fp8_store=True)


def _saved(model, opts, moe=False) -> dict[str, int]:
    return {x.name: x.nbytes for x in layer_saved_tensors(model, 1, opts, moe=moe)}


def _bytes(pk, phase: str) -> dict[str, int]:
    return {k.name: k.nbytes for k in pk.phase(phase) if getattr(k, "nbytes", None) is not None}


def test_the_swiglu_inputs_are_saved_as_fp8_and_nothing_else_changes():
    plain, stored = _saved(LLAMA, replace(STORE, act_fp8_store=False)), _saved(LLAMA, STORE)
    assert stored.pop("gate and up (FP8 store)") == plain.pop("gate and up") // D == 2 * S * F
    assert stored == plain
    plain, stored = _saved(MOE, replace(STORE, act_fp8_store=False), True), _saved(MOE, STORE, True)
    assert stored.pop("expert FC1 output (FP8 store)") == plain.pop("expert FC1 output") // D == 2 * ROUTED * FE
    assert stored.pop("shared expert FC1 output (FP8 store)") == plain.pop("shared expert FC1 output") // D == \
        2 * S * FE
    assert stored == plain
    # moe_act re-runs the experts' activation: its checkpoint keeps the input as it came (bf16); the shared experts'
    # activation is not moe_act's
    act = replace(STORE, recompute="selective", recompute_modules=("moe_act",))
    kept = _saved(MOE, act, True)
    assert kept["expert FC1 output"] == 2 * ROUTED * FE * D and "shared expert FC1 output (FP8 store)" in kept
    # under mlp recomputation the dense MLP keeps nothing of its own to store
    assert not any("FP8 store" in n for n in _saved(LLAMA, replace(STORE, recompute="selective",
                                                                   recompute_modules=("mlp",))))


def test_the_casts_there_and_back_by_hand():
    dense = layer_kernels(LLAMA, 1, STORE)
    n = 2 * S * F  # gate and up elements
    assert (_bytes(dense, "F")[FP8_STORE], _bytes(dense, "I")[FP8_RESTORE]) == (n * (D + 1), n * (1 + D))
    assert FP8_STORE not in _bytes(layer_kernels(LLAMA, 1, replace(STORE, act_fp8_store=False)), "F")
    moe = layer_kernels(MOE, 1, STORE, moe=True)
    f, i = _bytes(moe, "F"), _bytes(moe, "I")
    assert (f[f"expert {FP8_STORE}"], i[f"expert {FP8_RESTORE}"]) == (2 * ROUTED * FE * (D + 1),) * 2
    assert (f[f"shared {FP8_STORE}"], i[f"shared {FP8_RESTORE}"]) == (2 * S * FE * (D + 1),) * 2
    names = [k.name for k in moe.phase("F")]
    assert names.index(f"expert {FP8_STORE}") == names.index("expert SwiGLU") + 1  # right after the activation
    # recomputed, the activation casts again: mlp's re-run (dense) and moe_act's (experts) in I
    rerun = layer_kernels(LLAMA, 1, replace(STORE, recompute="selective", recompute_modules=("mlp",)))
    assert [k.name for k in rerun.phase("I")].count(FP8_STORE) == 1
    act = layer_kernels(MOE, 1, replace(STORE, recompute="selective", recompute_modules=("moe_act",)), moe=True)
    assert [k.name for k in act.phase("I")].count(f"expert {FP8_STORE}") == 1


def test_the_moe_host_launches_each_cast():
    plain = LayerOptions(attention="flash")
    a, b = moe_layer_host_ops(MOE, plain), moe_layer_host_ops(MOE, STORE)
    assert (b.launches_f - a.launches_f, b.launches_i - a.launches_i, b.launches_w - a.launches_w) == (2, 2, 0)
    act = ("moe_act",)
    a, b = (moe_layer_host_ops(MOE, replace(o, recompute="selective", recompute_modules=act)) for o in (plain, STORE))
    assert b.launches_i - a.launches_i == 2 + 1  # the restores, and the re-run activation's cast


@pytest.mark.parametrize("change,message", [
    (dict(model=replace(LLAMA, activation="gelu")), "the model's MLP runs gelu (Megatron-core supports it only for "
                                                   "SwiGLU)"),
    (dict(opts=dict(recompute="op")), "not with --recompute op"),
])
def test_layers_it_does_not_suit_are_refused(change, message):
    model = change.get("model", LLAMA)
    with pytest.raises(PipesimError, match=re.escape(message)):
        replace(STORE, **change.get("opts", {})).check(model)


def test_the_flag_on_the_command_line(capsys):
    base = ["simulate", "1f1b", "--stages", "2", "--microbatches", "4", "--model-config", "llama3-8b", "--seq", "1024",
            "--batch", "8", "--hardware", "dgx-h100", "--layers", "4"]
    assert main(base + ["--activation-func-fp8-input-store", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["options"]["activation_func_fp8_input_store"] is True
    assert main(base + ["--json"]) == 0
    assert "activation_func_fp8_input_store" not in json.loads(capsys.readouterr().out)["options"]
    assert Job(act_fp8_store=True).flags() == ["--activation-func-fp8-input-store"]
    assert main(base + ["--activation-func-fp8-input-store", "--no-kernel-fusion"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("pipesim: error: --activation-func-fp8-input-store is Megatron-core's fused SwiGLU "
                   "(bias_activation_fusion): not with --no-kernel-fusion")
    mlp = ["simulate", "1f1b", "--stages", "2", "--microbatches", "4", "--model", "mlp", "--hidden", "64",
           "--layers", "4", "--batch", "8", "--activation-func-fp8-input-store"]
    assert main(mlp) == 2
    assert capsys.readouterr().err.strip().endswith("--activation-func-fp8-input-store needs a transformer "
                                                    "(--model gpt or --model-config), not --model mlp")
    with pytest.raises(PipesimError, match="stores SwiGLU's input"):
        Job(ParallelDims(), act_fp8_store=True).check(replace(LLAMA, activation="gelu"))


def test_the_planner_plans_it_and_exports_it(capsys, tmp_path):
    """Every candidate stores in FP8; the winner's pipesim command re-simulates to its own step, and Megatron's
    arguments carry the flag. A GeLU model is refused in one line before any candidate."""
    swiglu = ["--model", "gpt", "--hidden", "512", "--ffn-hidden", "1024", "--activation", "swiglu", "--layers", "4",
              "--heads", "8", "--seq", "512", "--vocab", "8000", "--batch", "16", "--dtype", "bfloat16"]
    out = tmp_path / "plan.json"
    assert main(["plan", *swiglu, "--hardware", "dgx-h100", "--gpus", "8", "--framework", "megatron-core",
                 "--activation-func-fp8-input-store", "--recompute", "none", "--max-candidates", "20",
                 "--json", str(out)]) == 0
    capsys.readouterr()
    data = json.loads(out.read_text())
    argv = shlex.split(data["winner"]["simulate_command"])
    assert "--activation-func-fp8-input-store" in argv and "--activation-func-fp8-input-store" in \
        data["winner"]["megatron_args"]
    assert main(argv[1:] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == data["rows"][0]["step_time"]
    gelu = [a for a in swiglu if a not in ("--activation", "swiglu")]
    assert main(["plan", *gelu, "--hardware", "dgx-h100", "--gpus", "8", "--activation-func-fp8-input-store"]) == 2
    assert capsys.readouterr().err.strip().endswith("(Megatron-core supports it only for SwiGLU)")
