"""Parameters of a transformer's pieces on one tensor-parallel rank: block, embedding, LM head.

Megatron's split: QKV and the MLP's first matrices column-parallel (their biases split too), the
projection and the MLP's last matrix row-parallel (their biases whole), norms whole on every tp
rank, embedding and head split over the vocabulary. Counts are exact integers.

`block_params` is always the dense block (the cost model adds a mixture of experts' MLP on top, per rank,
in pipesim.model.moe_layer). The whole-model counts (`model_params`, `active_params`) and the per-piece
helpers of a mixture of experts (`router_params`, `expert_params`, `shared_expert_params`, `moe_mlp_params`)
count without parallelism, layer by layer as `MoeConfig.is_moe_layer` places the experts. Latent attention's
block is `latent_params` (pipesim.model.latent_attention) plus the two norms and the MLP; a model's multi-token-
prediction modules (`mtp_layers`, DeepSeek-V3) are counted in `model_params`, `active_params` and, with the copies
of the embedding and the head DeepSeek's checkpoints store for each, `checkpoint_params`.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.gdn_mixer import gdn_params
from pipesim.model.gemma_layer import POST_NORM_BLOCKS
from pipesim.model.latent_layer import latent_params
from pipesim.model.mamba_mixer import mamba_params
from pipesim.model.moe import MoeConfig
from pipesim.model.options import vocab_shard


def block_params(model: ModelConfig, tp: int = 1) -> int:
    """Parameters of one transformer block on one tp rank.

    QKV h (h_q + 2 h_kv) / t, projection h_q h / t, MLP 2 h f / t (GeLU) or 3 h f / t (SwiGLU); with
    biases (h_q + 2 h_kv) / t + h (attention) and f / t + h (GeLU MLP; 2 f / t + h for SwiGLU); norms
    2 h each (LayerNorm: weight and bias) or h (RMSNorm); with `qk_norm` the two norms over head_dim (query and
    key), whole on every tp rank; with `attention_sinks` one logit per head, a / t (split with the heads, as
    Megatron-core's learnable softmax offset). h_q = heads x head_dim (h unless `head_width` says otherwise), h_kv =
    kv heads x head_dim. The GPT (h_q = h_kv = h, f = 4h): 12 h^2 + 13 h at t = 1.
    Latent attention (`model.mla`): its block (`latent_params`, no biases) in place of QKV and the projection. Gemma's
    post-norms (`post_norms`): two norms more (`post_norm_params`).
    """
    h, f, t = model.hidden, model.ffn_size, tp
    matrices = 3 if model.gated else 2
    norms = 2 * _norm(model) + post_norm_params(model)  # Gemma's two post-norms too
    if model.mla is not None:  # ModelConfig refuses biases and QK-norm with latent attention
        return latent_params(model, t) + matrices * h * f // t + norms
    hq = model.attention_width
    weights = h * model.qkv_width // t + hq * h // t + matrices * h * f // t
    biases = model.qkv_width // t if model.has_qkv_bias else 0
    if model.biases:
        biases += h + (matrices - 1) * f // t + h
    sinks = model.heads // t if model.attention_sinks else 0
    return weights + biases + norms + qk_norm_params(model) + sinks


def qk_norm_params(model: ModelConfig) -> int:
    """QK-norm's parameters in one layer (0 without it): a norm over head_dim on the queries and one on the keys
    (Qwen3's q_norm and k_norm, head_dim weights each; a LayerNorm's bias doubles it), shared by every head, so whole
    on every tp rank (transformers' plan replicates them)."""
    if not model.qk_norm:
        return 0
    return 2 * (2 * model.head_dim if model.norm == "layernorm" else model.head_dim)


def post_norm_params(model: ModelConfig) -> int:
    """Gemma's post-norms' weights in one layer (0 without them: pipesim.model.gemma_layer): one norm over the hidden
    size per block."""
    return len(POST_NORM_BLOCKS) * _norm(model) if model.post_norms else 0


def _norm(model: ModelConfig) -> int:
    """One norm over the hidden size: weight and bias (LayerNorm) or weight (RMSNorm)."""
    return 2 * model.hidden if model.norm == "layernorm" else model.hidden


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
    shared = model.tied_embeddings and holds_embedding
    return _norm(model) + (0 if shared else model.hidden * vocab_shard(model, tp))


def mtp_projection_params(model: ModelConfig, tp: int = 1) -> int:
    """One multi-token-prediction module less its transformer block, on one tp rank: the two input norms (enorm on
    the embedding, hnorm on the previous depth's hidden state), the projection 2h -> h (bias-free, column-parallel:
    Megatron-core's eh_proj, 2 h^2 / t) and the module's own final norm (HF's shared_head.norm). The embedding and the
    output head are the main model's (DeepSeek-V3 report section 2.2): not counted here."""
    return 3 * _norm(model) + 2 * model.hidden * model.hidden // tp


def mtp_embedding_params(model: ModelConfig, tp: int = 1, *, holds_embedding: bool) -> int:
    """The embedding the multi-token-prediction modules look their shifted tokens up in, on the last stage: the main
    model's, so a stage that holds the embedding adds nothing; another last stage keeps a copy (Megatron-core builds
    the embedding wherever MTP runs, its gradient summed with the first stage's, as for tied embeddings)."""
    return 0 if holds_embedding or not model.mtp_layers else embedding_params(model, tp)


def embedding_copy_params(model: ModelConfig, tp: int = 1, *, first: bool, last: bool) -> int:
    """What a last stage without the embedding holds only to have it: the tied head's copy of the token matrix and
    the multi-token-prediction modules' embedding copy. A rank that also holds a first stage shares them (one tensor,
    one gradient): DeepSeek-V3 report section 3.2.3, DualPipe's first and last layers on one rank; any V placement."""
    if first or not last:
        return 0
    tied = head_params(model, tp) - head_params(model, tp, holds_embedding=True)  # 0 for an untied head
    return tied + mtp_embedding_params(model, tp, holds_embedding=False)


def stage_params(model: ModelConfig, tp: int = 1, *, layers: int, first: bool, last: bool) -> int:
    """Parameters on one tp rank of a pipeline stage holding `layers` blocks (embedding if first, head and the
    multi-token-prediction modules if last; the dense block everywhere, as `block_params`)."""
    total = layers * block_params(model, tp)
    if first:
        total += embedding_params(model, tp)
    if last:
        total += head_params(model, tp, holds_embedding=first)
        total += model.mtp_layers * (mtp_projection_params(model, tp) + block_params(model, tp))
        total += mtp_embedding_params(model, tp, holds_embedding=first)
    return total


def mlp_params(model: ModelConfig, width: int) -> int:
    """One MLP of `width` hidden units in the model's activation (no parallelism): 2 h w (GeLU) or 3 h w (SwiGLU:
    gate, up, down) weights, plus biases w + h (SwiGLU 2 w + h) when the model has them. The dense block's MLP is
    `mlp_params(model, model.ffn_size)`; a routed or shared expert is one of width expert_ffn / shared_ffn."""
    matrices = 3 if model.gated else 2
    biases = (matrices - 1) * width + model.hidden if model.biases else 0
    return matrices * model.hidden * width + biases


def _experts(model: ModelConfig) -> MoeConfig:
    if model.moe is None:
        raise PipesimError("expert parameters need a model with experts (moe)")
    return model.moe


def router_params(model: ModelConfig) -> int:
    """The router of one MoE layer: a linear h -> E, without bias (Mixtral's `gate`, Megatron's TopKRouter) unless
    `router_bias` (GPT-OSS's router: E more)."""
    moe = _experts(model)
    return model.hidden * moe.experts + (moe.experts if moe.router_bias else 0)


def expert_params(model: ModelConfig) -> int:
    """One routed expert: an MLP of width expert_ffn in the model's activation (Mixtral 8x7B: 3 x 4096 x 14336)."""
    return mlp_params(model, _experts(model).expert_ffn)


def shared_expert_params(model: ModelConfig) -> int:
    """All shared experts of one MoE layer, as one MLP of width shared_experts x shared_ffn (Megatron fuses them
    so; with biases that is one output bias, as pipesim.model.moe_layer counts them), and Qwen2-MoE's gate on their
    output (h weights: MoeConfig.shared_gate); 0 without shared experts."""
    moe = _experts(model)
    width = moe.shared_experts * moe.shared_width
    return mlp_params(model, width) + (model.hidden if moe.shared_gate else 0) if width else 0


def moe_mlp_params(model: ModelConfig) -> int:
    """One MoE layer's MLP, what replaces the dense MLP: router (with DeepSeek-V3's per-expert bias), E routed experts
    and the shared experts."""
    return router_params(model) + expert_bias_params(model) + _experts(model).experts * expert_params(model) + \
        shared_expert_params(model)


def _attention_and_norms(model: ModelConfig) -> int:
    """One block less its MLP: QKV, projection (and their biases), or latent attention, and the two norms."""
    return block_params(model) - mlp_params(model, model.ffn_size)


def expert_bias_params(model: ModelConfig) -> int:
    """DeepSeek-V3's per-expert score-correction bias of one MoE layer (E values: HF's e_score_correction_bias, a
    parameter of the checkpoint; Megatron-core keeps it as a buffer the optimizer never sees); 0 without one."""
    moe = _experts(model)
    return moe.experts if moe.expert_bias else 0


def is_moe_layer(model: ModelConfig, layer: int) -> bool:
    """Whether layer `layer` (0-based in model order; the multi-token-prediction blocks follow the main model's as
    layers, layers + 1, ...: DeepSeek-V3's checkpoint stores its one as model.layers.61) has experts."""
    return model.moe is not None and model.moe.is_moe_layer(layer)


def _hybrid_layer_params(model: ModelConfig, layer: int, *, active: bool) -> int:
    """A hybrid model's layer `layer` (pipesim.model.hybrid): its norm and its Mamba mixer, its attention (the block
    less its MLP and the MLP's norm), its MLP, or its experts (`active`: the top_k a token uses)."""
    hybrid = model.hybrid
    assert hybrid is not None
    part = hybrid.part(layer)
    if part == "mamba":
        return _norm(model) + mamba_params(hybrid.mamba, model.hidden)
    if part == "attention":
        return _attention_and_norms(model) - _norm(model)
    if not hybrid.is_moe(layer):
        return _norm(model) + mlp_params(model, model.ffn_size)
    moe = _experts(model)
    routed = moe.top_k if active else moe.experts
    return _norm(model) + router_params(model) + expert_bias_params(model) + routed * expert_params(model) + \
        shared_expert_params(model)


def _layer_params(model: ModelConfig, layer: int, *, active: bool) -> int:
    """Layer `layer` (0-based): the dense block, or attention and norms plus the MoE MLP; `active`: of the routed
    experts only the top_k a token uses. A hybrid model's: `_hybrid_layer_params`."""
    if model.hybrid is not None and layer < model.layers:
        return _hybrid_layer_params(model, layer, active=active)
    linear = model.linear_attention
    if linear is not None and layer < model.layers and linear.is_linear(layer):  # its Gated DeltaNet, both norms
        attention = 2 * _norm(model) + gdn_params(linear.mixer, model.hidden)
    else:
        attention = _attention_and_norms(model)
    moe = model.moe
    if moe is None or not moe.is_moe_layer(layer):
        return attention + mlp_params(model, model.ffn_size)
    if not active:
        return attention + moe_mlp_params(model)
    return attention + router_params(model) + expert_bias_params(model) + moe.top_k * expert_params(model) + \
        shared_expert_params(model)


def _ends(model: ModelConfig) -> int:
    """Embedding, final norm and LM head, tied ones counted once."""
    return embedding_params(model) + head_params(model, holds_embedding=True)


def _mtp(model: ModelConfig, *, active: bool) -> int:
    """The multi-token-prediction modules' own parameters: projection, norms and the block of layer index layers + k
    (dense or with experts as `is_moe_layer` places them); the embedding and the head are the main model's."""
    return sum(mtp_projection_params(model) + _layer_params(model, model.layers + k, active=active)
               for k in range(model.mtp_layers))


def model_params(model: ModelConfig) -> int:
    """All parameters of the model (no parallelism): embedding, blocks (each dense, or with the MoE MLP where
    `MoeConfig.is_moe_layer`), final norm and head, and the multi-token-prediction modules' own (their embedding and
    head shared). Mixtral 8x7B: 46,702,792,704 (Mistral AI: "46.7B total"); DeepSeek-V3 without its MTP module
    671,026,419,200 (the report's "671B"), with it 682,636,487,424."""
    if model.moe is None and model.hybrid is None and model.linear_attention is None:  # every block alike
        return stage_params(model, 1, layers=model.layers, first=True, last=True)
    return _ends(model) + sum(_layer_params(model, layer, active=False) for layer in range(model.layers)) + \
        _mtp(model, active=False)


def checkpoint_params(model: ModelConfig) -> int:
    """`model_params` as DeepSeek's checkpoints store a model with multi-token prediction: each MTP module keeps its
    own copy of the embedding and the output head (model.layers.61.embed_tokens and .shared_head.head, V x h each,
    untied). DeepSeek-V3: 684,489,845,504; the "685B" of its Hugging Face page also counts the FP8 block scales
    (one float32 per 128 x 128 block of every FP8 weight), which pipesim does not train."""
    return model_params(model) + model.mtp_layers * 2 * model.vocab * model.hidden


def active_params(model: ModelConfig) -> int:
    """Parameters one token uses: everything but the routed experts the router did not pick (top_k of E per MoE
    layer), the embedding and LM head counted whole, the multi-token-prediction modules' own too.

    That is the convention of the published "active" figures: Mistral AI's "12.9B active" for Mixtral 8x7B is
    12,879,925,248 only with the embedding and the head (without them 12.62B); for DeepSeek-V3's "37B activated"
    the answer in deepseek-ai/DeepSeek-V3 issue #231 gives the same rule (8 of 256 routed experts, every other
    parameter): 37,552,297,472 without the MTP module (the report's figure is the main model's). A dense model's
    active parameters are all of them.
    """
    if model.moe is None:
        return model_params(model)
    return _ends(model) + sum(_layer_params(model, layer, active=True) for layer in range(model.layers)) + \
        _mtp(model, active=True)


__all__ = ["active_params", "block_params", "checkpoint_params", "embedding_copy_params", "embedding_params",
           "expert_bias_params", "expert_params", "head_params", "is_moe_layer", "mlp_params", "model_params",
           "moe_mlp_params", "mtp_embedding_params", "mtp_projection_params", "qk_norm_params", "router_params",
           "shared_expert_params", "stage_params"]
