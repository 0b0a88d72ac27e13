"""What a Hugging Face config.json says of sliding windows, and a "gpt_oss" file's experts (OpenAI's GPT-OSS).

Windows (pipesim.model.attention_window): a "gpt_oss" file windows the layers `layer_types` names
"sliding_attention" (transformers' GptOssConfig: every other layer from the first when it gives none) over
`sliding_window` keys (128 when absent); a "gemma3_text" file likewise, full on layer l when (l + 1) %
`sliding_window_pattern` == 0 when it lists no layer_types (pipesim.model.hf_gemma); a "mistral" or "mixtral" file
windows every layer when `sliding_window` is set (MistralAttention and MixtralAttention pass it to every layer); any
file whose `layer_types` are all "full_attention" (Qwen3's newer files) has none. A window as long as the training
sequence is full attention.
A pattern of windowed and full layers that `SlidingWindow.full_every` cannot say (full on layer l exactly when
(l + 1) % k == 0) is refused in one line.

GPT-OSS (transformers' models/gpt_oss/modeling_gpt_oss.py and configuration_gpt_oss.py): Llama's layer with heads
of `head_dim` (64: 64 x 64 = 4096 over a 2880 hidden), biases on q, k, v and o (`attention_bias`, true by default),
one learned sink logit per head in every softmax (GptOssAttention.sinks), and on every layer an MoE MLP:
GptOssTopKRouter, a linear h -> E with a bias, its top k logits softmaxed (the same weights as Mixtral's softmax then
renormalised top k), and `num_local_experts` experts of width `intermediate_size`, each gate_up and down with a bias
(GptOssExperts: gate_up_proj_bias, down_proj_bias), gated as gate x sigmoid(alpha x gate) x (up + 1) (transformers
v4.55.0 GptOssExperts: alpha 1.702, a file's `swiglu_alpha` where it gives one; `MoeConfig.glu_alpha` and `glu_offset`:
inside the activation's kernel, no cost of its own) with the gate clamped above and the up half on both sides at
`swiglu_limit` (`MoeConfig.glu_clamp`, which Megatron-core runs as kernels of their own:
pipesim.model.grouped_mlp_extras).
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.attention_window import SlidingWindow
from pipesim.model.hf_keys import positive_field
from pipesim.model.moe import MoeConfig

WINDOWED, FULL = "sliding_attention", "full_attention"  # transformers' layer_types values
# transformers' GptOssConfig defaults, where a file is silent (its layer_types: every other layer windowed, from the
# first: full_every 2)
GPT_OSS_DEFAULTS = {"num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128, "head_dim": 64,
                    "num_key_value_heads": 8, "attention_bias": True, "swiglu_limit": 7.0, "swiglu_alpha": 1.702}
GPT_OSS_GLU_OFFSET = 1.0  # GptOssExperts' (up + 1) (Megatron-core's glu_linear_offset for GPT-OSS)
GPT_OSS_FULL_EVERY = 2
WINDOW_EVERY_LAYER = ("mistral", "mixtral")  # their attention windows every layer by sliding_window


def _layer_types(cfg: dict, layers: int, where: str) -> list[str] | None:
    """The file's `layer_types`, checked: one of WINDOWED or FULL per layer; None when absent."""
    kinds = cfg.get("layer_types")
    if kinds is None:
        return None
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in (WINDOWED, FULL) for k in kinds):
        raise PipesimError(f"{where}: field 'layer_types' must list {WINDOWED!r} or {FULL!r} for each of the "
                           f"{layers} layers")
    return kinds


def _pattern(kinds: list[str], size: int, where: str) -> SlidingWindow | None:
    """The SlidingWindow whose windowed layers are `kinds`' WINDOWED ones; None when every layer is full."""
    full = [n for n, kind in enumerate(kinds) if kind == FULL]
    if len(full) == len(kinds):
        return None
    every = full[0] + 1 if full else 0  # the first full layer sets the period; check every other layer follows it
    if every == 1 or any(SlidingWindow(size, every).windowed(n) != (kind == WINDOWED) for n, kind in enumerate(kinds)):
        raise PipesimError(f"{where}: field 'layer_types' puts full attention on layers {full}: pipesim models a "
                           "window on every layer or full attention on every k-th (layer l when (l + 1) % k == 0)")
    return SlidingWindow(size, every)


def read_window(cfg: dict, kind: str | None, layers: int, where: str) -> SlidingWindow | None:
    """The file's sliding windows (the module's rules; a "gpt_oss" file with GPT_OSS_DEFAULTS filled in); None:
    full attention everywhere."""
    kinds = _layer_types(cfg, layers, where)
    if kind in ("gpt_oss", "gemma3_text"):  # full every 2nd layer (GPT-OSS), every sliding_window_pattern-th (Gemma 3)
        size = positive_field(cfg, "sliding_window", where)
        every = GPT_OSS_FULL_EVERY if kind == "gpt_oss" else positive_field(cfg, "sliding_window_pattern", where)
        if kinds is None:
            return SlidingWindow(size, every) if every > 1 else None
        return _pattern(kinds, size, where)
    if kind in WINDOW_EVERY_LAYER and cfg.get("sliding_window") is not None:
        return SlidingWindow(positive_field(cfg, "sliding_window", where))
    if kinds is not None and WINDOWED in kinds:  # check_keys refuses these unless the type reads them
        raise PipesimError(f"{where}: field 'layer_types' windows layers a {kind} file does not window")
    return None


def gpt_oss_experts(cfg: dict, width: int, *, router_loss: float, where: str) -> MoeConfig:
    """GPT-OSS's experts on every layer (the module's docstring; a file with GPT_OSS_DEFAULTS filled in):
    `num_local_experts` of `intermediate_size` (`width`), `num_experts_per_tok` per token (the legacy
    `experts_per_token` must agree), a router with a bias, the activation's input clamped at `swiglu_limit`."""
    experts, top_k = (positive_field(cfg, name, where) for name in ("num_local_experts", "num_experts_per_tok"))
    if "experts_per_token" in cfg and cfg["experts_per_token"] != top_k:
        raise PipesimError(f"{where}: field 'experts_per_token' {cfg['experts_per_token']!r} disagrees with "
                           f"num_experts_per_tok {top_k}")
    if top_k > experts:
        raise PipesimError(f"{where}: field 'num_experts_per_tok' {top_k} is more than num_local_experts {experts}")
    limit, alpha = (_positive_number(cfg, name, where) for name in ("swiglu_limit", "swiglu_alpha"))
    return MoeConfig(experts=experts, top_k=top_k, expert_ffn=width, renormalize=True, router_bias=True,
                     glu_clamp=limit, glu_alpha=alpha, glu_offset=GPT_OSS_GLU_OFFSET, hf_router_loss=router_loss)


def _positive_number(cfg: dict, name: str, where: str) -> float:
    value = cfg[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise PipesimError(f"{where}: field {name!r} must be a positive number, got {value!r}")
    return float(value)


__all__ = ["GPT_OSS_DEFAULTS", "WINDOW_EVERY_LAYER", "gpt_oss_experts", "read_window"]
