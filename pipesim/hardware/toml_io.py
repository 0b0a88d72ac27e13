"""Hardware TOML files: read with strict one-line errors, write so that reading gives the same Hardware.

A bad figure in a hardware file silently skews every simulated number, so every field is checked
for name, type and sign, and the error names the file, the field and what was found.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, fields
from importlib import resources
from pathlib import Path

from pipesim.errors import PipesimError
from pipesim.hardware.machine import COLLECTIVE_KINDS, DeviceSpec, Hardware, HostProfile, KernelFigures, LinkClass

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

_DTYPES = ("float32", "bfloat16", "float16")
_SECTIONS = {"device": DeviceSpec, "intra": LinkClass, "inter": LinkClass, "scale_out": LinkClass,
             "host": HostProfile}  # [table] -> type
NESTED_SECTIONS = {"kernels": KernelFigures}  # [device.kernels] -> type (a table inside a section)
# top-level keys of files written before the [host] table existed -> where they live now
_MOVED = {"host_cores": "[host].cores", **{k: f"[host].{k}" for k in (
    "node_corun_slowdown", "oversubscription_slowdown", "time_slice", "send_overhead", "late_recv_delay",
    "split_backward_overhead", "split_group_overhead", "split_graph_overhead")}}


def _presets_dir():
    return resources.files("pipesim").joinpath("presets")


def preset_names() -> list[str]:
    """Names of the hardware presets shipped with pipesim, sorted."""
    return sorted(p.name[:-5] for p in _presets_dir().iterdir() if p.name.endswith(".toml"))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check(label: str, where: str, value: object, kind: str, unit: str) -> object:
    """The value if it has the right type and sign, else a one-line PipesimError."""
    suffix = f" ({unit})" if unit else ""
    if kind in ("str", "choice"):
        if not isinstance(value, str):
            raise PipesimError(f"{label}: {where} must be a string, got {value!r}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise PipesimError(f"{label}: {where} must be true or false, got {value!r}")
        return value
    if kind == "posint":
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PipesimError(f"{label}: {where} must be a positive integer{suffix}, got {value!r}")
        return value
    if kind == "kinds":
        if not isinstance(value, dict) or not value:
            raise PipesimError(f"{label}: {where} must be a table of kind = factor, e.g. {{ F = 1.0, I = 0.8 }}")
        for k, v in value.items():
            if k not in ("F", "I", "W"):
                raise PipesimError(f"{label}: {where} has unknown kind {k!r}; use F, I, W")
            _check(label, f"{where}.{k}", v, "pos", unit)
        return {k: float(v) for k, v in value.items()}
    if kind == "collectives":
        if not isinstance(value, dict) or not value:
            raise PipesimError(f"{label}: {where} must be a table of collective = factor, e.g. "
                               "{ all_gather = 0.9, reduce_scatter = 0.95 }")
        for k, v in value.items():
            if k not in COLLECTIVE_KINDS:
                raise PipesimError(f"{label}: {where} has unknown collective {k!r}; use {', '.join(COLLECTIVE_KINDS)}")
            _check(label, f"{where}.{k}", v, "pos", unit)
        return {k: float(v) for k, v in value.items()}
    if kind == "flops":
        if not isinstance(value, dict) or not value:
            raise PipesimError(f"{label}: {where} must be a table of dtype = FLOP/s, e.g. {{ bfloat16 = 9.89e14 }}")
        for dtype, v in value.items():
            if dtype not in _DTYPES:
                raise PipesimError(f"{label}: {where} has unknown dtype {dtype!r}; use {', '.join(_DTYPES)}")
            _check(label, f"{where}.{dtype}", v, "pos", unit)
        return {k: float(v) for k, v in value.items()}
    ok = _is_number(value) and (
        (kind == "pos" and value > 0) or (kind == "nonneg" and value >= 0) or (kind == "frac" and 0 < value <= 1)
    )
    if not ok:
        want = {"pos": "a positive number", "nonneg": "a number >= 0", "frac": "a number in (0, 1]"}[kind]
        raise PipesimError(f"{label}: {where} must be {want}{suffix}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def _table(label: str, section: str, table: object, cls: type) -> dict:
    """Checked values of one table for dataclass `cls`, nested sections built; unknown and missing fields are errors."""
    prefix = f"[{section}]." if section else ""
    if not isinstance(table, dict):
        raise PipesimError(f"{label}: [{section}] must be a table, got {table!r}")
    specs = {f.name: f for f in fields(cls)}
    for key in table:
        if key not in specs:
            moved = f" (moved to {_MOVED[key]})" if not section and key in _MOVED else ""
            raise PipesimError(f"{label}: unknown field {prefix}{key}{moved} (allowed: {', '.join(sorted(specs))})")
    out = {}
    for name, f in specs.items():
        meta = f.metadata
        required = f.default is MISSING and "default_from" not in meta
        if name not in table:
            if meta["kind"] == "section" and required:
                raise PipesimError(f"{label}: missing section [{name}]")
            if required:
                raise PipesimError(f"{label}: missing field {prefix}{name}")
            continue
        if meta["kind"] == "section":
            cls = NESTED_SECTIONS[name] if section else _SECTIONS[name]
            out[name] = cls(**_table(label, f"{section}.{name}" if section else name, table[name], cls))
        else:
            out[name] = _check(label, f"{prefix}{name}", table[name], meta["kind"], meta["unit"])
            if meta["kind"] == "choice" and out[name] not in meta["choices"]:
                want = " or ".join(f'"{c}"' for c in meta["choices"])
                raise PipesimError(f"{label}: {prefix}{name} must be {want}, got {out[name]!r}")
    for name, f in specs.items():
        if name not in out and "default_from" in f.metadata:
            out[name] = out[f.metadata["default_from"]]
    return out


def hardware_from_dict(data: dict, label: str = "hardware") -> Hardware:
    """Build and check a Hardware from parsed TOML (`label` prefixes every error, e.g. the file name)."""
    hw = Hardware(**_table(label, "", data, Hardware))
    if hw.num_nodes > 1 and hw.inter is None:
        raise PipesimError(f"{label}: num_nodes = {hw.num_nodes} needs an [inter] section (the link across nodes)")
    if hw.device.kernels is not None and not hw.device.family:
        raise PipesimError(f"{label}: [device.kernels] needs [device].family (the profile whose figures they replace)")
    return hw


def _parse(text: str, label: str) -> dict:
    if tomllib is None:
        raise PipesimError(f"{label}: reading TOML needs Python 3.11+ or the tomli package")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PipesimError(f"{label}: not valid TOML: {exc}") from None


def load_hardware(spec: str) -> Hardware:
    """A preset name or a TOML file path -> checked Hardware."""
    names = preset_names()
    if spec in names:
        text = _presets_dir().joinpath(f"{spec}.toml").read_text(encoding="utf-8")
        return hardware_from_dict(_parse(text, f"preset {spec}"), f"preset {spec}")
    path = Path(spec)
    if not path.is_file():
        raise PipesimError(f"unknown hardware {spec!r}: not a preset ({', '.join(names)}) and no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PipesimError(f"{spec}: cannot read: {exc}") from None
    return hardware_from_dict(_parse(text, spec), spec)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, float):
        return repr(value)  # shortest round-tripping form, e.g. 3.7e+11, 1e-06, 0.5
    return str(value)


def _lines(obj: object, always: bool) -> list[str]:
    """`key = value  # unit, doc` for each plain field of `obj`, in declaration order; defaults left out
    unless `always` (a link table is written in full)."""
    out = []
    for f in fields(obj):
        meta, value = f.metadata, getattr(obj, f.name)
        if meta["kind"] == "section" or value is None:
            continue
        if not always and f.default is not MISSING and value == f.default:
            continue
        if meta["kind"] in ("flops", "kinds", "collectives"):
            text = "{ " + ", ".join(f"{k} = {_value(float(v))}" for k, v in sorted(value.items())) + " }"
        elif meta["kind"] in ("pos", "nonneg", "frac"):
            text = _value(float(value))
        else:
            text = _value(value)
        note = ", ".join(x for x in (meta["unit"], meta["doc"]) if x)
        out.append(f"{f.name} = {text}" + (f"  # {note}" if note else ""))
    return out


def hardware_to_toml(hw: Hardware) -> str:
    """TOML text for `hw`; units in comments; `load_hardware` reads it back equal."""
    lines = [f"# pipesim hardware: {hw.name}", "# units: bytes/s, seconds, bytes, FLOP/s", "", *_lines(hw, False)]
    for section in _SECTIONS:
        table = getattr(hw, section)
        if table is not None:
            lines += ["", f"[{section}]", *_lines(table, section != "host")]
            for name in NESTED_SECTIONS:
                nested = getattr(table, name, None)
                if nested is not None:
                    lines += ["", f"[{section}.{name}]", *_lines(nested, False)]
    return "\n".join(lines) + "\n"
