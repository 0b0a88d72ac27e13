"""Multi-head latent attention (DeepSeek-V2/V3): its sizes (`ModelConfig.mla`; one rank's costs: latent_layer.py).

DeepSeek-V3 technical report (arXiv:2412.19437) section 2.1.1, and transformers' / DeepSeek's modeling_deepseek.py:
the queries come from a latent of width `q_lora_rank` (q_a_proj h -> d_q, an RMSNorm, q_b_proj d_q -> heads x
(nope + rope)), or, without one (DeepSeek-V2-Lite), straight from a Q projection h -> heads x (nope + rope); keys and
values come from one shared latent (kv_a_proj_with_mqa h -> d_c + rope, whose last `qk_rope_dim` columns are the
rotary key every head shares, an RMSNorm on the d_c columns, kv_b_proj d_c -> heads x (nope + v)); the attention
core runs with a query/key head dim nope + rope (DeepSeek-V3: 192) and a value head dim `v_head_dim` (128); the
output projection maps heads x v -> h. There is no grouped-query sharing: every head has its own K and V.

Tensor parallelism as Megatron-core's MLASelfAttention (megatron/core/transformer/multi_latent_attention.py, with
gpt_layer_specs' TE spec): the down projections (linear_q_down_proj, linear_kv_down_proj) are `backend.linear()`, a
TELinear in parallel_mode "duplicated": whole on every tp rank, run on the rank's own tokens (b s / tp under sequence
parallelism; their weight gradients are then summed over tp at the step, the `sequence_parallel` attribute); the up
projections (linear_q_up_proj, linear_kv_up_proj, or linear_q_proj without a query latent) are column-parallel (split
by heads, on the all-gathered tokens), and linear_proj is row-parallel. Under sequence parallelism the two latents and
the rotary key are all-gathered before the up projections (pipesim.model.layer_collectives); without it Megatron-core
leaves the rotary key's gradient unreduced over tp (NVIDIA/Megatron-LM issue 1699, its fix PR 6839 still open), so
pipesim refuses latent attention with tp > 1 and no sequence parallelism rather than cost a backward that is wrong.

Here the sizes; pipesim.model.latent_layer has the per-rank linears, parameters and saved tensors, and the kernels,
FLOPs, elementwise bytes and collectives that follow from them live with the dense layer's (layer_kernels, flops,
elementwise, layer_collectives).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError


@dataclass(frozen=True)
class LatentAttention:
    """The widths of multi-head latent attention (config.json's q_lora_rank, kv_lora_rank, qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim); the heads are the model's."""

    q_lora_rank: int | None  # the queries' latent width d_q; None: a plain Q projection h -> heads x (nope + rope)
    kv_lora_rank: int  # the keys' and values' shared latent width d_c
    qk_nope_dim: int  # per head: the query / key part without positions
    qk_rope_dim: int  # per head: the decoupled rotary part (the key's one vector shared by every head)
    v_head_dim: int  # per head: the value (and the attention output) width

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim"):
            _positive(name, getattr(self, name))
        if self.q_lora_rank is not None:
            _positive("q_lora_rank", self.q_lora_rank)
        if self.qk_rope_dim % 2:  # RoPE turns pairs of features
            raise PipesimError(f"latent attention qk_rope_dim {self.qk_rope_dim} is odd: rotary embeddings turn pairs "
                               "of features")

    @property
    def qk_head_dim(self) -> int:
        """Query and key width per head: nope + rope (DeepSeek-V3: 192)."""
        return self.qk_nope_dim + self.qk_rope_dim


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PipesimError(f"latent attention {name} must be a positive integer, got {value!r}")


__all__ = ["LatentAttention"]
