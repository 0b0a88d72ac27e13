"""Every trainable tensor of a pipeline stage on one rank, with its shape: what an optimizer that treats matrices
apart from the rest needs (Muon: pipesim.cost.muon_step), where the other costs need only counts
(pipesim.model.param_counts, whose totals these tensors sum to, tested).

The tensors are Megatron-core's (TE layer spec): per layer linear_qkv.weight [(h_q + 2 h_kv) / t, h] with its norm
weight (and bias) and, with biases, its bias; linear_proj.weight [h, h_q / t] (bias [h]); linear_fc1.weight
[m f / t, h] (m = 2 for SwiGLU) with the pre-MLP norm, linear_fc2.weight [h, f / t]; QK-norm's two head-dim norms;
the attention sinks [a / t]. Latent attention's linears (pipesim.model.latent_layer.latent_linears) and its latents'
norms in place of QKV and the projection. A MoE layer's MLP: the router [E, h] (bias [E] with `router_bias`; an
expert score bias is a buffer, no tensor), each local expert's linear_fc1.weight{i} [m f_e / etp, h] and
linear_fc2.weight{i} [h, f_e / etp] (biases [m f_e / etp] and [h]), the shared experts as one dense MLP split over
tp. The first stage adds the word embedding [V / t, h] (and a learned position table [s, h]); the last the final
norm and, unless the head is the embedding on that rank, the output layer [V / t, h]. Shapes are (rows, columns) of
the weight as stored (out, in); `expert` marks the routed experts' (reduced and sharded over the expert-data-
parallel group), `embedding` the embedding and output layer (Megatron-core's is_embedding_or_output_parameter).
Multi-token-prediction modules are not listed (their callers refuse them).
"""

from __future__ import annotations

from dataclasses import replace

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.gdn_mixer import gdn_tensors
from pipesim.model.latent_layer import latent_linears
from pipesim.model.layer_kinds import StageLayers, kind_options, stage_layers
from pipesim.model.layer_parts import BLOCK, MAMBA, mlp_half, tensor_sublayer
from pipesim.model.linear_attention import GDN
from pipesim.model.mamba_mixer import mamba_tensors
from pipesim.model.moe_layer import dense_mlp_params, moe_block_params
from pipesim.model.options import LayerOptions, vocab_shard
from pipesim.model.param_counts import block_params
from pipesim.model.tensor_types import WeightTensor

QKV = "QKV"  # the fused query-key-value weight (Megatron-core's linear_qkv: Muon splits it per head group)


def _norm(model: ModelConfig, width: int, name: str) -> list[WeightTensor]:
    """A norm over `width`: its weight, and its bias when a LayerNorm."""
    out = [WeightTensor(f"{name} weight", (width,))]
    if model.norm == "layernorm":
        out.append(WeightTensor(f"{name} bias", (width,)))
    return out


def _mlp(model: ModelConfig, width: int, split: int, prefix: str, *, count: int = 1,
         expert: bool = False) -> list[WeightTensor]:
    """An MLP of `width` split `split` ways: FC1 [m w / split, h] and FC2 [h, w / split], with their biases."""
    h, m = model.hidden, 2 if model.gated else 1
    out = [WeightTensor(f"{prefix}FC1", (m * width // split, h), count, expert),
           WeightTensor(f"{prefix}FC2", (h, width // split), count, expert)]
    if model.biases:
        out += [WeightTensor(f"{prefix}FC1 bias", (m * width // split,), count, expert),
                WeightTensor(f"{prefix}FC2 bias", (h,), count, expert)]
    return out


def _attention(model: ModelConfig, opts: LayerOptions) -> list[WeightTensor]:
    """The attention block and its input norm (and QK-norm, sinks) on one tp rank."""
    t, h = opts.tp, model.hidden
    out = _norm(model, h, "attention norm")
    if model.mla is not None:
        mla = model.mla
        out += [WeightTensor(lin.name, (lin.out, lin.inp)) for lin in latent_linears(model, 1, opts)]
        if mla.q_lora_rank is not None:
            out += _norm(model, mla.q_lora_rank, "Q latent norm")
        return out + _norm(model, mla.kv_lora_rank, "KV latent norm")
    hq = model.attention_width
    out += [WeightTensor(QKV, (model.qkv_width // t, h)), WeightTensor("projection", (h, hq // t))]
    if model.has_qkv_bias:
        out.append(WeightTensor("QKV bias", (model.qkv_width // t,)))
    if model.biases:
        out.append(WeightTensor("projection bias", (h,)))
    if model.qk_norm:
        out += _norm(model, model.head_dim, "Q head norm") + _norm(model, model.head_dim, "K head norm")
    if model.attention_sinks:
        out.append(WeightTensor("attention sinks", (model.heads // t,)))
    return out


def layer_tensors(model: ModelConfig, opts: LayerOptions, *, moe: bool = False) -> list[WeightTensor]:
    """One layer's trainable tensors on one rank: dense, or with the model's mixture of experts as its MLP (`moe`); a
    part of it (`opts.part`) its sublayer's (pipesim.model.layer_parts)."""
    if opts.part == MAMBA:  # a hybrid model's Mamba layer: its pre-norm (fused into in_proj) and its mixer's
        assert model.hybrid is not None  # LayerOptions.check refuses part "mamba" without one
        return _norm(model, model.hidden, "Mamba norm") + mamba_tensors(model.hybrid.mamba, model.hidden, opts.tp)
    if opts.mixer == GDN:  # a linear-attention layer: its norm and Gated DeltaNet, the block's MLP part
        assert model.linear_attention is not None  # LayerOptions.check refuses mixer "gdn" without it
        mlp = layer_tensors(model, mlp_half(opts), moe=moe)
        return _norm(model, model.hidden, "GDN norm") + gdn_tensors(model.linear_attention.mixer, model.hidden,
                                                                    opts.tp) + mlp
    tensors = _block_tensors(model, opts, moe=moe)
    return tensors if opts.part == BLOCK else [t for t in tensors if tensor_sublayer(t.name) == opts.part]


def layer_params(model: ModelConfig, opts: LayerOptions, *, moe: bool = False) -> int:
    """One layer's parameters on one rank (the routed experts' local share): the block's count (param_counts,
    moe_layer), or a part's tensors'."""
    if opts.part != BLOCK or opts.mixer != "attention":
        return sum(t.numel * t.count for t in layer_tensors(model, opts, moe=moe))
    params = block_params(model, opts.tp)
    return params + moe_block_params(model, opts) - dense_mlp_params(model, opts.tp) if moe else params


def _block_tensors(model: ModelConfig, opts: LayerOptions, *, moe: bool) -> list[WeightTensor]:
    """`layer_tensors` of the whole block."""
    out = _attention(model, opts) + _norm(model, model.hidden, "MLP norm")
    if model.post_norms:  # Gemma's norms on the attention's and the MLP's output
        out += _norm(model, model.hidden, "attention output norm") + _norm(model, model.hidden, "MLP output norm")
    if not moe:
        return out + _mlp(model, model.ffn_size, opts.tp, "")
    experts = model.moe
    if experts is None:
        raise PipesimError("a MoE layer's tensors need a model with experts (moe)")
    out.append(WeightTensor("router", (experts.experts, model.hidden)))
    if experts.router_bias:
        out.append(WeightTensor("router bias", (experts.experts,)))
    out += _mlp(model, experts.expert_ffn, opts.etp, "expert ", count=experts.experts // opts.ep, expert=True)
    width = experts.shared_experts * experts.shared_width
    gate = [WeightTensor("shared expert gate", (1, model.hidden))] if experts.shared_gate and width else []
    return out + (_mlp(model, width, opts.tp, "shared expert ") + gate if width else [])


def stage_tensors(model: ModelConfig, opts: LayerOptions, mix: StageLayers, *, first: bool,
                  last: bool) -> list[WeightTensor]:
    """A stage's tensors on one rank: its layers `mix` (each kind's, pipesim.model.layer_kinds), the embedding if
    `first`, the final norm and the output layer if `last` (the output layer is the embedding where one rank holds
    both and they are tied). Multi-token-prediction modules are refused: their tensors are not listed."""
    if last and model.mtp_layers:
        raise PipesimError("the multi-token-prediction modules' tensors are not listed (pipesim.model.weight_tensors)")
    h = model.hidden
    out = [replace(t, count=t.count * n) for kind, n in mix
           for t in layer_tensors(model, kind_options(model, opts, kind), moe=kind.moe)]
    if first:
        out.append(WeightTensor("word embedding", (vocab_shard(model, opts.tp), h), embedding=True))
        if model.positions == "learned":
            out.append(WeightTensor("position embedding", (model.seq, h), embedding=True))
    if last:
        out += _norm(model, h, "final norm")
        if not (model.tied_embeddings and first):
            out.append(WeightTensor("output layer", (vocab_shard(model, opts.tp), h), embedding=True))
    return out


def split_tensors(model: ModelConfig, opts: LayerOptions, split: list[int]) -> list[list[WeightTensor]]:
    """`stage_tensors` of each chunk of `split` (layers per chunk in model order): the first holds the embedding, the
    last the head."""
    last = len(split) - 1
    return [stage_tensors(model, opts, mix, first=s == 0, last=s == last)
            for s, mix in enumerate(stage_layers(model, split))]


__all__ = ["QKV", "WeightTensor", "layer_params", "layer_tensors", "split_tensors", "stage_tensors"]
