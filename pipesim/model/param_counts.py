"""Parameters of a transformer's pieces on one tensor-parallel rank: block, embedding, LM head.

Megatron's split: QKV and the MLP's first matrices column-parallel (their biases split too), the
projection and the MLP's last matrix row-parallel (their biases whole), norms whole on every tp
rank, embedding and head split over the vocabulary. Counts are exact integers.

`block_params` is always the dense block (the cost model adds a mixture of experts' MLP on top, per rank,
in pipesim.model.moe_layer). The whole-model counts (`model_params`, `active_params`) and the per-piece
helpers of a mixture of experts (`router_params`, `expert_params`, `shared_expert_params`, `moe_mlp_params`)
count without parallelism, layer by layer as `MoeConfig.is_moe_layer` places the experts.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.moe import MoeConfig
from pipesim.model.options import vocab_shard


def block_params(model: ModelConfig, tp: int = 1) -> int:
    """Parameters of one transformer block on one tp rank.

    QKV h (h + 2 h_kv) / t, projection h^2 / t, MLP 2 h f / t (GeLU) or 3 h f / t (SwiGLU); with
    biases (h + 2 h_kv) / t + h (attention) and f / t + h (GeLU MLP; 2 f / t + h for SwiGLU); norms
    2 h each (LayerNorm: weight and bias) or h (RMSNorm). The GPT (h_kv = h, f = 4h): 12 h^2 + 13 h at t = 1.
    """
    h, f, t = model.hidden, model.ffn_size, tp
    hkv = model.num_kv_heads * model.head_dim
    matrices = 3 if model.activation == "swiglu" else 2
    weights = h * (h + 2 * hkv) // t + h * h // t + matrices * h * f // t
    biases = 0
    if model.biases:
        biases = (h + 2 * hkv) // t + h + (matrices - 1) * f // t + h
    norms = 2 * (2 * h if model.norm == "layernorm" else h)
    return weights + biases + norms


def embedding_params(model: ModelConfig, tp: int = 1) -> int:
    """Token embedding (ceil(V / t) x h, vocab-parallel) plus a learned position table (s x h, whole)."""
    positions = model.seq * model.hidden if model.positions == "learned" else 0
    return vocab_shard(model, tp) * model.hidden + positions


def head_params(model: ModelConfig, tp: int = 1, *, holds_embedding: bool = False) -> int:
    """Final norm plus the LM head (h x ceil(V / t)).

    With tied embeddings the head is the embedding's matrix: counted once where one rank holds
    both (`holds_embedding`); a last pipeline stage without the embedding keeps its own copy, as
    Megatron does (the two copies' gradients are all-reduced between first and last stage).
    """
    norm = 2 * model.hidden if model.norm == "layernorm" else model.hidden
    shared = model.tied_embeddings and holds_embedding
    return norm + (0 if shared else model.hidden * vocab_shard(model, tp))


def stage_params(model: ModelConfig, tp: int = 1, *, layers: int, first: bool, last: bool) -> int:
    """Parameters on one tp rank of a pipeline stage holding `layers` blocks (embedding if first, head if last)."""
    total = layers * block_params(model, tp)
    if first:
        total += embedding_params(model, tp)
    if last:
        total += head_params(model, tp, holds_embedding=first)
    return total


def mlp_params(model: ModelConfig, width: int) -> int:
    """One MLP of `width` hidden units in the model's activation (no parallelism): 2 h w (GeLU) or 3 h w (SwiGLU:
    gate, up, down) weights, plus biases w + h (SwiGLU 2 w + h) when the model has them. The dense block's MLP is
    `mlp_params(model, model.ffn_size)`; a routed or shared expert is one of width expert_ffn / shared_ffn."""
    matrices = 3 if model.activation == "swiglu" else 2
    biases = (matrices - 1) * width + model.hidden if model.biases else 0
    return matrices * model.hidden * width + biases


def _experts(model: ModelConfig) -> MoeConfig:
    if model.moe is None:
        raise PipesimError("expert parameters need a model with experts (moe)")
    return model.moe


def router_params(model: ModelConfig) -> int:
    """The router of one MoE layer: a linear h -> E without bias (Mixtral's `gate`, Megatron's TopKRouter)."""
    return model.hidden * _experts(model).experts


def expert_params(model: ModelConfig) -> int:
    """One routed expert: an MLP of width expert_ffn in the model's activation (Mixtral 8x7B: 3 x 4096 x 14336)."""
    return mlp_params(model, _experts(model).expert_ffn)


def shared_expert_params(model: ModelConfig) -> int:
    """All shared experts of one MoE layer, as one MLP of width shared_experts x shared_ffn (Megatron fuses them
    so; with biases that is one output bias, as pipesim.model.moe_layer counts them); 0 without shared experts."""
    moe = _experts(model)
    width = moe.shared_experts * moe.shared_width
    return mlp_params(model, width) if width else 0


def moe_mlp_params(model: ModelConfig) -> int:
    """One MoE layer's MLP, what replaces the dense MLP: router, E routed experts and the shared experts."""
    return router_params(model) + _experts(model).experts * expert_params(model) + shared_expert_params(model)


def _attention_and_norms(model: ModelConfig) -> int:
    """One block less its MLP: QKV, projection (and their biases) and the two norms."""
    return block_params(model) - mlp_params(model, model.ffn_size)


def _layer_params(model: ModelConfig, layer: int, *, active: bool) -> int:
    """Layer `layer` (0-based): the dense block, or attention and norms plus the MoE MLP; `active`: of the routed
    experts only the top_k a token uses."""
    moe = model.moe
    if moe is None or not moe.is_moe_layer(layer):
        return block_params(model)
    routed = (moe.top_k if active else moe.experts) * expert_params(model)
    return _attention_and_norms(model) + router_params(model) + routed + shared_expert_params(model)


def _ends(model: ModelConfig) -> int:
    """Embedding, final norm and LM head, tied ones counted once."""
    return embedding_params(model) + head_params(model, holds_embedding=True)


def model_params(model: ModelConfig) -> int:
    """All parameters of the model (no parallelism): embedding, blocks (each dense, or with the MoE MLP where
    `MoeConfig.is_moe_layer`), final norm and head. Mixtral 8x7B: 46,702,792,704 (Mistral AI: "46.7B total")."""
    if model.moe is None:
        return stage_params(model, 1, layers=model.layers, first=True, last=True)
    return _ends(model) + sum(_layer_params(model, layer, active=False) for layer in range(model.layers))


def active_params(model: ModelConfig) -> int:
    """Parameters one token uses: everything but the routed experts the router did not pick (top_k of E per MoE
    layer), the embedding and LM head counted whole.

    That is the convention of the published "active" figures: Mistral AI's "12.9B active" for Mixtral 8x7B is
    12,879,925,248 only with the embedding and the head (without them 12.62B); for DeepSeek-V3's "37B activated"
    the answer in deepseek-ai/DeepSeek-V3 issue #231 gives the same rule (8 of 256 routed experts, every other
    parameter), about 37.55B. A dense model's active parameters are all of them.
    """
    if model.moe is None:
        return model_params(model)
    return _ends(model) + sum(_layer_params(model, layer, active=True) for layer in range(model.layers))


__all__ = ["active_params", "block_params", "embedding_params", "expert_params", "head_params", "mlp_params",
           "model_params", "moe_mlp_params", "router_params", "shared_expert_params", "stage_params"]
