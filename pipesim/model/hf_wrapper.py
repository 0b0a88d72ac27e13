"""A multimodal repository's config.json read as its language model: the wrapper's `text_config` as a text file.

Llama 4's and Gemma 3's repositories (Llama4ForConditionalGeneration, Gemma3ForConditionalGeneration) keep the
language model's keys in `text_config` beside the vision encoder's; pipesim costs the language model, what NVIDIA's
"-LLM" pretraining benchmarks train, and lists the wrapper's other keys as ignored (`--json`). One reader for both:
each wrapper says which of its keys are read, which hold only what pipesim does not cost, which text model types it
may hold, and which of its keys the text model inherits where text_config is silent (the dtype always).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.model.hf_keys import code_type, required_field

DTYPE_KEYS = ("torch_dtype", "dtype")  # transformers 4.56+ writes "dtype"


@dataclass(frozen=True)
class TextWrapper:
    """A wrapper model type and what its config.json holds beside the language model's text_config."""

    name: str  # the wrapper's model_type ("llama4")
    text_type: str  # the language model's ("llama4_text"), which the text_config is read as
    label: str  # the family in messages ("Llama 4")
    read: tuple[str, ...]  # the wrapper's keys pipesim reads
    ignored: tuple[str, ...]  # the wrapper's keys that hold only what pipesim does not cost
    text_types: tuple[str, ...] = ()  # further model types a text_config may name (the text type always)
    text_required: bool = True  # False: an absent text_config is the text model's defaults (Gemma3Config's)
    inherits: tuple[str, ...] = ()  # the wrapper's keys the text model takes where text_config is silent


def unwrap_text_config(cfg: dict, where: str, wrapper: TextWrapper) -> tuple[dict, tuple[str, ...], tuple[str, ...]]:
    """(the text model's config, the wrapper's keys read, those ignored) of a `wrapper` file; any other file unchanged,
    with none. A wrapper key pipesim does not know refuses the file in one line, as check_keys does a text file's."""
    if code_type(cfg) != wrapper.name:
        return cfg, (), ()
    text = required_field(cfg, "text_config", where) if wrapper.text_required else cfg.get("text_config", {})
    if not isinstance(text, dict):
        raise PipesimError(f"{where}: field 'text_config' must be an object, got {text!r}")
    unknown = [key for key in cfg if key not in wrapper.read + wrapper.ignored]
    if unknown:
        raise PipesimError(f"{where}: keys that change the model and pipesim does not model: {', '.join(unknown)} "
                           f"(unknown to pipesim beside a {wrapper.name} file's text_config); refused rather than "
                           "simulated as a different model")
    inner = text.get("model_type", wrapper.text_type)
    if inner not in (wrapper.text_type, *wrapper.text_types):
        raise PipesimError(f"{where}: text_config's model_type {inner!r} is not {wrapper.label}'s")
    out = {**text, "model_type": wrapper.text_type}
    inherited = (*(DTYPE_KEYS if not any(key in text for key in DTYPE_KEYS) else ()), *wrapper.inherits)
    out |= {key: cfg[key] for key in inherited if key in cfg and key not in text}
    return out, tuple(key for key in cfg if key in wrapper.read), tuple(key for key in cfg if key in wrapper.ignored)


__all__ = ["TextWrapper", "unwrap_text_config"]
