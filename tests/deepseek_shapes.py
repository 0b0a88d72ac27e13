"""DeepSeek-V3's shapes shared by its tests (tests/test_deepseek_v3.py, tests/test_latent_attention.py): the
bundled config and its sizes (arXiv:2412.19437, config.json), the parameter groups the report counts, and a
DeepSeek-shaped model small enough to run in torch."""

from __future__ import annotations

from pipesim.model.config import ModelConfig
from pipesim.model.hf_config import load_hf_config
from pipesim.model.latent_attention import LatentAttention

V3 = load_hf_config("deepseek-v3", seq=4096, batch=32)
H, A, V, L = 7168, 128, 129280, 61  # hidden, heads, vocabulary, layers
DQ, DC, NOPE, ROPE, DV = 1536, 512, 128, 64, 128  # q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head_dim
F, FE, E, K = 18432, 2048, 256, 8  # dense MLP width, expert width, routed experts, experts per token
ATTENTION = H * DQ + DQ + DQ * A * (NOPE + ROPE) + H * (DC + ROPE) + DC + DC * A * (NOPE + DV) + A * DV * H
ROUTER = H * E + E  # the gate's weight and its e_score_correction_bias
EXPERT = 3 * H * FE  # gate_proj, up_proj, down_proj of one routed (or the one shared) expert
MTP_OWN = 2 * H + 2 * H * H + H  # enorm, hnorm, eh_proj (2h -> h, bias-free), shared_head.norm


def tiny(**kw) -> ModelConfig:
    """A DeepSeek-shaped model small enough to run in torch: h 64, 4 heads, latents 32 / 16, heads 8 + 4 / 8."""
    base = dict(kind="gpt", hidden=64, heads=4, seq=16, layers=2, vocab=100, batch=2, dtype="float32",
                ffn_hidden=48, activation="swiglu", norm="rmsnorm", dropout=False, biases=False, positions="rope",
                mla=LatentAttention(q_lora_rank=32, kv_lora_rank=16, qk_nope_dim=8, qk_rope_dim=4, v_head_dim=8))
    return ModelConfig(**{**base, **kw})
