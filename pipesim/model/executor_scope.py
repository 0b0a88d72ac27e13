"""What of a model and of an expert layout the executor does not build or run: one owner for both users (the
executor refuses such a model in one line, executor.run_config and executor.expert_checks; the planner's run export
says so, pipesim.plan.exports)."""

from __future__ import annotations

from pipesim.model.config import ModelConfig
from pipesim.model.moe import MoeConfig
from pipesim.model.rotary import BUILT as ROTARY_BUILT


def unbuilt_structure(model: ModelConfig) -> list[str]:
    """The structure of a transformer the executor (executor/transformer.py) does not build, as 'name'; [] when it
    builds the whole model. It builds every dense layer the cost model costs (grouped-query attention, heads of their
    own width, QK-norm, each activation, norm and position kind, with or without biases, sliding windows (with Gemma
    3's own RoPE base on them), attention sinks, Gemma's post-norms and scaled embeddings) and a top-k router's
    experts (with a router bias, and GPT-OSS's clamped, offset gate), and a head tied to the embedding; not latent
    attention, multi-token prediction, DeepSeek-V3's routing (groups, a score bias), a Hugging Face config's own
    router loss (its training objective, not a layer), a hybrid model's Mamba layers and single sublayers
    (pipesim.model.hybrid: costed, not built), squared-ReLU experts, or a model without position embeddings. Its one
    owner: the executor refuses such a model, the planner's run export says so."""
    if model.kind != "gpt":
        return []
    moe = model.moe
    return [what for what, on in (("multi-head latent attention", model.mla is not None),
                                  ("multi-token prediction modules", model.mtp_layers > 0),
                                  ("a hybrid model's Mamba, attention-only and MLP-only layers",
                                   model.hybrid is not None),
                                  ("linear attention (Gated DeltaNet)", model.linear_attention is not None),
                                  ("an attention output gate", model.attention_gate),
                                  ("squared-ReLU experts", moe is not None and model.activation == "relu2"),
                                  ("a model without position embeddings", model.positions == "none"),
                                  ("group-limited routing", moe is not None and moe.groups > 1),
                                  ("the router's expert bias", moe is not None and moe.expert_bias),
                                  ("Hugging Face's router loss over every layer at once (output_router_logits; "
                                   "--moe-aux-loss-coeff trains Megatron-core's per layer)",
                                   moe is not None and moe.hf_router_loss > 0),
                                  (f"rotary scaling {model.rotary.scaling if model.rotary else ''!r} (the executor "
                                   f"builds {', '.join(ROTARY_BUILT[1:])})",
                                   model.rotary is not None and model.rotary.scaling not in ROTARY_BUILT)) if on]


def unrun_expert_layout(moe: MoeConfig, *, expert_tp: int) -> list[str]:
    """What of a mixture-of-experts job the executor (executor/experts.py) does not run, as the flags that ask for it;
    [] when it runs it. Its one owner: the executor refuses such a run (executor.expert_checks), the planner's run
    export says so."""
    return [what for what, on in (
        (f"--etp {expert_tp} (experts split over tp)", expert_tp > 1),
        (f"--moe-load-imbalance {moe.imbalance:g} (the cost model's; a run routes what its router routes)",
         moe.imbalance != 1.0),
    ) if on]


__all__ = ["unbuilt_structure", "unrun_expert_layout"]
