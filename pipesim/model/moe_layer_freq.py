"""Megatron-core's `--moe-layer-freq` read as pipesim's MoE layer placement (MoeConfig's `dense_layers`, `every`).

Megatron (NVIDIA/Megatron-LM v0.15.3 megatron/training/arguments.py `moe_freq_type`, and
megatron/core/models/gpt/moe_module_specs / transformer_block's `moe_layer_pattern`) takes an integer N (layer i
has experts when i % N == 0) or a Python list of 0/1, one per layer, often written as an expression such as
`([0]*3+[1]*58)` (DeepSeek-V3's three dense layers first). pipesim places the experts after `dense_layers` dense
layers on every layer l with (l + 1) % every == 0; a pattern it cannot spell that way is refused, never rounded.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable

from pipesim.errors import PipesimError

FLAG = "--moe-layer-freq"
MAX_TEXT = 400_000  # characters of a pattern: ModelConfig.MAX_LAYERS 0s and 1s written out as a list take 196,608


def parse_pattern(text: str, layers: int, *, flag: str = FLAG,
                  integer: Callable[[int], list[int]] | None = None) -> list[int]:
    """One 0/1 per layer from Megatron's spelling: an integer N (`integer(N)`'s pattern; default --moe-layer-freq's,
    layer i when i % N == 0), or a list expression of 0/1 (literals joined by + and repeated by * an integer); its
    length must be `layers` (Megatron asserts it). `flag` names the flag in errors (--no-rope-freq reads the same
    spellings)."""
    if len(text) > MAX_TEXT:
        raise PipesimError(f"{flag}: {len(text)} characters; write a long pattern as an expression such as "
                           "'([0]*3+[1]*58)'")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
        value = _evaluate(tree, text, max(layers, 1), flag)
    except (SyntaxError, RecursionError, MemoryError):  # a malformed or too deeply nested expression
        raise PipesimError(f"{flag} {text[:60]}: not an integer or a list of 0 and 1") from None
    if isinstance(value, int):
        if value < 1:
            raise PipesimError(f"{flag} {text}: an integer frequency is at least 1")
        return integer(value) if integer is not None else [int(i % value == 0) for i in range(layers)]
    if len(value) != layers or any(v not in (0, 1) for v in value):
        raise PipesimError(f"{flag} {text}: {len(value)} entries of 0 and 1 for {layers} layers (one per layer)")
    return value


def _evaluate(node: ast.AST, text: str, layers: int, flag: str = FLAG) -> int | list[int]:
    """An integer, a list of integers, list + list, or list * integer: nothing else is evaluated, and no list
    longer than the model's layers is built (a longer one could not be the pattern)."""
    out: int | list[int] | None = None
    if isinstance(node, ast.Constant) and type(node.value) is int:
        out = node.value
    elif isinstance(node, ast.List):
        items = [_evaluate(e, text, layers, flag) for e in node.elts]
        out = items if all(isinstance(i, int) for i in items) else None
    elif isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, text, layers, flag), _evaluate(node.right, text, layers, flag)
        if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
            out = left + right if len(left) + len(right) <= layers else None
        elif isinstance(node.op, ast.Mult) and isinstance(left, list) != isinstance(right, list):
            times, items = (right, left) if isinstance(left, list) else (left, right)
            out = items * times if 0 <= times and len(items) * times <= layers else None
    if out is None:
        raise PipesimError(f"{flag} {text[:60]}: not an integer or a list of at most {layers} 0s and 1s")
    return out


def placement(pattern: list[int], *, flag: str = FLAG) -> tuple[int, int]:
    """(dense_layers, every) of MoeConfig whose experts sit exactly on the pattern's 1s (the least every, then the
    fewest dense layers, where several spell it), or PipesimError naming `flag` (a config.json's field, too)."""
    ones = [layer for layer, v in enumerate(pattern) if v]
    if not ones:
        raise PipesimError(f"{flag}: no layer has experts (give a dense model instead)")
    g = 0
    for layer in ones:  # every `every` divides each expert layer's l + 1
        g = math.gcd(g, layer + 1)
    for every in (e for e in range(1, g + 1) if g % e == 0):  # the least `every`, then the fewest dense layers
        zeros = [layer for layer in range(every - 1, len(pattern), every) if not pattern[layer]]
        dense = zeros[-1] + 1 if zeros else 0  # the last dense layer where the period would put experts
        if dense <= ones[0]:
            return dense, every
    shown = ", ".join(map(str, ones[:8])) + (", ..." if len(ones) > 8 else "")
    raise PipesimError(f"{flag}: experts on layers [{shown}]; pipesim places them "
                       "after the first dense layers on every layer l with (l + 1) % N == 0")


def megatron_pattern(dense_layers: int, every: int, layers: int) -> str:
    """The list Megatron reads for a placement (what pipesim's exports write)."""
    return str([int(layer >= dense_layers and (layer + 1) % every == 0) for layer in range(layers)])


__all__ = ["FLAG", "megatron_pattern", "parse_pattern", "placement"]
