"""Gemma's layer (Gemma 2 and 3): sandwich norms, GeGLU, and embeddings scaled by the square root of the width.

transformers' models/gemma3/modeling_gemma3.py (Gemma3DecoderLayer) normalises each block's output before its
residual add, `post_attention_layernorm` after the attention's projection and `post_feedforward_layernorm` after the
MLP's down projection, beside the usual pre-norms (`input_layernorm`, `pre_feedforward_layernorm`): four RMSNorms a
layer (`ModelConfig.post_norms`). Megatron-Bridge builds the post-norms into its row-parallel linears
(src/megatron/bridge/models/gemma/gemma3_provider.py gemma3_layer_spec: TERowParallelLinearLayerNorm, the norm after
the linear's reduce, on the sequence-parallel shard), so each is one norm kernel each way on the residual stream's
elements, which keeps its input for the backward, and h weights more per layer (pipesim.model.param_counts).

The MLP is GeGLU (`activation` "geglu": down(gelu_tanh(gate x) * up x), hidden_activation "gelu_pytorch_tanh";
Megatron-Bridge: gated_linear_unit with fast_gelu): SwiGLU's three matrices and, fused (Megatron-core's
bias_geglu_impl), SwiGLU's bytes: gate and up read, the product written, both kept for the backward.

The embeddings are multiplied by sqrt(hidden) (Gemma3TextScaledWordEmbedding; Bridge's
Gemma3LanguageModelEmbedding: `embeddings * hidden_size**0.5` after the lookup, on the sequence-parallel shard):
one elementwise kernel forward and one on the gradient (`embedding_scale`), no parameter. The scores are scaled by
`query_pre_attn_scalar` ** -0.5 (168 in the 27B, not its 128-wide heads; Bridge's softmax_scale): ModelConfig.
softmax_scale, inside the attention kernel, which the executor builds. The norms' zero-centred
weight (x (1 + w), Bridge's layernorm_zero_centered_gamma) moves the same bytes as a plain RMSNorm's and is not told
apart. The QK-norm, the local windows and the explicit head width are pipesim's existing qk_norm, window and
head_width (pipesim.model.hf_gemma).
"""

from __future__ import annotations

from pipesim.errors import PipesimError

POST_NORM_BLOCKS = ("attention", "MLP")  # the blocks whose output a post-norm normalises, in layer order


def post_norm_name(block: str, norm: str) -> str:
    """The elementwise op (and saved input) name of `block`'s post-norm of kind `norm` ("RMSNorm", "LayerNorm")."""
    return f"{block} output {norm}"


def embedding_scale_bytes(elements: int, dtype_bytes: int) -> int:
    """Bytes of the embedding scale's kernel, forward or on the gradient: read and write each element once."""
    return 2 * elements * dtype_bytes


def check_gemma_layer(kind: str, *, post_norms: object, embedding_scale: object,
                      softmax_scale: object = None) -> None:
    """ModelConfig's Gemma fields: true or false (the scores' scale a positive number or None), and on a transformer
    (`kind` "gpt") only."""
    for name, value in (("post_norms", post_norms), ("embedding_scale", embedding_scale)):
        if not isinstance(value, bool):
            raise PipesimError(f"{name} must be true or false, got {value!r}")
        if value and kind != "gpt":
            raise PipesimError(f"{name} needs a transformer (--model gpt or --model-config)")
    if softmax_scale is not None and (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))
                                      or not 0 < softmax_scale < float("inf")):
        raise PipesimError(f"softmax_scale must be a positive number or null, got {softmax_scale!r}")
    if softmax_scale is not None and kind != "gpt":
        raise PipesimError("softmax_scale needs a transformer (--model gpt or --model-config)")


__all__ = ["POST_NORM_BLOCKS", "check_gemma_layer", "embedding_scale_bytes", "post_norm_name"]
