"""What a Hugging Face config.json says of sliding windows, and a "gpt_oss" file's experts (OpenAI's GPT-OSS).

Windows (pipesim.model.attention_window): a "gpt_oss" file windows the layers `layer_types` names
"sliding_attention" (transformers' GptOssConfig: every other layer from the first when it gives none) over
`sliding_window` keys (128 when absent); a "mistral" or "mixtral" file windows every layer when `sliding_window`
is set (MistralAttention and MixtralAttention pass it to every layer); any file whose `layer_types` are all
"full_attention" (Qwen3's newer files) has none. A window as long as the training sequence is full attention.
A pattern of windowed and full layers that `SlidingWindow.full_every` cannot say (full on layer l exactly when
(l + 1) % k == 0) is refused in one line.

GPT-OSS (transformers' models/gpt_oss/modeling_gpt_oss.py and configuration_gpt_oss.py): Llama's layer with heads
of `head_dim` (64: 64 x 64 = 4096 over a 2880 hidden), biases on q, k, v and o (`attention_bias`, true by default),
one learned sink logit per head in every softmax (GptOssAttention.sinks), and on every layer an MoE MLP:
GptOssTopKRouter, a linear h -> E with a bias, its top k logits softmaxed (the same weights as Mixtral's softmax then
renormalised top k), and `num_local_experts` experts of width `intermediate_size`, each gate_up and down with a bias
(GptOssExperts: gate_up_proj_bias, down_proj_bias), gated as SwiGLU with a clamp (`swiglu_limit`) and a sigmoid
gain (`swiglu_alpha`, 1.702) that read and write the same tensors as SwiGLU does: no cost pipesim counts.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.attention_window import SlidingWindow
from pipesim.model.moe import MoeConfig

WINDOWED, FULL = "sliding_attention", "full_attention"  # transformers' layer_types values
GPT_OSS_DEFAULTS = {"num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128}  # GptOssConfig's
WINDOW_EVERY_LAYER = ("mistral", "mixtral")  # their attention windows every layer by sliding_window


def _count(cfg: dict, name: str, default: int, where: str) -> int:
    value = cfg.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PipesimError(f"{where}: field {name!r} must be a positive integer, got {value!r}")
    return value


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
    every = full[0] + 1 if full else 0
    window = SlidingWindow(size, every) if every != 1 else None
    if window is None or any(window.windowed(n) != (kind == WINDOWED) for n, kind in enumerate(kinds)):
        raise PipesimError(f"{where}: field 'layer_types' puts full attention on layers {full}: pipesim models a "
                           "window on every layer or full attention on every k-th (layer l when (l + 1) % k == 0)")
    return window


def read_window(cfg: dict, kind: str | None, layers: int, where: str) -> SlidingWindow | None:
    """The file's sliding windows (the module's rules); None: full attention everywhere."""
    kinds = _layer_types(cfg, layers, where)
    if kind == "gpt_oss":
        size = _count(cfg, "sliding_window", GPT_OSS_DEFAULTS["sliding_window"], where)
        return _pattern(kinds or [WINDOWED if (n + 1) % 2 else FULL for n in range(layers)], size, where)
    if kind in WINDOW_EVERY_LAYER and cfg.get("sliding_window") is not None:
        return SlidingWindow(_count(cfg, "sliding_window", 1, where))
    if kinds is not None and WINDOWED in kinds:  # check_keys refuses these unless the type reads them
        raise PipesimError(f"{where}: field 'layer_types' windows layers a {kind} file does not window")
    return None


def gpt_oss_experts(cfg: dict, width: int, *, router_loss: float, where: str) -> MoeConfig:
    """GPT-OSS's experts on every layer (the module's docstring): `num_local_experts` of `intermediate_size`
    (`width`), `num_experts_per_tok` per token (the legacy `experts_per_token` must agree), a router with a bias."""
    experts = _count(cfg, "num_local_experts", GPT_OSS_DEFAULTS["num_local_experts"], where)
    top_k = _count(cfg, "num_experts_per_tok", GPT_OSS_DEFAULTS["num_experts_per_tok"], where)
    if "experts_per_token" in cfg and cfg["experts_per_token"] != top_k:
        raise PipesimError(f"{where}: field 'experts_per_token' {cfg['experts_per_token']!r} disagrees with "
                           f"num_experts_per_tok {top_k}")
    if top_k > experts:
        raise PipesimError(f"{where}: field 'num_experts_per_tok' {top_k} is more than num_local_experts {experts}")
    return MoeConfig(experts=experts, top_k=top_k, expert_ffn=width, renormalize=True, router_bias=True,
                     hf_router_loss=router_loss)


__all__ = ["GPT_OSS_DEFAULTS", "WINDOW_EVERY_LAYER", "gpt_oss_experts", "read_window"]
