"""A Megatron-LM launch file read as pretrain_gpt.py's arguments: shell words (backslash-newlines joined, `#` comments
dropped), an optional launcher (torchrun or `python -m torch.distributed.run`, whose --nproc-per-node and --nnodes
give WORLD_SIZE), then `--flag value` / `--flag=value` groups checked against pipesim.commands.megatron_flags'
table; `MegatronArgs` hands each value out typed, one line for a bad one."""

from __future__ import annotations

import shlex
from pathlib import Path, PurePath

from pipesim.commands.megatron_flags import IGNORED_FLAGS, LATER, PASSED, READ, REFUSED, SWITCH, VALUE
from pipesim.commands.megatron_value_kinds import check_read_past
from pipesim.errors import PipesimError, refuse_special_file

SCRIPT = "pretrain_gpt.py"
RUN_MODULES = ("torch.distributed.run",)  # torchrun's module (`python -m torch.distributed.run`)


def words_of(path: str, where: str) -> list[str]:
    """The file's shell words: continuations joined, comments dropped, quotes removed; no shell variable left."""
    refuse_special_file(path, where)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PipesimError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PipesimError(f"{where}: cannot read: {exc}") from None
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:  # an unclosed quote
        raise PipesimError(f"{where}: not shell words: {exc}") from None
    for word in words:
        if "$" in word:
            raise PipesimError(f"{where}: {word!r} holds a shell variable: expand shell variables first")
    return words


def _launcher(words: list[str], where: str) -> tuple[int | None, list[str]]:
    """(WORLD_SIZE as torchrun's --nproc-per-node x --nnodes, None without a launcher that gives it; the script's
    arguments)."""
    if not words or words[0].startswith("--"):
        return None, words
    at = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if at is None or PurePath(words[at]).name != SCRIPT:  # the script itself, not one whose name ends so
        what = repr(words[at]) if at is not None else "no Python script"
        raise PipesimError(f"{where}: the launch runs {what}; pipesim reads {SCRIPT}'s arguments")
    head = words[:at]
    torchrun = head[:1] == ["torchrun"] or (head[:1] in (["python"], ["python3"]) and len(head) > 2
                                            and head[1] == "-m" and head[2] in RUN_MODULES)
    if head and not torchrun and head not in (["python"], ["python3"]):
        raise PipesimError(f"{where}: {' '.join(head)!r} before {SCRIPT}: pipesim reads torchrun's (or python -m "
                           "torch.distributed.run's) options")
    counts = {}
    for i, word in enumerate(head):
        name, _, value = word.partition("=")
        key = name.replace("_", "-")
        if key in ("--nproc-per-node", "--nnodes"):
            value = value or (head[i + 1] if i + 1 < len(head) else "")
            if not (value.isascii() and value.isdigit()) or int(value) < 1:  # not '²', which isdigit() takes
                raise PipesimError(f"{where}: torchrun's {name} {value!r}: give a whole number of GPUs and nodes")
            counts[key] = int(value)
    world = counts["--nproc-per-node"] * counts.get("--nnodes", 1) if "--nproc-per-node" in counts else None
    return world, words[at + 1:]


def _values(flag: str) -> int | None:
    """How many values `flag` takes (SWITCH, VALUE or LIST), None for a flag read past (any)."""
    for table in (READ, PASSED, LATER):
        if flag in table:
            return table[flag]
    return None


class MegatronArgs:
    """pretrain_gpt.py's arguments, each flag's last values (argparse's rule), with a typed reader per value."""

    def __init__(self, path: str, where: str):
        self.where = where
        self.world, words = _launcher(words_of(path, where), where)
        self.given: dict[str, list[str]] = {}
        flag = None
        for word in words:
            if word.startswith("--"):
                flag, eq, value = word.partition("=")
                self._known(flag)
                self.given[flag] = [value] if eq else []
            elif flag is None:
                raise PipesimError(f"{where}: {word!r} is not a flag ({SCRIPT} takes --flags only)")
            else:
                self.given[flag].append(word)
        for flag, values in self.given.items():
            n = _values(flag)
            if n is None:  # read past: still a value Megatron's argparse takes
                check_read_past(flag, values, where)
            if n == SWITCH and values:
                raise PipesimError(f"{where}: {flag} takes no value, got {' '.join(values)!r}")
            if n == VALUE and len(values) != 1 or n is not None and n < 0 and not values:
                raise PipesimError(f"{where}: {flag} takes {'one value' if n == VALUE else 'values'}, got "
                                   f"{len(values)}")

    def _known(self, flag: str) -> None:
        if flag in REFUSED:
            raise PipesimError(f"{self.where}: {flag} {REFUSED[flag]}")
        if flag not in IGNORED_FLAGS and _values(flag) is None:
            raise PipesimError(f"{self.where}: {flag} is not read: Megatron-LM v0.15.3 has no such flag, or it changes "
                               "the run and pipesim does not model it")

    def on(self, flag: str) -> bool:
        return flag in self.given

    def text(self, flag: str, default: str | None = None) -> str | None:
        return self.given[flag][0] if flag in self.given else default

    def texts(self, flag: str) -> list[str] | None:
        return self.given.get(flag)

    def number(self, flag: str, default, kind: type = int):
        """The value of `flag` as an int (at least 1) or a float (at least 0); `default` when not given."""
        if flag not in self.given:
            return default
        text = self.given[flag][0]
        try:
            value = kind(text)
        except ValueError:
            raise PipesimError(f"{self.where}: {flag} {text!r} is not {'an integer' if kind is int else 'a number'}") \
                from None
        if value < (1 if kind is int else 0):
            raise PipesimError(f"{self.where}: {flag} {text} must be {'at least 1' if kind is int else '>= 0'}")
        return value

    def need(self, flag: str) -> int:
        """An integer flag Megatron requires."""
        value = self.number(flag, None)
        if value is None:
            raise PipesimError(f"{self.where}: {flag} is missing (Megatron-LM requires it)")
        return value

    def one_of(self, flag: str, choices: dict[str, object], default: str, why: str):
        """`choices[value]` of a flag whose other values pipesim does not model (`why`)."""
        value = self.text(flag, default)
        if value not in choices:
            raise PipesimError(f"{self.where}: {flag} {value}: {why}")
        return choices[value]


__all__ = ["SCRIPT", "MegatronArgs", "words_of"]
