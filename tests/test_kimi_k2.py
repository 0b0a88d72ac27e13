"""Kimi K2 read as what it is: DeepSeek-V3's code with other sizes (pipesim.model.hf_keys.TYPE_ALIASES). Its bundled
config.json, its exact parameter counts against Moonshot AI's published figures (MoonshotAI/Kimi-K2 README.md,
'Model Summary': 1T total, 32B activated, 61 layers of which 1 dense, 384 experts of 2048, 8 per token, 1 shared,
64 heads, MLA, 160K vocabulary), and a file of another Kimi type still refused."""

from __future__ import annotations

import json

import pytest

from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.model.hf_config import hf_key_report, load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.latent_attention import LatentAttention
from pipesim.model.moe import MoeConfig
from pipesim.model.param_counts import active_params, model_params

K2 = load_hf_config("kimi-k2", seq=4096, batch=32)
H, A, V = 7168, 64, 163840  # hidden, heads, vocabulary
DQ, DC, NOPE, ROPE, DV = 1536, 512, 128, 64, 128  # q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head_dim
F, FE, E, K = 18432, 2048, 384, 8  # dense MLP width, expert width, routed experts, experts per token
ATTENTION = H * DQ + DQ + DQ * A * (NOPE + ROPE) + H * (DC + ROPE) + DC + DC * A * (NOPE + DV) + A * DV * H
ROUTER = H * E + E  # the gate's weight and its e_score_correction_bias (topk_method noaux_tc)
EXPERT = 3 * H * FE  # gate_proj, up_proj, down_proj of one routed (or the shared) expert


def test_bundled_config_is_deepseek_v3s_code_with_kimis_sizes(tmp_path):
    """Every key read or listed as ignored, and the model exactly the one its file gives when model_type says
    deepseek_v3 (Moonshot AI's own workaround for a framework that does not know kimi_k2)."""
    cfg = read_hf_config(resolve_model_config("kimi-k2"))
    assert cfg["model_type"] == "kimi_k2" and cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    report = hf_key_report("kimi-k2")
    assert set(report.read) | set(report.ignored) == set(cfg)
    assert {"n_routed_experts", "q_lora_rank", "first_k_dense_replace", "topk_method"} <= set(report.read)
    assert {"routed_scaling_factor", "aux_loss_alpha", "seq_aux"} <= set(report.ignored)
    assert "scoring_func" in report.read
    renamed = tmp_path / "config.json"
    renamed.write_text(json.dumps({**cfg, "model_type": "deepseek_v3"}))
    assert load_hf_config(renamed, seq=4096, batch=32) == K2
    assert K2.moe == MoeConfig(experts=E, top_k=K, expert_ffn=FE, shared_experts=1, dense_layers=1, expert_bias=True,
                               groups=1, group_topk=None, score="sigmoid")  # n_group 1: no group-limited routing
    assert K2.mla == LatentAttention(q_lora_rank=DQ, kv_lora_rank=DC, qk_nope_dim=NOPE, qk_rope_dim=ROPE,
                                     v_head_dim=DV)
    assert (K2.layers, K2.heads, K2.hidden, K2.vocab, K2.mtp_layers, K2.ffn_size) == (61, A, H, V, 0, F)


def test_exact_parameter_counts_round_to_moonshots_figures():
    """One dense layer and 60 MoE layers of 384 experts; the embedding and the head untied. The README's "1T total"
    and "32B activated" (8 routed experts and the shared one per layer, the embedding and the head whole, as for
    DeepSeek-V3: tests/test_deepseek_v3.py)."""
    ends = 2 * V * H + H  # embedding, head, final norm
    dense_layer, moe_layer = ATTENTION + 2 * H + 3 * H * F, ATTENTION + 2 * H + ROUTER + E * EXPERT + EXPERT
    assert model_params(K2) == ends + dense_layer + 60 * moe_layer == 1_026_408_232_448
    assert round(model_params(K2) / 1e12) == 1
    active = ends + dense_layer + 60 * (ATTENTION + 2 * H + ROUTER + K * EXPERT + EXPERT)
    assert active_params(K2) == active == 32_861_500_928 and int(active / 1e9) == 32


def test_other_kimi_types_and_unread_keys_stay_refused(tmp_path):
    """Only the DeepSeek-V3 code is aliased: Kimi K2.5's multimodal wrapper ("kimi_k25") is refused, and a key
    DeepSeek-V3's code does not have refuses a kimi_k2 file as it would a deepseek_v3 one."""
    cfg = read_hf_config(resolve_model_config("kimi-k2"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "model_type": "kimi_k25"}))
    with pytest.raises(PipesimError, match=r"model_type \('kimi_k25': pipesim models llama, .*, kimi_k2, "
                                           r"deepseek_v2, llama4, gemma3\)"):
        load_hf_config(path)
    path.write_text(json.dumps({**cfg, "index_topk": 2048}))
    with pytest.raises(PipesimError, match=r"keys that change the model and pipesim does not model: index_topk "
                                           r"\(unknown to pipesim\); refused"):
        load_hf_config(path)


def test_simulate_from_the_cli(capsys):
    """A 4-layer cut of Kimi K2 (its dense layer and three MoE layers) on 32 H100s, ep 8, the distributed optimizer:
    it runs and lists the file's keys that change nothing pipesim counts in --json."""
    args = ["simulate", "1f1b", "-p", "2", "-m", "4", "--model-config", "kimi-k2", "--seq", "4096", "--batch", "64",
            "--layers", "4", "--ep", "8", "--dp", "16", "--zero", "1", "--hardware", "dgx-h100", "--nodes", "4",
            "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert "scoring_func" in result["model_config"]["read"] and result["step_time"] > 0
