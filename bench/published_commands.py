"""A published row's command: parsed as `pipesim simulate` would, with one mechanism switched, or on another hardware.

bench/bench_published.py runs the rows of bench/published_rows.toml; this module turns their command strings into
the argv it runs: `parse_command` (a repository hardware file resolved against the root), `switched_argv` (a
breakdown switch: flags added or dropped, or a hardware variant written by `hardware_variant`) and
`substitute_hardware` (`--hardware PRESET=FILE`, e.g. a `pipesim calibrate --gpu` file).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path

from pipesim.cli import build_parser
from pipesim.commands.setup_args import apply_framework
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import NESTED_SECTIONS, hardware_to_toml, load_hardware

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Switch:
    """One way of switching one mechanism, as a transformation of a row's command (bench/published_rows.toml)."""

    mechanism: str  # the mechanism's short name
    label: str  # how it is switched, for the reader
    hardware: tuple[tuple[str, object], ...] = ()  # dotted Hardware field -> value, on the row's --hardware
    add_flags: tuple[str, ...] = ()
    drop_flags: tuple[str, ...] = ()
    skip_when: tuple[tuple[str, ...], ...] = ()  # argument sequences on which the switch cannot act
    without_optimizer: bool = False  # the same run, less its optimizer step (without_optimizer)
    short: str = ""  # the rows file's `short`: its column heading in the table of relative effects under each switch
    family: str = ""  # only rows whose --hardware has this device family (a figure of that family's profile)
    drop_valued: tuple[str, ...] = ()  # flags dropped with the value after them (e.g. a file)

    @property
    def heading(self) -> str:
        return self.short or self.mechanism


def switches(mechanisms: list[dict]) -> list[Switch]:
    """The rows file's [[mechanisms.switch]] tables, in order."""
    out = []
    for m in mechanisms:
        for s in m.get("switch", []):
            out.append(Switch(m["short"], s["label"], tuple(s.get("hardware", {}).items()),
                              tuple(s.get("add_flags", [])), tuple(s.get("drop_flags", [])),
                              tuple(tuple(shlex.split(w)) for w in s.get("skip_when", [])),
                              bool(s.get("without_optimizer", False)), s.get("short", ""), s.get("family", ""),
                              tuple(s.get("drop_valued", []))))
    return out


def parse_command(command: str) -> tuple[list[str], argparse.Namespace]:
    """argv after `pipesim`, and its parsed flags; the command must be a `pipesim simulate` line. A relative
    `--hardware`, `--model-config` or `--tp-comm-overlap-cfg` file path is the repository's (bench/hardware/,
    bench/models/, bench/tp_overlap/), as typed from its root: resolved against it."""
    words = shlex.split(command)
    if words[:2] != ["pipesim", "simulate"]:
        raise ValueError(f"not a `pipesim simulate` command: {command}")
    for i in range(2, len(words)):
        if (words[i - 1], Path(words[i]).suffix) in (("--hardware", ".toml"), ("--model-config", ".json"),
                                                      ("--tp-comm-overlap-cfg", ".yaml")) \
                and not Path(words[i]).is_absolute() and (ROOT / words[i]).is_file():
            words[i] = str(ROOT / words[i])
    return words[1:], apply_framework(build_parser().parse_args(words[1:]))


def contains(words: list[str], seq: tuple[str, ...]) -> bool:
    return any(tuple(words[i:i + len(seq)]) == seq for i in range(len(words) - len(seq) + 1))


def hardware_variant(spec: str, changes: tuple[tuple[str, object], ...], directory: Path) -> Path:
    """A TOML file of hardware `spec` (preset or file) with dotted fields replaced, e.g. ("device.family", "") or
    ("device.kernels.matmul_efficiency", 0.7) (a [device.kernels] table is started when the spec has none)."""
    hw = load_hardware(spec)
    for dotted, value in changes:
        *path, last = dotted.split(".")
        parents = [hw]
        for name in path:
            section = getattr(parents[-1], name, None)
            if section is None and name in NESTED_SECTIONS:  # a table the file may leave out: start it empty
                section = NESTED_SECTIONS[name]()
            if section is None or not dataclasses.is_dataclass(section):
                raise ValueError(f"hardware {spec}: no section {dotted!r}")
            parents.append(section)
        if last not in {f.name for f in dataclasses.fields(parents[-1])}:
            raise ValueError(f"hardware {spec}: no field {dotted!r}")
        node = dataclasses.replace(parents[-1], **{last: value})
        for parent, name in zip(reversed(parents[:-1]), reversed(path)):
            node = dataclasses.replace(parent, **{name: node})
        hw = node
    digest = hashlib.sha1(repr((spec, changes)).encode()).hexdigest()[:10]
    out = directory / f"{Path(spec).stem}-{digest}.toml"
    out.write_text(hardware_to_toml(hw))
    return out


def switched_argv(command: str, switch: Switch, directory: Path) -> list[str] | None:
    """argv of the row's command with `switch` applied; None where it would run the same (skip_when, no change)."""
    words, _ = parse_command(command)
    if switch.without_optimizer or any(contains(words, seq) for seq in switch.skip_when):
        return None
    if switch.family and load_hardware(words[words.index("--hardware") + 1]).device.family != switch.family:
        return None  # another family's profile: the switch's figures are not its
    valued = {i + 1 for i, w in enumerate(words) if w in switch.drop_valued}  # the values of dropped flags
    out = [w for i, w in enumerate(words) if w not in switch.drop_flags + switch.drop_valued and i not in valued]
    out += [f for f in switch.add_flags if f not in out]
    if switch.hardware:
        if "--hardware" not in out:
            raise ValueError(f"a hardware switch needs --hardware in the command: {command}")
        i = out.index("--hardware") + 1
        out[i] = str(hardware_variant(out[i], switch.hardware, directory))
    return None if out == words else out


def substitute_hardware(data: dict, pairs: list[str]) -> dict:
    """`data` with every row's `--hardware PRESET` replaced by FILE for each PRESET=FILE (e.g. the file `pipesim
    calibrate --gpu` wrote on that GPU); a file that does not load is refused in one line."""
    swap = {}
    for pair in pairs:
        preset, sep, path = pair.partition("=")
        if not sep or not preset or not path:
            raise PipesimError(f"--hardware {pair!r}: give PRESET=FILE, e.g. dgx-a100=gpu_calibration/hardware.toml")
        load_hardware(path)  # a bad file: its own one-line error, before any run
        swap[preset] = path

    def swapped(command: str) -> str:
        words = shlex.split(command)
        return shlex.join(swap.get(w, w) if i and words[i - 1] == "--hardware" else w for i, w in enumerate(words))

    return {**data, "rows": [dataclasses.replace(r, command=swapped(r.command)) for r in data["rows"]]}


__all__ = ["ROOT", "Switch", "hardware_variant", "parse_command", "substitute_hardware", "switched_argv", "switches"]
