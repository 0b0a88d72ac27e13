"""Megatron-core's --recompute-modules (pipesim.model.recompute_modules): the bytes each module drops per layer, by
hand, on a small MoE model and a small latent-attention one; what each re-runs (kernels, collectives, all-to-alls);
plain --recompute selective unchanged; the one-line refusals; the planner's exports."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest

from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.job import Job
from pipesim.model.activations import layer_activation_bytes, layer_saved_tensors, recompute_working_bytes
from pipesim.model.config import ModelConfig
from pipesim.model.flops import layer_flops
from pipesim.model.kernel_types import Gemm, MemoryBound
from pipesim.model.latent_attention import LatentAttention
from pipesim.model.layer_collectives import ep_layer_exchanges, tp_layer_collectives
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.moe import MoeConfig
from pipesim.model.options import LayerOptions
from pipesim.model.recompute_modules import canonical_modules
from pipesim.parallel_dims import ParallelDims
from pipesim.plan.exports import megatron_args, simulate_command
from pipesim.plan.space import Candidate, PlanRequest

# h 64, 4 query heads and 2 key/value heads of 16, dense MLP 96, 8 experts of 48 (top 2) and one shared expert of 48,
# the first layer dense; bfloat16 (d = 2), no dropout
MOE = ModelConfig(kind="gpt", hidden=64, heads=4, kv_heads=2, ffn_hidden=96, seq=32, layers=4, vocab=100, batch=8,
                  dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                  positions="rope", moe=MoeConfig(8, 2, 48, shared_experts=1, dense_layers=1))
# latent attention: h 64, 4 heads of nope 8 + rope 4 (values 8), latents 32 (Q) and 16 (KV), dense
MLA = ModelConfig(kind="gpt", hidden=64, heads=4, ffn_hidden=48, seq=16, layers=2, vocab=100, batch=2,
                  dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False, positions="rope",
                  mla=LatentAttention(q_lora_rank=32, kv_lora_rank=16, qk_nope_dim=8, qk_rope_dim=4, v_head_dim=8))
B = 2  # sequences per microbatch
# float32 probabilities of the 64 routed tokens (2 x 32 tokens / tp 2 under sp, top-2, etp 1) the weighted SwiGLU
# keeps; 8192 = 2 bytes x 64 x h 64 dispatched tokens
ROUTED_PROBS = 4 * 64


def _opts(*modules: str, **kw) -> LayerOptions:
    """MOE's options: tp 2 with sp, ep 2, expert tp 1, flash; selective with `modules` (none: recompute none)."""
    base = dict(tp=2, sp=True, ep=2, etp=1, attention="flash")
    return LayerOptions(**{**base, "recompute": "selective" if modules else "none", "recompute_modules": modules,
                           **kw})


def _dropped(model: ModelConfig, opts: LayerOptions, *, moe: bool = False) -> dict[str, int]:
    """{name: bytes} the options drop from (or, negative, add to) the layer's saved tensors against no recompute."""
    every = {x.name: x.nbytes for x in layer_saved_tensors(model, B, replace(opts, recompute="none",
                                                                            recompute_modules=()), moe=moe)}
    kept = {x.name: x.nbytes for x in layer_saved_tensors(model, B, opts, moe=moe)}
    out = {name: n for name, n in every.items() if name not in kept}
    return out | {name: -n for name, n in kept.items() if name not in every}


# --- the bytes each module drops, by hand ---
# MOE at tp 2 with sp, b 2: n = 64 tokens, 32 on this rank's residual stream. A dense layer keeps its attention
# norm's input and the QKV input (2 x 32 x 64 = 4096 each), Q (2 x 64 x 64 / 2 = 4096), K and V (2048 each), the
# flash logsumexp (4 x 64 x 2 heads = 512), the projection input (4096), the MLP norm's input and output (4096 each),
# SwiGLU's gate and up (2 x 2 x 64 x 96 / 2 = 12288) and the down projection's input (6144). A MoE layer (its 32
# tokens routed to 64 token-expert pairs here: 64 x 2 / tp 2) keeps the router's float32 probabilities (4 x 32 x 8 =
# 1024), the dispatched tokens (2 x 64 x 64 = 8192), the experts' FC1 output (2 x 64 x 96 = 12288) and FC2 input
# (2 x 64 x 48 = 6144), the k outputs per token (2 x 32 x 2 x 64 = 8192), and the shared expert's FC1 output
# (2 x 64 x 2 x 24 = 6144) and FC2 input (2 x 64 x 24 = 3072), its width 48 split over tp.

def test_the_hand_counts_of_one_layer_without_recomputation():
    none = _opts()
    common = 4096 * 3 + 4096 + 2048 * 2 + 512 + 4096 * 2  # norm, QKV and projection inputs; Q, K, V; lse; MLP norm
    assert layer_activation_bytes(MOE, B, none) == common + 12288 + 6144 == 47616
    # router probabilities, dispatched tokens, FC1 output, FC2 input, routed probabilities, shared FC1 out, FC2 in
    moe = common + 1024 + 8192 + 12288 + 6144 + ROUTED_PROBS + 6144 + 3072
    assert layer_activation_bytes(MOE, B, none, moe=True) == moe == 66304


@pytest.mark.parametrize("modules,moe,dropped", [
    (("core_attn",), False, {"attention logsumexp": 512}),
    (("core_attn",), True, {"attention logsumexp": 512}),
    (("mlp",), False, {"MLP input": 4096, "gate and up": 12288, "down projection input": 6144}),
    (("mlp",), True, {}),  # transformer_layer.py: a MoE layer's MLP is not the dense MLP checkpoint
    (("layernorm",), True, {"MLP input": 4096}),  # the MoE layer's pre-MLP norm output (the router's input)
    (("layernorm",), False, {}),  # TE fuses both norms of a dense layer into QKV and FC1: IdentityOp, skipped
    (("moe_act",), True, {"expert FC2 input": 6144}),
    (("moe_act",), False, {}),
    (("shared_experts",), True, {"shared expert FC1 output": 6144, "shared expert FC2 input": 3072}),
    (("moe",), True, {"router probabilities": 1024, "dispatched tokens (expert FC1 input)": 8192,
                      "expert FC1 output": 12288, "expert FC2 input": 6144,
                      "routed probabilities (weighted activation input)": ROUTED_PROBS,
                      "shared expert FC1 output": 6144, "shared expert FC2 input": 3072}),
    (("layernorm", "moe_act"), True, {"MLP input": 4096, "expert FC2 input": 6144}),
])
def test_each_module_drops_exactly_its_tensors(modules, moe, dropped):
    opts = _opts(*modules)
    assert _dropped(MOE, opts, moe=moe) == dropped
    full = layer_activation_bytes(MOE, B, _opts(), moe=moe)
    assert layer_activation_bytes(MOE, B, opts, moe=moe) == full - sum(dropped.values())


def test_latent_attention_modules_drop_the_up_projections_outputs_and_the_input_norms():
    """MLA at tp 1, b 2: n = 32 tokens. mla_up_proj drops the normed latents (2 x 32 x 32 = 2048, 2 x 32 x 16 = 1024)
    and Q, K (2 x 32 x 4 x 12 = 3072 each) and V (2 x 32 x 4 x 8 = 2048), and keeps the rotary key its checkpoint
    takes as input (2 x 32 x 4 = 256); layernorm drops MLA's input norm output (the down projections' input, 2 x 32
    x 64 = 4096): its down projections are plain linears, so the norm is a module of its own."""
    up = LayerOptions(recompute="selective", recompute_modules=("mla_up_proj",), attention="flash")
    assert _dropped(MLA, up) == {"Q latent normed (Q up input)": 2048, "KV latent normed (KV up input)": 1024,
                                 "Q": 3072, "K": 3072, "V": 2048, "rotary key (up-projection checkpoint input)": -256}
    norm = LayerOptions(recompute="selective", recompute_modules=("layernorm",), attention="flash")
    assert _dropped(MLA, norm) == {"Q/KV down input": 4096}
    assert recompute_working_bytes(MLA, B, up) == 11264 and recompute_working_bytes(MLA, B, norm) == 4096


def test_the_working_set_is_the_larger_blocks_re_created_tensors():
    """The MLP block's re-created tensors are freed by its backward before the attention block's are re-created."""
    assert recompute_working_bytes(MOE, B, _opts("layernorm", "moe_act"), moe=True) == 4096 + 6144
    assert recompute_working_bytes(MOE, B, _opts("core_attn", "moe_act"), moe=True) == 6144
    assert recompute_working_bytes(MOE, B, _opts("core_attn", "mlp")) == 22528
    assert recompute_working_bytes(MOE, B, _opts("core_attn")) == 512


# --- plain selective is core_attn, bit for bit ---

def test_plain_selective_is_the_core_attn_module_bit_for_bit():
    plain = LayerOptions(tp=2, sp=True, ep=2, etp=1, attention="flash", recompute="selective")
    named = _opts("core_attn")
    assert plain == named and plain.recompute_modules == () and plain.modules == ("core_attn",)
    for moe in (False, True):
        assert layer_kernels(MOE, B, plain, moe=moe) == layer_kernels(MOE, B, named, moe=moe)
        assert layer_saved_tensors(MOE, B, plain, moe=moe) == layer_saved_tensors(MOE, B, named, moe=moe)
    assert Job(recompute="selective", recompute_modules=("core_attn",)) == Job(recompute="selective")
    assert Job(recompute="selective").flags() == ["--recompute", "selective"]
    assert canonical_modules("selective", ["moe", "layernorm", "moe"]) == ("layernorm", "moe")  # Megatron's order


# --- the time effect ---

def _extra(opts: LayerOptions, *, moe: bool) -> list:
    """The kernels the options add to I over no recomputation."""
    base = list(layer_kernels(MOE, B, _opts(), moe=moe).I)
    extra = list(layer_kernels(MOE, B, opts, moe=moe).I)
    for k in base:
        extra.remove(k)
    return extra


def test_each_module_re_runs_its_forward_kernels_before_the_backward():
    act = [k for k in layer_kernels(MOE, B, _opts(), moe=True).F if k.name == "expert SwiGLU"]
    assert _extra(_opts("moe_act"), moe=True) == act and isinstance(act[0], MemoryBound)
    assert [k.name for k in _extra(_opts("layernorm"), moe=True)] == ["MLP RMSNorm"]
    assert _extra(_opts("layernorm"), moe=False) == []
    dense = _extra(_opts("mlp"), moe=False)
    assert [k.name for k in dense] == ["FC1", "MLP RMSNorm", "SwiGLU", "FC2"]
    assert sum(k.flops for k in dense if isinstance(k, Gemm)) == 6 * B * MOE.seq * 64 * 96 // 2
    assert layer_flops(MOE, B, _opts("mlp")).I == layer_flops(MOE, B, _opts()).I + 6 * B * MOE.seq * 64 * 96 // 2
    f = layer_kernels(MOE, B, _opts(), moe=True)
    moe_f = [k for k in f.F if k.name.startswith(("router", "token", "expert", "shared"))]
    assert sorted(map(repr, _extra(_opts("moe"), moe=True))) == sorted(map(repr, moe_f))
    shared = [k.name for k in _extra(_opts("shared_experts"), moe=True)]
    assert shared == ["shared FC1", "shared SwiGLU", "shared FC2"]
    nested = [k.name for k in _extra(_opts("moe", "moe_act", "shared_experts"), moe=True)]
    assert nested.count("expert SwiGLU") == 2 and nested.count("shared FC1") == 2  # a checkpoint inside moe's


def test_moe_re_runs_its_all_to_alls_and_tp_collectives():
    assert [c.what for c in ep_layer_exchanges(MOE, B, _opts("moe")) if c.what.startswith("recompute")] == \
        ["recompute: MoE dispatch", "recompute: MoE combine"]
    assert not [c for c in ep_layer_exchanges(MOE, B, _opts("layernorm", "moe_act")) if c.what.startswith("re")]
    rerun = [c.what for c in tp_layer_collectives(MOE, B, _opts("moe"), moe=True) if c.what.startswith("recompute")]
    assert rerun == ["recompute: shared experts' input", "recompute: shared experts' output"]
    dense = [c.what for c in tp_layer_collectives(MOE, B, _opts("mlp")) if c.what.startswith("recompute")]
    assert dense == ["recompute: MLP input (before MLP up)", "recompute: MLP output"]


# --- refusals: one line, exit 2 ---

DENSE = replace(MOE, moe=None)


@pytest.mark.parametrize("model,opts,message", [
    (DENSE, dict(recompute_modules=("moe_act",)), "--recompute-modules moe_act needs a mixture-of-experts model"),
    (DENSE, dict(recompute_modules=("moe",)), "--recompute-modules moe needs a mixture-of-experts model"),
    (DENSE, dict(recompute_modules=("shared_experts",)),
     "--recompute-modules shared_experts needs a mixture-of-experts model with shared experts"),
    (MOE, dict(recompute_modules=("mla_up_proj",)), "--recompute-modules mla_up_proj needs multi-head latent "
     "attention (Megatron-core: only supported with multi_latent_attention)"),
    (replace(MOE, moe=MoeConfig(8, 2, 48)), dict(recompute_modules=("mlp",)), "--recompute-modules mlp recomputes "
     "dense MLPs, and every layer of this model has experts (use moe or moe_act)"),
    (DENSE, dict(recompute_modules=("layernorm",)), "--recompute-modules layernorm: Megatron-core's "
     "Transformer-Engine layer fuses both norms of a dense layer into the linears after them, so nothing is "
     "recomputed"),
])
def test_a_module_with_nothing_to_recompute_is_refused_in_one_line(model, opts, message):
    with pytest.raises(PipesimError) as err:
        LayerOptions(tp=2, sp=True, attention="flash", recompute="selective", **opts).check(model)
    assert str(err.value) == message


@pytest.mark.parametrize("kw,message", [
    (dict(recompute="full", recompute_modules=("moe",)),
     "--recompute-modules needs --recompute selective (Megatron's --recompute-granularity selective), got "
     "--recompute full"),
    (dict(recompute="selective", recompute_modules=("attn",)),
     "unknown --recompute-modules 'attn'; choose core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, "
     "shared_experts"),
])
def test_bad_modules_are_refused_by_the_job_in_one_line(kw, message):
    with pytest.raises(PipesimError) as err:
        Job(**kw)
    assert str(err.value) == message


def test_the_cli_refuses_with_exit_2(capsys):
    argv = ["simulate", "1f1b", "-p", "2", "-m", "4", "--model-config", "llama3-8b", "--seq", "1024", "--batch", "8",
            "--hardware", "dgx-h100", "--recompute", "selective", "--recompute-modules", "moe_act"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == "pipesim: error: --recompute-modules moe_act needs a mixture-of-experts model"
    assert main(argv[:-4] + ["--recompute-modules", "mlp"]) == 2
    assert "needs --recompute selective" in capsys.readouterr().err


def test_the_cli_runs_the_modules_and_they_lower_the_peak(tmp_path):
    base = ["simulate", "1f1b", "-p", "2", "-m", "4", "--model-config", "qwen3-30b-a3b", "--seq", "4096", "--batch",
            "32", "--dp", "8", "--ep", "8", "--hardware", "dgx-h100", "--nodes", "2", "--recompute", "selective"]
    data = {}
    for name, extra in (("core", []), ("norm_act", ["--recompute-modules", "layernorm", "moe_act"])):
        out = tmp_path / f"{name}.json"
        assert main(base + extra + ["--json", str(out)]) == 0
        data[name] = json.loads(out.read_text())
    assert data["norm_act"]["options"]["recompute_modules"] == ["moe_act", "layernorm"]
    assert "recompute_modules" not in data["core"]["options"]
    peak = {name: max(d["memory"]["peak_activation_bytes"]) for name, d in data.items()}
    assert peak["norm_act"] < peak["core"]


# --- the planner's exports ---

def test_the_planner_exports_megatron_core_flags():
    req = PlanRequest(MOE, None, 8, recompute_modules=("moe_act", "layernorm"))  # type: ignore[arg-type]
    c = Candidate("1f1b", 2, 1, 2, 2, 1, 4, "selective", 1, True, 1, 2, 1, ("moe_act", "layernorm"))
    args = megatron_args(c, req)
    i = args.index("--recompute-granularity")
    assert args[i:i + 5] == ["--recompute-granularity", "selective", "--recompute-modules", "moe_act", "layernorm"]
    argv = simulate_command(c, [], [])
    assert "--recompute selective --zero 1 --recompute-modules moe_act layernorm" in shlex.join(argv)
    job = c.job(Job())
    assert job.recompute_modules == ("moe_act", "layernorm") and job.dims == ParallelDims(pp=2, dp=2, tp=2, ep=2, etp=1)
    assert replace(c, recompute="full").job(Job()).recompute_modules == ()
