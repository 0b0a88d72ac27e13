"""The executor's small mixture-of-experts model, shared by its tests: `--model moe`'s flags and the ModelConfig they
build."""

from __future__ import annotations

from pipesim.model.config import ModelConfig
from pipesim.model.moe import MoeConfig

STEPS = 2
MOE = ["--model", "moe", "--hidden", "16", "--heads", "2", "--seq", "8", "--vocab", "32", "--layers", "4",
       "--batch", "8", "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32"]


def moe_model(capacity_factor: float | None = None, shared: int | None = None, balance: str = "aux_loss",
              aux: float = 0.0, z: float = 0.0, drop_policy: str = "probs") -> ModelConfig:
    """The ModelConfig `MOE`'s flags build (with --moe-expert-capacity-factor / a shared expert / a load-balancing
    loss: --moe-router-load-balancing-type, --moe-aux-loss-coeff / a z-loss: --moe-z-loss-coeff)."""
    return ModelConfig(kind="gpt", hidden=16, heads=2, seq=8, vocab=32, layers=4, batch=8,
                       moe=MoeConfig(experts=4, top_k=2, expert_ffn=32, capacity_factor=capacity_factor,
                                     shared_experts=1 if shared else 0, shared_ffn=shared, balance=balance,
                                     aux_loss_coeff=aux, z_loss_coeff=z, drop_policy=drop_policy))
