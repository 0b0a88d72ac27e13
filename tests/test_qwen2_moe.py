"""Qwen1.5-MoE and Qwen2-MoE (transformers' Qwen2MoeForCausalLM): Qwen3-MoE's experts beside a shared expert behind a
sigmoid gate (MoeConfig.shared_gate, pipesim.model.shared_gate), q/k/v biases; the bundled files' exact parameter
counts against the published totals, the gate's kernels, saved tensors, FLOPs and parameters, and Megatron-core's
--moe-shared-expert-gate."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipesim.cli import build_parser, main
from pipesim.commands.common import model_config
from pipesim.errors import PipesimError
from pipesim.model.activations import layer_saved_tensors
from pipesim.model.config import ModelConfig
from pipesim.model.flops import moe_mlp_delta
from pipesim.model.hf_config import load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.moe import MoeConfig
from pipesim.model.moe_layer import moe_block_params
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import active_params, model_params
from pipesim.model.weight_tensors import layer_tensors

# (hidden, layers, heads, kv heads, vocabulary, experts, top-k, expert width, shared width) of the two bundled files
SHAPES = {"qwen1.5-moe-a2.7b": (2048, 24, 16, 16, 151_936, 60, 4, 1408, 5632),
          "qwen2-57b-a14b": (3584, 28, 28, 4, 151_936, 64, 8, 2560, 20480)}
# (total, active, the digits they are given to): Qwen/Qwen1.5-MoE-A2.7B's model card, "14.3B parameters in total and
# 2.7B activated parameters during runtime"; Qwen/Qwen2-57B-A14B's, whose name gives 57B and 14B activated
PUBLISHED = {"qwen1.5-moe-a2.7b": (14.3, 2.7, 1), "qwen2-57b-a14b": (57, 14, 0)}


def _counts(h: int, layers: int, heads: int, kv: int, vocab: int, e: int, k: int, f: int, s: int,
            experts: int) -> int:
    """q, k, v with their biases, o; the two RMSNorms; the router h x E; `experts` SwiGLU experts of f; the shared
    SwiGLU expert of s and its gate's h; the untied embedding and head, the final norm."""
    d = h // heads
    attention = h * (heads + 2 * kv) * d + (heads + 2 * kv) * d + heads * d * h + 2 * h
    layer = attention + h * e + experts * 3 * h * f + 3 * h * s + h
    return layers * layer + 2 * vocab * h + h


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_bundled_files_are_read_as_transformers_builds_them(name):
    h, layers, heads, kv, vocab, e, k, f, s = SHAPES[name]
    model = load_hf_config(name, seq=4096)
    assert model.moe == MoeConfig(experts=e, top_k=k, expert_ffn=f, shared_experts=1, shared_ffn=s, shared_gate=True)
    assert (model.qkv_bias, model.biases, model.activation, model.norm, model.tied_embeddings) == (
        True, False, "swiglu", "rmsnorm", False)
    assert model_params(model) == _counts(h, layers, heads, kv, vocab, e, k, f, s, experts=e)
    assert active_params(model) == _counts(h, layers, heads, kv, vocab, e, k, f, s, experts=k)
    total, active, digits = PUBLISHED[name]
    assert (round(model_params(model) / 1e9, digits), round(active_params(model) / 1e9, digits)) == (total, active)


def test_biases_beyond_q_k_v_are_refused_in_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**read_hf_config(resolve_model_config("qwen1.5-moe-a2.7b")), "attention_bias": True}))
    with pytest.raises(PipesimError, match=r"a qwen2_moe layer's biases sit on q, k and v alone \(Qwen2MoeAttention "
                                           r"builds them by its qkv_bias\)"):
        load_hf_config(path)


def test_qkv_bias_false_and_no_shared_expert_are_read(tmp_path):
    cfg = {**read_hf_config(resolve_model_config("qwen1.5-moe-a2.7b")), "qkv_bias": False,
           "shared_expert_intermediate_size": 0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    model = load_hf_config(path, seq=4096)
    assert (model.qkv_bias, model.moe.shared_experts, model.moe.shared_gate) == (False, 0, False)


def _small(**moe) -> ModelConfig:
    experts = MoeConfig(**{"experts": 8, "top_k": 2, "expert_ffn": 256, "shared_experts": 1, "shared_ffn": 512,
                           **moe})
    return ModelConfig(kind="gpt", hidden=256, layers=4, heads=4, seq=512, vocab=1024, batch=8, dtype="bfloat16",
                       ffn_hidden=1024, norm="rmsnorm", dropout=False, biases=False, positions="rope",
                       activation="swiglu", moe=experts)


def test_the_gate_is_three_kernels_each_way_on_the_layers_input_tokens():
    """F: the GEMV n x 1 x h, the sigmoid (2 n d), the product (2 n h d + n d); I: the product's two gradients
    (4 n h d + 2 n d), the sigmoid's (3 n d), the GEMV's input gradient n x h x 1; W: its weight gradient h x 1 over n
    tokens; n the rank's tokens (split over tp under sequence parallelism, as the router's)."""
    plain, gated = _small(), _small(shared_gate=True)
    for sp, tp in ((False, 1), (True, 2)):
        opts = LayerOptions(attention="flash", tp=tp, sp=sp, ep=2)
        n, h, d = 512 // tp if sp else 512, 256, 2
        for phase in "FIW":
            extra = [k for k in layer_kernels(gated, 1, opts, moe=True).phase(phase)
                     if k not in layer_kernels(plain, 1, opts, moe=True).phase(phase)]
            got = [(k.name, getattr(k, "nbytes", None) or (k.m, k.n, k.k)) for k in extra]
            assert got == {
                "F": [("shared gate", (n, 1, h)), ("shared gate sigmoid", 2 * n * d),
                      ("shared gate product", (2 * n * h + n) * d)],
                "I": [("shared gate product backward", (4 * n * h + 2 * n) * d),
                      ("shared gate sigmoid backward", 3 * n * d), ("shared gate dgrad", (n, h, 1))],
                "W": [("shared gate wgrad", (h, 1, n))]}[phase]
        saved = {x.name: x.nbytes for x in layer_saved_tensors(gated, 1, opts, moe=True)}
        assert {k: v for k, v in saved.items() if k.startswith("shared gate")} == {
            "shared gate product input (shared experts' output)": n * h * d, "shared gate scores": n * d}
        assert moe_block_params(gated, opts) - moe_block_params(plain, opts) == h  # whole on every tp rank
    assert moe_mlp_delta(gated, 100) - moe_mlp_delta(plain, 100) == 2 * 100 * 256  # 2 n h per phase
    assert sum(t.numel for t in layer_tensors(gated, LayerOptions(), moe=True)) - sum(
        t.numel for t in layer_tensors(plain, LayerOptions(), moe=True)) == 256
    # selective recomputation of the shared experts re-runs the gate and drops what it keeps
    shared = LayerOptions(attention="flash", recompute="selective", recompute_modules=("shared_experts",))
    assert not any(x.name.startswith("shared gate") for x in layer_saved_tensors(gated, 1, shared, moe=True))
    rerun = [k.name for k in layer_kernels(gated, 1, shared, moe=True).I]
    assert rerun[:rerun.index("shared FC2") + 4][-3:] == ["shared gate", "shared gate sigmoid",
                                                          "shared gate product"]


def test_the_gate_needs_shared_experts():
    with pytest.raises(PipesimError, match="gates the shared experts: the model has none"):
        MoeConfig(experts=4, top_k=2, expert_ffn=64, shared_gate=True)


def _model(argv: list[str]) -> ModelConfig:
    return model_config(build_parser().parse_args(["simulate", "1f1b", *argv]))


def test_megatrons_flag_gates_the_shared_expert_and_a_launch_reads_as_the_config(tmp_path, capsys):
    moe = ["--model", "moe", "--layers", "4", "--hidden", "256", "--heads", "4", "--seq", "512", "--batch", "8",
           "--num-experts", "8", "--moe-shared-expert-intermediate-size", "512"]
    assert _model([*moe, "--moe-shared-expert-gate"]).moe.shared_gate
    assert not _model(moe).moe.shared_gate
    with pytest.raises(PipesimError, match="gates the shared experts: the model has none"):
        _model([*moe[:-2], "--moe-shared-expert-gate"])
    over = _model(["--model-config", "qwen3-30b-a3b", "--seq", "4096", "--moe-shared-expert-intermediate-size",
                   "768", "--moe-shared-expert-gate"])
    assert (over.moe.shared_ffn, over.moe.shared_gate) == (768, True)
    # Qwen2-57B-A14B as a Megatron-core launch (its config.json's shapes; Megatron pads the vocabulary unless told)
    launch = ("--num-layers 28 --hidden-size 3584 --ffn-hidden-size 18944 --num-attention-heads 28 "
              "--group-query-attention --num-query-groups 4 --seq-length 4096 --max-position-embeddings 131072 "
              "--micro-batch-size 1 --global-batch-size 64 --position-embedding-type rope --rotary-base 1000000 "
              "--normalization RMSNorm --norm-epsilon 1e-6 --swiglu --disable-bias-linear --add-qkv-bias "
              "--untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0 --num-experts 64 "
              "--moe-router-topk 8 --moe-ffn-hidden-size 2560 --moe-shared-expert-intermediate-size 20480 "
              "--moe-shared-expert-gate --moe-grouped-gemm --moe-token-dispatcher-type alltoall "
              "--expert-model-parallel-size 8 --tensor-model-parallel-size 2 --sequence-parallel "
              "--pipeline-model-parallel-size 4 --use-distributed-optimizer --bf16 --vocab-size 151936 "
              "--make-vocab-size-divisible-by 64 --use-flash-attn --train-iters 10 --lr 1e-4")
    path = tmp_path / "qwen2.sh"
    path.write_text(f"torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py {launch}\n")
    layout = ["1f1b", "--stages", "4", "--batch", "64", "--microbatch-size", "1", "--tp", "2", "--sequence-parallel",
              "--dp", "8", "--ep", "8", "--etp", "2", "--hardware", "dgx-h100", "--nodes", "8", "--zero", "1",
              "--attention", "flash", "--seq", "4096", "--framework", "megatron-core"]
    capsys.readouterr()
    assert main(["simulate", "--from-megatron", str(path), "--hardware", "dgx-h100", "--nodes", "8", "--json"]) == 0
    mine = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--model-config", "qwen2-57b-a14b", *layout, "--json"]) == 0
    theirs = json.loads(capsys.readouterr().out)
    assert mine["step_time"] == theirs["step_time"]
    assert mine["memory"]["param_bytes"] == theirs["memory"]["param_bytes"]


def test_a_plans_megatron_export_carries_the_gate(capsys):
    assert main(["plan", "--model-config", "qwen1.5-moe-a2.7b", "--seq", "4096", "--batch", "64", "--hardware",
                 "dgx-h100", "--gpus", "8", "--top", "1", "--attention", "flash"]) == 0
    assert "--moe-shared-expert-gate" in capsys.readouterr().out


def test_no_field_is_lost_in_to_dict():
    model = _small(shared_gate=True)
    assert ModelConfig(**model.to_dict()) == model
    assert "shared_gate" not in replace(model, moe=replace(model.moe, shared_gate=False)).to_dict()["moe"]
