"""`pipesim plan --balance-layers`: the weights pipesim's balanced split gives the embedding and the head, in layers.

A pipeline's slowest stage sets its pace, and the stage with the output head carries the head's GEMMs besides its
layers: Llama 3 8B's head (h 4096 x 128,256) weighs 2.04 of its layers in FLOPs at 8,192 tokens, Llama 3.1 405B's
0.63. The balanced split (pipesim.model.pipeline_split.balanced_split) gives that stage fewer layers by this weight. The
weight is a ratio of FLOPs (pipesim.model.flops: the head's F + I + W, and a DeepSeek-V3 MTP module's, over one
layer's, causal attention, one sequence, no parallelism; the mean layer's when sliding-window layers are cheaper), the
same for every candidate; the embedding's lookup has no matmul and weighs 0.
"""

from __future__ import annotations

from dataclasses import replace

from pipesim.cost.stage_work import moe_layer_flops
from pipesim.model.config import ModelConfig
from pipesim.model.flops import head_flops, layer_flops, mtp_projection_flops
from pipesim.model.options import LayerOptions
from pipesim.model.pipeline_split import BalancedSplit


def balanced_rule(model: ModelConfig) -> BalancedSplit:
    """The balanced split of `model`: the embedding weighs 0 layers; the last stage's extra work, the head and the
    multi-token-prediction modules pipesim runs there (each a projection, a block and a pass through the head), its
    FLOPs over a layer's."""
    opts = LayerOptions(attention="flash")

    def one_layer(o: LayerOptions) -> int:
        return (moe_layer_flops(model, 1, o) if model.moe is not None else layer_flops(model, 1, o, causal=True)).total

    layer = one_layer(opts)
    windowed = model.windowed_layers(0, model.layers)  # the mean layer of a model with sliding-window layers
    if windowed:
        narrow = one_layer(replace(opts, window=model.window_size))
        layer = (layer * (model.layers - windowed) + narrow * windowed) / model.layers
    head = head_flops(model, 1, opts).total
    mtp = model.mtp_layers * (mtp_projection_flops(model, 1, opts).total + layer + head)
    return BalancedSplit(0.0, (head + mtp) / layer)


__all__ = ["balanced_rule"]
