"""Parameters of a transformer's pieces on one tensor-parallel rank: block, embedding, LM head.

Megatron's split: QKV and the MLP's first matrices column-parallel (their biases split too), the
projection and the MLP's last matrix row-parallel (their biases whole), norms whole on every tp
rank, embedding and head split over the vocabulary. Counts are exact integers.
"""

from __future__ import annotations

from pipesim.model.config import ModelConfig
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


def model_params(model: ModelConfig) -> int:
    """All parameters of the model (no parallelism): embedding, blocks, final norm and head."""
    return stage_params(model, 1, layers=model.layers, first=True, last=True)


__all__ = ["block_params", "embedding_params", "head_params", "model_params", "stage_params"]
