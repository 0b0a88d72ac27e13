"""RoPE's frequencies as a config.json gives them: `rope_theta` and a rotary scaling (`rope_scaling`, transformers 5's
`rope_parameters`). No FLOP, byte or collective depends on them (YaRN's attention factor, which does, is
`ModelConfig.rope_mscale`: pipesim.model.hf_rope); the executor builds them, so `pipesim run` trains the model the file
defines, not plain RoPE of base 10,000.

The inverse frequency of feature pair i (of d / 2, d the head's width) is theta^(-2i / d), then, per scaling kind as
transformers' modeling_rope_utils computes it (huggingface/transformers 0044e3b3, `_compute_linear_scaling_rope_...`,
`_compute_llama3_parameters`, `_compute_yarn_parameters`; YaRN's `truncate` and `original_max_position_embeddings` as
its later versions read them, the GPT-OSS era's):
- linear: every frequency / factor;
- llama3: wavelength 2 pi / f; kept below old / high_freq_factor, divided by factor above old / low_freq_factor, and
  between them (1 - s) f / factor + s f with s = (old / wavelength - low) / (high - low), old the original context;
- yarn: a ramp over the pairs from low = floor(c(beta_fast)) to high = ceil(c(beta_slow)) (unfloored and unceiled
  with truncate false), clamped to [0, d - 1], c(r) = d ln(old / (2 pi r)) / (2 ln theta); f / factor where the ramp
  is 1, f where it is 0, linear between.
Other kinds (dynamic NTK, LongRoPE, ...) are kept by name: costs ignore them, the executor refuses them
(pipesim.model.executor_scope.unbuilt_structure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipesim.errors import PipesimError

BUILT = ("none", "linear", "llama3", "yarn")  # the kinds the executor builds


@dataclass(frozen=True)
class Rotary:
    """RoPE's base and scaling (defaults: Megatron-LM's --rotary-base 10,000, no scaling)."""

    theta: float = 10_000.0  # rope_theta
    scaling: str = "none"  # rope_scaling's rope_type (or type); "none": plain RoPE
    factor: float = 1.0  # linear, llama3, yarn
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_context: int = 0  # original_max_position_embeddings (llama3 needs it; yarn: 0 reads the model's)
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: the ramp's ends floored and ceiled to whole pairs
    fraction: float = 1.0  # partial_rotary_factor: the share of each head's features rotated (Nemotron's 0.5)
    # Gemma 3's rope_local_base_freq: the windowed layers' own base, unscaled (transformers' Gemma3 rotary_emb_local);
    # 0: every layer rotates as above
    window_theta: float = 0.0

    def __post_init__(self) -> None:
        for name in ("theta", "factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "fraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise PipesimError(f"rotary {name} must be a positive number, got {value!r}")
        if isinstance(self.window_theta, bool) or not isinstance(self.window_theta, (int, float)) \
                or not 0 <= self.window_theta < math.inf:
            raise PipesimError(f"rotary window_theta must be a number >= 0, got {self.window_theta!r}")
        if not isinstance(self.scaling, str) or not self.scaling:
            raise PipesimError(f"rotary scaling must be a kind's name, got {self.scaling!r}")
        if not isinstance(self.truncate, bool):
            raise PipesimError(f"rotary truncate must be true or false, got {self.truncate!r}")
        if isinstance(self.original_context, bool) or not isinstance(self.original_context, int) \
                or self.original_context < 0:
            raise PipesimError(f"rotary original_context must be a whole number >= 0, got {self.original_context!r}")
        if self.scaling == "llama3" and not (self.original_context and self.high_freq_factor > self.low_freq_factor):
            raise PipesimError("llama3 rotary scaling needs original_max_position_embeddings and high_freq_factor > "
                               "low_freq_factor")
        if self.scaling == "yarn" and not self.original_context:
            raise PipesimError("yarn rotary scaling needs its original context (original_max_position_embeddings)")
        if self.fraction > 1:
            raise PipesimError(f"rotary fraction (partial_rotary_factor) must be at most 1, got {self.fraction!r}")

    def on_window(self) -> Rotary:
        """The rotary of the model's windowed layers: plain RoPE of base window_theta (Gemma 3's local layers), or
        this one when window_theta is 0."""
        return Rotary(theta=self.window_theta, fraction=self.fraction) if self.window_theta else self

    def rotated_width(self, head_dim: int) -> int:
        """Features of a head of `head_dim` that are rotated, the first ones (transformers: int(head_dim x
        partial_rotary_factor)); even, so that they pair."""
        width = int(head_dim * self.fraction)
        if width < 2 or width % 2:
            raise PipesimError(f"a rotary share of {self.fraction:g} (--rotary-percent; config.json's "
                               f"partial_rotary_factor) rotates {width} of a head's {head_dim} features: rotary "
                               "embeddings pair an even number of them")
        return width

    def inverse_frequencies(self, width: int) -> list[float]:
        """The width / 2 inverse frequencies (radians per position) of `width` rotated features (`rotated_width`)."""
        if self.scaling not in BUILT:
            raise PipesimError(f"rotary scaling {self.scaling!r} is not built (pipesim builds {', '.join(BUILT)})")
        d = width
        plain = [self.theta ** (-2 * i / d) for i in range(d // 2)]
        if self.scaling == "none":
            return plain
        if self.scaling == "linear":
            return [f / self.factor for f in plain]
        if self.scaling == "llama3":
            return [self._llama3(f) for f in plain]
        return self._yarn(plain, d, self.original_context)

    def _llama3(self, f: float) -> float:
        old = self.original_context
        wavelength = 2 * math.pi / f
        if wavelength < old / self.high_freq_factor:
            return f
        if wavelength > old / self.low_freq_factor:
            return f / self.factor
        s = (old / wavelength - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        return (1 - s) * f / self.factor + s * f

    def _yarn(self, plain: list[float], d: int, old: int) -> list[float]:
        def pair(rotations: float) -> float:  # the pair index that turns `rotations` times over the old context
            return d * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(self.theta))

        low, high = pair(self.beta_fast), pair(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001  # transformers' guard against a zero-width ramp
        out = []
        for i, f in enumerate(plain):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            out.append(f / self.factor * ramp + f * (1 - ramp))
        return out


def rotary_from_config(cfg: dict, where: str) -> Rotary | None:
    """The Rotary of a config.json (`rope_theta`, `rope_scaling` or `rope_parameters`, `partial_rotary_factor`); None
    when it gives none of them, or only what the defaults are."""
    params = None
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(cfg.get(key), dict):
            params = cfg[key]
            break
    theta = cfg.get("rope_theta", params.get("rope_theta") if params else None)
    fields: dict = {} if theta is None else {"theta": theta}
    if cfg.get("partial_rotary_factor") is not None:
        fields["fraction"] = cfg["partial_rotary_factor"]
    kind = params.get("rope_type", params.get("type", "default")) if params else "default"
    if kind != "default":
        fields["scaling"] = kind
        if kind == "yarn":  # its original context: the file's, else the model's positions (transformers' fallback)
            fields["original_context"] = cfg.get("max_position_embeddings", 0)
        for name, key in (("factor", "factor"), ("low_freq_factor", "low_freq_factor"),
                          ("high_freq_factor", "high_freq_factor"), ("beta_fast", "beta_fast"),
                          ("beta_slow", "beta_slow"), ("original_context", "original_max_position_embeddings"),
                          ("truncate", "truncate")):
            # beta_fast and beta_slow fall back on a zero too (transformers: `rope_scaling.get("beta_fast") or 32`)
            if kind in BUILT and (params.get(key) if key.startswith("beta_") else params.get(key) is not None):
                fields[name] = params[key]
    try:
        rotary = Rotary(**fields)
    except (PipesimError, TypeError) as e:
        raise PipesimError(f"{where}: {e}") from None
    return None if rotary == Rotary() else rotary


__all__ = ["BUILT", "Rotary", "rotary_from_config"]
