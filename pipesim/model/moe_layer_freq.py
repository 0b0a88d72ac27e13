"""Megatron-core's `--moe-layer-freq` read as pipesim's MoE layer placement (MoeConfig's `dense_layers`, `every`).

Megatron (NVIDIA/Megatron-LM v0.15.3 megatron/training/arguments.py `moe_freq_type`, and
megatron/core/models/gpt/moe_module_specs / transformer_block's `moe_layer_pattern`) takes an integer N (layer i
has experts when i % N == 0) or a Python list of 0/1, one per layer, often written as an expression such as
`([0]*3+[1]*58)` (DeepSeek-V3's three dense layers first). pipesim places the experts after `dense_layers` dense
layers on every layer l with (l + 1) % every == 0; a pattern it cannot spell that way is refused, never rounded.
"""

from __future__ import annotations

import ast

from pipesim.errors import PipesimError

FLAG = "--moe-layer-freq"


def parse_pattern(text: str, layers: int) -> list[int]:
    """One 0/1 per layer from Megatron's spelling: an integer N, or a list expression of 0/1 (literals joined by
    + and repeated by * an integer); its length must be `layers` (Megatron asserts it)."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise PipesimError(f"{FLAG} {text}: not an integer or a list of 0 and 1") from None
    value = _evaluate(tree, text)
    if isinstance(value, int):
        if value < 1:
            raise PipesimError(f"{FLAG} {text}: an integer frequency is at least 1")
        return [int(i % value == 0) for i in range(layers)]
    if len(value) != layers or any(v not in (0, 1) for v in value):
        raise PipesimError(f"{FLAG} {text}: {len(value)} entries of 0 and 1 for {layers} layers (one per layer)")
    return value


def _evaluate(node: ast.AST, text: str) -> int | list[int]:
    """An integer, a list of integers, list + list, or list * integer: nothing else is evaluated."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        items = [_evaluate(e, text) for e in node.elts]
        if all(isinstance(i, int) for i in items):
            return items
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, text), _evaluate(node.right, text)
        if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
            return left + right
        if isinstance(node.op, ast.Mult) and isinstance(left, list) != isinstance(right, list):
            times = right if isinstance(left, list) else left
            items = left if isinstance(left, list) else right
            if 0 <= times and len(items) * times <= 1_000_000:  # layers are bounded far below (MAX_LAYERS)
                return items * times
    raise PipesimError(f"{FLAG} {text}: not an integer or a list of 0 and 1")


def placement(pattern: list[int]) -> tuple[int, int]:
    """(dense_layers, every) of MoeConfig whose experts sit exactly on the pattern's 1s (the least every, then the
    fewest dense layers, where several spell it), or PipesimError."""
    if 1 not in pattern:
        raise PipesimError(f"{FLAG}: no layer has experts (give a dense model instead)")
    for every in range(1, len(pattern) + 1):  # the least `every`, then the fewest dense layers: one spelling
        for dense in range(pattern.index(1) + 1):
            if all(bool(v) == (layer >= dense and (layer + 1) % every == 0) for layer, v in enumerate(pattern)):
                return dense, every
    raise PipesimError(f"{FLAG}: experts on layers {[i for i, v in enumerate(pattern) if v]}; pipesim places them "
                       "after the first dense layers on every layer l with (l + 1) % N == 0")


def megatron_pattern(dense_layers: int, every: int, layers: int) -> str:
    """The list Megatron reads for a placement (what pipesim's exports write)."""
    return str([int(layer >= dense_layers and (layer + 1) % every == 0) for layer in range(layers)])


__all__ = ["FLAG", "megatron_pattern", "parse_pattern", "placement"]
