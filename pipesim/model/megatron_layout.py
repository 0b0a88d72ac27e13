"""Megatron-core's --pipeline-model-parallel-layout: every pipeline stage's layers spelled out in one string.

The grammar of NVIDIA/Megatron-LM @ d98e8a64 megatron/core/transformer/pipeline_parallel_layer_layout.py
(parse_str_to_list; in Megatron-core since core_v0.13.0, 77732c3628): stages in pipeline order split by "|", "E"
the embedding, "t" a decoder layer, "m" an MTP layer, "L" the loss, "(...)*n" and "x*n" repeated, commas cosmetic.
Megatron asserts the embedding first and once, the loss last and once, the decoder and MTP counts the model's and the
decoders before the MTP layers (validate_layer_layout); pipesim also keeps the embedding on the first stage and the
MTP layers and the loss on the last (its MTP modules ride with the head: a standalone MTP stage is refused).
"""

from __future__ import annotations

import re

from pipesim.errors import PipesimError

LAYOUT = "--pipeline-model-parallel-layout"
MAX_LETTERS = 1 << 20  # an unrolled layout longer than this is no model's (a guard against "t*10**20")


def _times(digits: str) -> int:
    """A repeat count, saturated above MAX_LETTERS (int() refuses strings of over 4,300 digits)."""
    return int(digits) if len(digits) <= 7 else MAX_LETTERS + 1


def parse_layout(text: str) -> list[str]:
    """Megatron-core's layout string as its stages' letters: commas dropped, "(...)*n" then "x*n" unrolled, split
    at "|" (parse_str_to_list's order of substitutions); one line for a letter Megatron does not know."""
    flat = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        matches = list(re.finditer(pattern, flat))
        if len(flat) + sum(len(m.group(1)) * _times(m.group(2)) - len(m.group(0)) for m in matches) > MAX_LETTERS:
            raise PipesimError(f"{LAYOUT} {text!r} unrolls to more than {MAX_LETTERS:,} letters")
        flat = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), flat)
    stages = flat.split("|")
    bad = sorted({c for stage in stages for c in stage if c not in "ELtm"})
    if bad:
        raise PipesimError(f"{LAYOUT} {text!r}: unknown layer letter {bad[0]!r} (E embedding, t decoder layer, "
                           "m MTP layer, L loss)")
    return stages


def layout_split(text: str, layers: int, stages: int, mtp_layers: int = 0) -> list[int]:
    """The decoder layers of each stage of a Megatron-core layout, checked as Megatron and pipesim's cost model
    need it."""
    parsed = parse_layout(text)
    if len(parsed) != stages:
        raise PipesimError(f"{LAYOUT} {text!r} has {len(parsed)} stages; the schedule has {stages} (pp x vp)")
    flat = "".join(parsed)
    if flat.count("E") != 1 or flat.count("L") != 1 or not flat.startswith("E") or not flat.endswith("L"):
        raise PipesimError(f"{LAYOUT} {text!r}: the embedding E must come first and the loss L last, once each")
    if "E" not in parsed[0] or "L" not in parsed[-1]:
        raise PipesimError(f"{LAYOUT} {text!r}: pipesim keeps the embedding on the first stage and the loss on the "
                           "last; an empty stage before E or after L is not modelled")
    if flat.count("t") != layers or flat.count("m") != mtp_layers:
        raise PipesimError(f"{LAYOUT} {text!r} holds {flat.count('t')} decoder and {flat.count('m')} MTP layers; "
                           f"the model has {layers} and {mtp_layers}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise PipesimError(f"{LAYOUT} {text!r}: decoder layers must come before the MTP layers")
    if any("m" in stage for stage in parsed[:-1]):
        raise PipesimError(f"{LAYOUT} {text!r}: a standalone MTP stage is not modelled (pipesim runs the MTP "
                           "modules with the head, on the last stage)")
    return [stage.count("t") for stage in parsed]


def megatron_layout(split: list[int], mtp_layers: int = 0) -> str:
    """The --pipeline-model-parallel-layout string of `split` (layers per stage in pipeline order): the embedding on
    the first stage, the MTP layers and the loss on the last, runs of equal stages between them as "(...|)*k"
    (the form of Megatron-Bridge's recipes: "Et*4|(t*4|)*14tmL")."""
    def layers(n: int) -> str:
        return f"t*{n}" if n > 1 else "t" * n
    if len(split) == 1:
        return "E" + layers(split[0]) + "m" * mtp_layers + "L"
    out = "E" + layers(split[0]) + "|"
    middle = [layers(n) for n in split[1:-1]]
    k = 0
    while k < len(middle):
        run = 1
        while k + run < len(middle) and middle[k + run] == middle[k]:
            run += 1
        out += f"({middle[k]}|)*{run}" if run > 1 else middle[k] + "|"
        k += run
    return out + layers(split[-1]) + "m" * mtp_layers + "L"


__all__ = ["LAYOUT", "layout_split", "megatron_layout", "parse_layout"]
