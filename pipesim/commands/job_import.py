"""What the job-file importers (`--from-torchtitan JOB.toml`, `--from-megatron ARGS`) share: where the file's flag
sits on the command line, and what the rest of the command line says of the job (its GPUs: the frameworks'
WORLD_SIZE; a model typed to replace the file's)."""

from __future__ import annotations

import argparse

from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.sim.sim_setup import DEFAULT_HARDWARE


def _degree(text: str) -> int | None:
    """A degree typed over the job file's: one integer, or a list of them (plan's search; None: the search's, not a
    degree of the file's job)."""
    parts = text.split(",")
    try:
        values = [int(x) for x in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    return values[0] if len(values) == 1 else None


class _RestParser(argparse.ArgumentParser):
    """The pre-read's parser: a bad value is the command's one-line error, not argparse's usage block."""

    def error(self, message: str):  # noqa: D401
        raise PipesimError(message)


def typed_rest(argv: list[str]) -> argparse.Namespace:
    """What the rest of the command line says of the job: the GPUs (--hardware, --nodes, --nvlink-domain, or plan's
    --gpus: the frameworks' WORLD_SIZE), a model of its own (--model-config or --model, replacing the file's) and the
    degrees typed over the file's (--tp, --stages, --cp: the data-parallel degree follows them, as in Megatron)."""
    p = _RestParser(add_help=False, allow_abbrev=False)  # the flags as typed, no prefix of another
    p.add_argument("--hardware", default=DEFAULT_HARDWARE)
    for flag in ("--nodes", "--nvlink-domain", "--gpus", "--vocab"):
        p.add_argument(flag, type=int, default=None)
    for flag in ("--tp", "--stages", "--cp"):  # plan's take a list (1,2,4): the degree is typed over the file's then
        p.add_argument(flag, type=_degree, default=None)
    p.add_argument("--model-config", default=None)
    p.add_argument("--model", default=None)
    return p.parse_known_args(argv)[0]


def world_size(typed: argparse.Namespace) -> int:
    """The job's GPUs, as the command will have them."""
    if typed.gpus is not None:
        return typed.gpus
    hw = load_hardware(typed.hardware)
    if typed.nvlink_domain is not None:
        hw = hw.with_domain(typed.nvlink_domain)
    if typed.nodes is not None:
        hw = hw.with_nodes(typed.nodes)
    return hw.num_devices


def take_file(argv: list[str], flag: str) -> tuple[str, list[str]]:
    """(the file `flag` names, `argv` without the flag and its file): `flag FILE` or `flag=FILE`, given once."""
    at = [i for i, a in enumerate(argv) if a == flag or a.startswith(flag + "=")]
    if len(at) != 1:
        raise PipesimError(f"{flag} takes one file")
    i = at[0]
    if "=" in argv[i]:
        path, del_to = argv[i].split("=", 1)[1], i + 1
    elif i + 1 < len(argv):
        path, del_to = argv[i + 1], i + 2
    else:
        raise PipesimError(f"{flag} needs a file")
    return path, argv[:i] + argv[del_to:]


def split_command(argv: list[str], flag: str, whose: str) -> tuple[str, list[str], str | None, bool]:
    """(the file, the rest of the command line, a schedule typed before it or None, whether `plan`) of `simulate
    [SCHEDULE] flag FILE REST` or `plan flag FILE REST`; a --framework beside the file is refused (`whose`: the
    file's stack, which is its framework)."""
    path, rest = take_file(list(argv[1:]), flag)
    planning = argv[0] == "plan"
    name = rest[0] if rest and not rest[0].startswith("-") and not planning else None
    if name is not None:
        rest = rest[1:]
    if any(a == "--framework" or a.startswith("--framework=") for a in rest):
        raise PipesimError(f"{flag}: the file is {whose}; drop --framework")
    return path, rest, name, planning


def keep_flags(flags: list[str], kept: tuple[str, ...]) -> list[str]:
    """The flags of `kept` (with their values) among translated `flags` (every value a word, never a --flag)."""
    out, keep = [], False
    for word in flags:
        if word.startswith("--"):
            keep = word in kept
        if keep:
            out.append(word)
    return out


__all__ = ["keep_flags", "split_command", "take_file", "typed_rest", "world_size"]
