"""Shared flags: one meaning for --stages, --microbatches, --model, --json, ... everywhere."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import schedules
from pipesim import torch_csv
from pipesim.errors import PipesimError
from pipesim.ir import Schedule
from pipesim.model.config import ModelConfig


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def int_list(text: str) -> list[int]:
    """`4,8,16` -> [4, 8, 16] (each positive)."""
    return [positive_int(t) for t in text.split(",") if t.strip()]


def add_schedule_args(parser: argparse.ArgumentParser, *, stages_default: int = 4, mb_default: int = 8) -> None:
    """NAME (or --from-csv FILE), --stages P, --microbatches M, --virtual V."""
    parser.add_argument("name", nargs="?", metavar="NAME",
                        help="registered schedule (see `pipesim schedule --list`)")
    parser.add_argument("--stages", "-p", type=positive_int, default=stages_default, metavar="P",
                        help=f"pipeline ranks (default {stages_default})")
    parser.add_argument("--microbatches", "-m", type=positive_int, default=mb_default, metavar="M",
                        help=f"microbatches per step (default {mb_default})")
    parser.add_argument("--virtual", "-v", type=positive_int, default=None, metavar="V",
                        help="model chunks per rank (interleaved schedules; default the schedule's)")
    parser.add_argument("--from-csv", metavar="FILE",
                        help="a torch.distributed.pipelining schedule CSV instead of NAME")


def load_schedule(args: argparse.Namespace, *, validate: bool = True) -> Schedule:
    """The schedule named by NAME or --from-csv, validated."""
    from pipesim.schedule_check import validate as check  # networkx: kept out of `pipesim`'s start-up

    if args.from_csv and args.name:
        raise PipesimError("give a schedule NAME or --from-csv FILE, not both")
    if args.from_csv:
        sched = torch_csv.load(args.from_csv)
    elif args.name:
        sched = schedules.build(args.name, args.stages, args.microbatches, args.virtual)
    else:
        raise PipesimError(f"name a schedule ({', '.join(schedules.names())}) or give --from-csv FILE")
    if validate:
        check(sched)
    return sched


def add_model_args(parser: argparse.ArgumentParser, *, default: str | None = "mlp") -> None:
    """--model mlp|gpt with --hidden, --layers, --heads, --seq, --vocab, --batch, --dtype, --seed."""
    d = ModelConfig()
    g = parser.add_argument_group("model")
    g.add_argument("--model", choices=("mlp", "gpt"), default=default,
                   help=f"model to cost or train (default {default})")
    g.add_argument("--hidden", type=positive_int, default=d.hidden, help=f"width / d_model (default {d.hidden})")
    g.add_argument("--layers", type=positive_int, default=d.layers, help=f"layers or blocks (default {d.layers})")
    g.add_argument("--heads", type=positive_int, default=d.heads, help=f"attention heads, gpt (default {d.heads})")
    g.add_argument("--seq", type=positive_int, default=d.seq, help=f"sequence length, gpt (default {d.seq})")
    g.add_argument("--vocab", type=positive_int, default=d.vocab, help=f"vocabulary, gpt (default {d.vocab})")
    g.add_argument("--batch", type=positive_int, default=d.batch, help=f"global batch per step (default {d.batch})")
    g.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=d.dtype)
    g.add_argument("--seed", type=int, default=d.seed)


def model_config(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(kind=args.model, hidden=args.hidden, layers=args.layers, heads=args.heads, seq=args.seq,
                       vocab=args.vocab, batch=args.batch, dtype=args.dtype, seed=args.seed)


def add_output_args(parser: argparse.ArgumentParser, *, trace: bool = True) -> None:
    """--json [FILE] (stdout when no FILE) and --trace FILE (Perfetto JSON)."""
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                        help="write the result as JSON to FILE, or to stdout without FILE")
    if trace:
        parser.add_argument("--trace", metavar="FILE", help="write a Perfetto/Chrome trace (JSON) to FILE")


def emit_json(target: str | None, data: dict) -> None:
    """Write `data` to stdout ('-') or a file; seconds and bytes, no formatting."""
    if target is None:
        return
    text = json.dumps(data, indent=2, sort_keys=False)
    if target == "-":
        sys.stdout.write(text + "\n")
        return
    try:
        Path(target).write_text(text + "\n")
    except OSError as exc:
        raise PipesimError(f"cannot write {target}: {exc}") from None
