"""The transformer's structure flags of simulate, sweep and plan, in Megatron-LM's names (megatron/training/arguments.py
@ v0.15.3) where Megatron has one: ModelConfig's norm, positions, biases, dropout, q/k norm, head width, tied
embeddings, attention sinks, sliding window, norm epsilon and rotary embedding, each overriding a --model-config file's
field as the size flags do (pipesim.commands.common.model_config); the window and rotary fields the flags make
together (`with_window`, `with_rotary`), and how each flag is typed back (a plan's exported command, --cost's
refusal)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from pipesim.commands.arg_types import bounded_int, positive_float, positive_int
from pipesim.errors import PipesimError
from pipesim.model.attention_window import SlidingWindow
from pipesim.model.config import ModelConfig
from pipesim.model.rotary import Rotary

# Megatron-LM's names (megatron/training/arguments.py, v0.15.3) for ModelConfig's norm and positions, as typed
NORMALIZATIONS = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
POSITION_TYPES = {"learned_absolute": "learned", "rope": "rope"}
# the switches of the structure flags: (ModelConfig field, value) -> the flag that gives it
STRUCTURE_SWITCHES = {("biases", False): "--disable-bias-linear", ("qkv_bias", True): "--add-qkv-bias",
                      ("dropout", True): "--dropout",
                      ("dropout", False): "--no-dropout", ("qk_norm", True): "--qk-layernorm",
                      ("tied_embeddings", True): "--tie-embeddings-and-output-weights",
                      ("tied_embeddings", False): "--untie-embeddings-and-output-weights",
                      ("use_rope_scaling", True): "--use-rope-scaling",
                      ("multi_latent_attention", True): "--multi-latent-attention",
                      ("moe_router_enable_expert_bias", True): "--moe-router-enable-expert-bias",
                      ("qk_l2_norm", True): "--qk-l2-norm",
                      ("moe_apply_probs_on_input", True): "--moe-apply-probs-on-input"}
# Megatron-core's --softmax-type for ModelConfig.attention_sinks: its learnable one is GPT-OSS's sink logit per head
SOFTMAX_TYPES = {"vanilla": False, "learnable": True}
# the structure flags whose name is not their field's: field -> (flag, {field value: typed value})
STRUCTURE_NAMES = {"norm": ("--normalization", {v: k for k, v in NORMALIZATIONS.items()}),
                   "positions": ("--position-embedding-type", {v: k for k, v in POSITION_TYPES.items()}),
                   "head_width": ("--kv-channels", {}),
                   "attention_sinks": ("--softmax-type", {v: k for k, v in SOFTMAX_TYPES.items()}),
                   "window_size": ("--window-size", {}), "window_skip_freq": ("--window-attn-skip-freq", {}),
                   "norm_eps": ("--norm-epsilon", {})}
WINDOW_FLAGS = ("window_size", "window_skip_freq")  # argparse destinations that make ModelConfig.window together
# argparse destinations that make ModelConfig.rotary together (Megatron-LM's flags; `with_rotary`)
ROTARY_FLAGS = ("rotary_base", "rotary_percent", "rotary_seq_len_interpolation_factor", "use_rope_scaling",
                "rope_scaling_factor")


def window_pair(text: str) -> tuple[int, int]:
    """Megatron's --window-size "L,R" (keys i - L .. i + R of query i), causal: R must be 0."""
    parts = text.split(",")
    try:
        left, right = (int(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not two integers L,R (Megatron's tuple)") from None
    if left < 0 or right != 0:
        raise argparse.ArgumentTypeError(f"{text!r}: pipesim models causal windows, L >= 0 keys before each query "
                                         "and R = 0 after it")
    return left, right


def _fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a fraction in (0, 1]")
    return value


def _epsilon(text: str) -> float:
    value = positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number in (0, 1)")
    return value


def _named(choices: dict[str, str]):
    """An argparse type taking `choices`' keys (Megatron's spelling) to their values (ModelConfig's)."""
    def convert(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(choices)})")
        return choices[text]
    return convert


def add_structure_args(g) -> None:
    """The transformer's structure in Megatron-LM's flag names (ModelConfig's norm, positions, biases, dropout, q/k
    norm, head width and tied embeddings); each overrides a --model-config file's field, as the size flags do."""
    g.add_argument("--normalization", type=_named(NORMALIZATIONS), default=None, dest="norm",
                   metavar="{LayerNorm,RMSNorm}", help="the norms: LayerNorm (weight and bias) or RMSNorm (weight "
                                                       "only) (default LayerNorm, Megatron's)")
    g.add_argument("--position-embedding-type", type=_named(POSITION_TYPES), default=None, dest="positions",
                   metavar="{learned_absolute,rope}",
                   help="a learned seq x hidden table, or rotary embeddings (no parameters) (default learned_absolute)")
    g.add_argument("--disable-bias-linear", action="store_const", const=False, default=None, dest="biases",
                   help="no biases on the linear layers (Megatron's flag; default biases, GPT's)")
    g.add_argument("--add-qkv-bias", action="store_const", const=True, default=None, dest="qkv_bias",
                   help="with --disable-bias-linear: a bias on the QKV projection alone (Megatron's flag; Qwen2's "
                        "q/k/v_proj)")
    g.add_argument("--dropout", action=argparse.BooleanOptionalAction, default=None,
                   help="dropout after the softmax, the projection and the MLP, its masks stashed (default on, GPT's); "
                        "pipesim's cost depends on whether it runs, not on its probability, so one switch stands for "
                        "Megatron's --hidden-dropout and --attention-dropout")
    g.add_argument("--qk-layernorm", action="store_const", const=True, default=None, dest="qk_norm",
                   help="a norm over head_dim on every query and key head (Megatron's flag; Qwen3's q/k_norm)")
    g.add_argument("--kv-channels", type=positive_int, default=None, dest="head_width", metavar="D",
                   help="width of one attention head, when not hidden / heads (Megatron's flag; config.json's "
                        "head_dim)")
    g.add_argument("--softmax-type", type=_named(SOFTMAX_TYPES), default=None, dest="attention_sinks",
                   metavar="{vanilla,learnable}",
                   help="learnable: a learned sink logit per head in every softmax (Megatron-core's, GPT-OSS's); "
                        "default vanilla")
    g.add_argument("--window-size", type=window_pair, default=None, dest="window_size", metavar="L,0",
                   help="sliding-window attention: each query sees the L keys before it and itself (Megatron's "
                        "tuple, causal); default none")
    g.add_argument("--window-attn-skip-freq", type=lambda t: bounded_int(t, 2), default=None,
                   dest="window_skip_freq", metavar="N",
                   help="with a window: every N-th layer keeps full attention (layer l when (l + 1) %% N == 0, "
                        "Megatron's); default none")
    g.add_argument("--norm-epsilon", type=_epsilon, default=None, dest="norm_eps", metavar="EPS",
                   help="the norms' epsilon (Megatron's flag, default 1e-5; config.json's rms_norm_eps): `pipesim run` "
                        "builds it, no cost depends on it")
    add_rotary_args(g)
    tie = g.add_mutually_exclusive_group()
    tie.add_argument("--tie-embeddings-and-output-weights", action="store_const", const=True, default=None,
                     dest="tied_embeddings",
                     help="the output head reuses the token embedding's matrix (default untied; Megatron ties them "
                          "unless --untie-embeddings-and-output-weights)")
    tie.add_argument("--untie-embeddings-and-output-weights", action="store_const", const=False,
                     dest="tied_embeddings", help="an output head of its own (over a tied --model-config's)")


def add_rotary_args(g) -> None:
    """Megatron-LM's rotary flags (megatron/training/arguments.py and megatron/core/models/common/embeddings/
    rotary_pos_embedding.py @ d98e8a64): the frequencies `pipesim run` builds (ModelConfig.rotary); no cost depends
    on them."""
    g.add_argument("--rotary-base", type=positive_float, default=None, metavar="THETA",
                   help="with rope positions: RoPE's base period (default 10000, Megatron's; config.json's "
                        "rope_theta)")
    g.add_argument("--rotary-percent", type=_fraction, default=None, metavar="F",
                   help="with rope positions: the share of each head's features rotated, the rest passed (default 1; "
                        "config.json's partial_rotary_factor)")
    g.add_argument("--rotary-seq-len-interpolation-factor", type=positive_float, default=None, metavar="N",
                   help="with rope positions: positions divided by N, linear RoPE scaling (Megatron's flag)")
    g.add_argument("--use-rope-scaling", action="store_const", const=True, default=None,
                   help="with rope positions: Llama 3.x's frequency scaling (low 1, high 4, original context 8192, "
                        "factor --rope-scaling-factor)")
    g.add_argument("--rope-scaling-factor", type=positive_float, default=None, metavar="F",
                   help="with --use-rope-scaling: its factor (default 8, Megatron's)")


def with_window(model: ModelConfig, args: argparse.Namespace) -> ModelConfig:
    """`model` with --window-size and --window-attn-skip-freq (Megatron's): a window of L + 1 keys, every N-th layer
    full; the skip frequency alone changes the pattern of a --model-config's own window."""
    size, skip = getattr(args, "window_size", None), getattr(args, "window_skip_freq", None)
    if size is None and skip is None:
        return model
    if size is None:
        if model.window is None:
            raise PipesimError("--window-attn-skip-freq needs a sliding window: give --window-size")
        return replace(model, window=SlidingWindow(model.window.size, skip))
    every = skip if skip is not None else model.window.full_every if model.window is not None else 0
    return replace(model, window=SlidingWindow(size[0] + 1, every))


def with_rotary(model: ModelConfig, args: argparse.Namespace) -> ModelConfig:
    """`model` with Megatron-LM's rotary flags over its rotary embedding (a --model-config file's, else base 10,000
    unscaled): --rotary-base, --rotary-percent, and one scaling, Llama 3.x's (--use-rope-scaling, factor
    --rope-scaling-factor, Megatron's low 1, high 4 and original context 8192: rotary_pos_embedding.py
    `_apply_scaling`) or linear (--rotary-seq-len-interpolation-factor)."""
    typed = {name: getattr(args, name) for name in ROTARY_FLAGS if getattr(args, name, None) is not None}
    if not typed:
        return model
    first = flag_words(next(iter(typed)), next(iter(typed.values())))[0]
    if model.positions != "rope":
        raise PipesimError(f"{first} sets the rotary embedding: it needs rope positions (--position-embedding-type "
                           "rope)")
    if "rope_scaling_factor" in typed and "use_rope_scaling" not in typed:
        raise PipesimError("--rope-scaling-factor is --use-rope-scaling's factor: give --use-rope-scaling")
    if "use_rope_scaling" in typed and "rotary_seq_len_interpolation_factor" in typed:
        raise PipesimError("--use-rope-scaling and --rotary-seq-len-interpolation-factor scale RoPE two ways at once; "
                           "pipesim builds one scaling: give one")
    changes: dict = {}
    if "rotary_base" in typed:
        changes["theta"] = typed["rotary_base"]
    if "rotary_percent" in typed:
        changes["fraction"] = typed["rotary_percent"]
    if "use_rope_scaling" in typed:
        changes.update(scaling="llama3", factor=typed.get("rope_scaling_factor", 8.0), low_freq_factor=1.0,
                       high_freq_factor=4.0, original_context=8192)
    if "rotary_seq_len_interpolation_factor" in typed:
        changes.update(scaling="linear", factor=typed["rotary_seq_len_interpolation_factor"])
    rotary = replace(model.rotary or Rotary(), **changes)
    return replace(model, rotary=None if rotary == Rotary() else rotary)


def flag_words(name: str, value) -> list[str]:
    """How model flag `name` (an argparse destination of MODEL_FLAGS) is typed to give `value`: a switch alone, or
    the flag and its value in the flag's own spelling."""
    if (name, value) in STRUCTURE_SWITCHES:
        return [STRUCTURE_SWITCHES[name, value]]
    if name == "window_size":  # Megatron's tuple
        return ["--window-size", f"{value[0]},{value[1]}"]
    flag, spelled = STRUCTURE_NAMES.get(name, (f"--{name.replace('_', '-')}", {}))
    return [flag, str(spelled.get(value, value))]


__all__ = ["NORMALIZATIONS", "POSITION_TYPES", "ROTARY_FLAGS", "SOFTMAX_TYPES", "STRUCTURE_NAMES", "STRUCTURE_SWITCHES",
           "WINDOW_FLAGS", "add_rotary_args", "add_structure_args", "flag_words", "window_pair", "with_rotary",
           "with_window"]
