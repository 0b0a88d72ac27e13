"""The layer-split flags (simulate, sweep, plan, run): Megatron-core's five and torchtitan's two
(pipesim.model.pipeline_split), the torchtitan profile's defaults (pipesim.frameworks), and what may go with what."""

from __future__ import annotations

import argparse

from pipesim.commands.arg_types import bounded_int
from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.pipeline_split import (
    ACCOUNT_EMBEDDING,
    ACCOUNT_LOSS,
    FIRST_LAYERS,
    FIRST_LESS,
    LAST_LAYERS,
    LAST_LESS,
    LAYOUT,
    SplitRule,
)

LESS = ("pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers")  # profile switches


def _count(text: str) -> int:
    return bounded_int(text, 0)


def add_split_args(group) -> None:
    """The seven flags, beside --layer-split."""
    group.add_argument(ACCOUNT_EMBEDDING, action="store_true", dest="account_embedding",
                       help="Megatron-core: the embedding takes one layer's slot of the first chunk (the layers and "
                            "slots split evenly over p x v chunks)")
    group.add_argument(ACCOUNT_LOSS, action="store_true", dest="account_loss",
                       help="Megatron-core: the loss (output head) takes one layer's slot of the last chunk")
    group.add_argument(FIRST_LAYERS, type=_count, default=None, metavar="N", dest="first_layers",
                       help="Megatron-core: N layers on the first pipeline rank, the rest evenly over the others")
    group.add_argument(LAST_LAYERS, type=_count, default=None, metavar="N", dest="last_layers",
                       help="Megatron-core: N layers on the last pipeline rank, the rest evenly over the others")
    group.add_argument(LAYOUT, default=None, metavar="STR", dest="pp_layout",
                       help="Megatron-core: every stage's layers spelled out, e.g. 'Et*3|(t*4|)*2t*3L' (E embedding, "
                            "t decoder layer, m MTP layer, L loss, | between stages in pipeline order)")
    group.add_argument(FIRST_LESS, type=_count, default=None, metavar="N", dest=LESS[0],
                       help="torchtitan: the embedding weighs N layers in the split (default --framework "
                            "torchtitan's 1, else 0)")
    group.add_argument(LAST_LESS, type=_count, default=None, metavar="N", dest=LESS[1],
                       help="torchtitan: the output (norm and head) weighs N layers in the split (default "
                            "--framework torchtitan's 1, else 0)")


def typed_split(args: argparse.Namespace) -> list[str]:
    """The split flags typed on the command line, read before --framework fills its switches."""
    typed = [flag for flag, dest in ((ACCOUNT_EMBEDDING, "account_embedding"), (ACCOUNT_LOSS, "account_loss"))
             if getattr(args, dest, False)]
    typed += [flag for flag, dest in ((FIRST_LAYERS, "first_layers"), (LAST_LAYERS, "last_layers"),
                                      (LAYOUT, "pp_layout"), (FIRST_LESS, LESS[0]), (LAST_LESS, LESS[1]))
              if getattr(args, dest, None) is not None]
    return typed


def split_rule(args: argparse.Namespace, typed: list[str], model: ModelConfig | None, *,
               explicit: bool = False) -> SplitRule:
    """The rule of the flags (`typed`: `typed_split` before --framework applied), with the profile's torchtitan
    weights where none was typed. `explicit`: --layer-split was given, which wins over a profile's weights and goes
    with no typed split flag. A flag that names no transformer's split (--model mlp, hand-given costs) is refused."""
    if explicit:
        if typed:
            raise PipesimError(f"--layer-split gives every stage's layers: it cannot go with {typed[0]}")
        return SplitRule()
    if model is None or model.kind != "gpt":
        if typed:
            raise PipesimError(f"{typed[0]} splits a transformer's layers around its embedding and head: it needs "
                               "--model gpt, moe or a --model-config")
        return SplitRule()
    megatron = any(f in typed for f in (ACCOUNT_EMBEDDING, ACCOUNT_LOSS, FIRST_LAYERS, LAST_LAYERS, LAYOUT))
    less = tuple(getattr(args, d, None) or 0 for d in LESS)
    if megatron and any(less) and not any(f in typed for f in (FIRST_LESS, LAST_LESS)):
        raise PipesimError(f"--framework {args.framework} splits the layers by torchtitan's weights: Megatron-core's "
                           f"{next(f for f in typed)} cannot go with it (give --layer-split)")
    return SplitRule(account_embedding=bool(getattr(args, "account_embedding", False)),
                     account_loss=bool(getattr(args, "account_loss", False)),
                     first_layers=getattr(args, "first_layers", None), last_layers=getattr(args, "last_layers", None),
                     first_less=less[0], last_less=less[1], layout=getattr(args, "pp_layout", None))


__all__ = ["LESS", "add_split_args", "split_rule", "typed_split"]
