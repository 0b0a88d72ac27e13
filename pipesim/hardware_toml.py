"""Hardware TOML files: read with strict one-line errors, write so that reading gives the same Hardware.

A bad figure in a hardware file silently skews every simulated number, so every field is checked
for name, type and sign, and the error names the file, the field and what was found.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

from pipesim.errors import PipesimError
from pipesim.hardware import DeviceSpec, Hardware, LinkClass

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

# field -> (kind, required, unit). Kinds: str, pos (number > 0), nonneg (number >= 0), frac (0 < x <= 1),
# posint (int >= 1), bool, flops (table of dtype -> pos).
_TOP = {
    "name": ("str", True, ""),
    "devices_per_node": ("posint", True, ""),
    "num_nodes": ("posint", True, ""),
    "per_action_overhead": ("nonneg", False, "seconds"),
    "per_op_overhead": ("nonneg", False, "seconds"),
    "backward_op_overhead": ("nonneg", False, "seconds"),
    "host_cores": ("posint", False, ""),
    "node_corun_slowdown": ("nonneg", False, ""),
    "oversubscription_slowdown": ("nonneg", False, ""),
    "time_slice": ("nonneg", False, "seconds"),
    "roofline": ("str", False, ""),
    "split_backward_overhead": ("nonneg", False, "seconds"),
    "split_group_overhead": ("nonneg", False, "seconds"),
    "split_graph_overhead": ("nonneg", False, "seconds"),
    "send_overhead": ("nonneg", False, "seconds"),
    "late_recv_delay": ("nonneg", False, "seconds"),
    "oversubscribed_recv_delay": ("nonneg", False, "seconds"),
    "source": ("str", False, ""),
}
_DEVICE = {
    "name": ("str", True, ""),
    "flops": ("flops", True, "FLOP/s"),
    "hbm_bandwidth": ("pos", True, "bytes/s"),
    "memory": ("posint", True, "bytes"),
    "compute_efficiency": ("frac", True, ""),
    "kind_efficiency": ("kinds", False, ""),
    "kind_memory_efficiency": ("kinds", False, ""),
}
_LINK = {
    "name": ("str", True, ""),
    "bandwidth": ("pos", True, "bytes/s"),
    "peak_bandwidth": ("pos", False, "bytes/s"),
    "latency": ("nonneg", True, "seconds"),
    "shared": ("bool", False, ""),
}
_DTYPES = ("float32", "bfloat16", "float16")
_SECTIONS = ("device", "intra", "inter")


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
    if kind == "str":
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


def _fields(label: str, section: str, table: object, schema: dict) -> dict:
    """Checked fields of one table; unknown and missing fields are errors."""
    prefix = f"[{section}]." if section else ""
    if not isinstance(table, dict):
        raise PipesimError(f"{label}: [{section}] must be a table, got {table!r}")
    allowed = set(schema) | (set(_SECTIONS) if not section else set())
    for key in table:
        if key not in allowed:
            raise PipesimError(f"{label}: unknown field {prefix}{key} (allowed: {', '.join(sorted(allowed))})")
    out = {}
    for key, (kind, required, unit) in schema.items():
        if key not in table:
            if required:
                raise PipesimError(f"{label}: missing field {prefix}{key}")
            continue
        out[key] = _check(label, f"{prefix}{key}", table[key], kind, unit)
    return out


def _link(label: str, section: str, table: object) -> LinkClass:
    f = _fields(label, section, table, _LINK)
    return LinkClass(name=f["name"], bandwidth=f["bandwidth"], peak_bandwidth=f.get("peak_bandwidth", f["bandwidth"]),
                     latency=f["latency"], shared=f.get("shared", False))


def hardware_from_dict(data: dict, label: str = "hardware") -> Hardware:
    """Build and check a Hardware from parsed TOML (`label` prefixes every error, e.g. the file name)."""
    top = _fields(label, "", data, _TOP)
    for section in ("device", "intra"):
        if section not in data:
            raise PipesimError(f"{label}: missing section [{section}]")
    dev = _fields(label, "device", data["device"], _DEVICE)
    device = DeviceSpec(name=dev["name"], flops=dev["flops"], hbm_bandwidth=dev["hbm_bandwidth"],
                        memory=dev["memory"], compute_efficiency=dev["compute_efficiency"],
                        kind_efficiency=dev.get("kind_efficiency"),
                        kind_memory_efficiency=dev.get("kind_memory_efficiency"))
    if top.get("roofline", "max") not in ("max", "sum"):
        raise PipesimError(f"{label}: roofline must be \"max\" or \"sum\", got {top['roofline']!r}")
    intra = _link(label, "intra", data["intra"])
    inter = _link(label, "inter", data["inter"]) if "inter" in data else None
    if top["num_nodes"] > 1 and inter is None:
        raise PipesimError(f"{label}: num_nodes = {top['num_nodes']} needs an [inter] section (the link across nodes)")
    return Hardware(name=top["name"], device=device, devices_per_node=top["devices_per_node"],
                    num_nodes=top["num_nodes"], intra=intra, inter=inter,
                    per_action_overhead=top.get("per_action_overhead", 0.0),
                    per_op_overhead=top.get("per_op_overhead", 0.0), host_cores=top.get("host_cores"),
                    node_corun_slowdown=top.get("node_corun_slowdown", 0.0),
                    oversubscription_slowdown=top.get("oversubscription_slowdown", 0.0),
                    time_slice=top.get("time_slice", 0.0),
                    roofline=top.get("roofline", "max"),
                    split_backward_overhead=top.get("split_backward_overhead", 0.0),
                    split_group_overhead=top.get("split_group_overhead", 0.0),
                    backward_op_overhead=top.get("backward_op_overhead"),
                    split_graph_overhead=top.get("split_graph_overhead", 0.0),
                    send_overhead=top.get("send_overhead", 0.0), late_recv_delay=top.get("late_recv_delay", 0.0),
                    oversubscribed_recv_delay=top.get("oversubscribed_recv_delay", 0.0),
                    source=top.get("source", ""))


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


def hardware_to_toml(hw: Hardware) -> str:
    """TOML text for `hw`; units in comments; `load_hardware` reads it back equal."""
    lines = [f"# pipesim hardware: {hw.name}", "# units: bytes/s, seconds, bytes, FLOP/s", ""]
    lines.append(f"name = {_value(hw.name)}")
    if hw.source:
        lines.append(f"source = {_value(hw.source)}")
    lines += [f"devices_per_node = {hw.devices_per_node}", f"num_nodes = {hw.num_nodes}",
              f"per_action_overhead = {_value(float(hw.per_action_overhead))}  # seconds"]
    if hw.per_op_overhead:
        lines.append(f"per_op_overhead = {_value(float(hw.per_op_overhead))}  # seconds per framework op")
    if hw.backward_op_overhead is not None:
        lines.append(f"backward_op_overhead = {_value(float(hw.backward_op_overhead))}  # seconds per op of I, W")
    if hw.host_cores is not None:
        lines.append(f"host_cores = {hw.host_cores}")
    if hw.roofline != "max":
        lines.append(f"roofline = {_value(hw.roofline)}  # compute + memory time (they do not overlap)")
    if hw.time_slice:
        lines.append(f"time_slice = {_value(float(hw.time_slice))}  # seconds: ranks > cores take turns")
    if hw.oversubscription_slowdown:
        lines.append(f"oversubscription_slowdown = {_value(float(hw.oversubscription_slowdown))}"
                     + ("  # while any rank waits for a core" if hw.time_slice else "  # per runnable rank > cores"))
    if hw.split_backward_overhead:
        lines.append(f"split_backward_overhead = {_value(float(hw.split_backward_overhead))}  # seconds per I or W")
    if hw.split_group_overhead:
        lines.append(f"split_group_overhead = {_value(float(hw.split_group_overhead))}"
                     "  # seconds per weighted op of the stage, per W")
    if hw.split_graph_overhead:
        lines.append(f"split_graph_overhead = {_value(float(hw.split_graph_overhead))}"
                     "  # seconds per backward op of the stage, per I")
    if hw.send_overhead:
        lines.append(f"send_overhead = {_value(float(hw.send_overhead))}  # seconds per SEND (isend posting)")
    if hw.late_recv_delay:
        lines.append(f"late_recv_delay = {_value(float(hw.late_recv_delay))}  # seconds, RECV begun after its SEND")
    if hw.oversubscribed_recv_delay:
        lines.append(f"oversubscribed_recv_delay = {_value(float(hw.oversubscribed_recv_delay))}"
                     "  # seconds more when ranks > cores")
    if hw.node_corun_slowdown:
        lines.append(f"node_corun_slowdown = {_value(float(hw.node_corun_slowdown))}  # per other runnable rank")
    d = hw.device
    lines += ["", "[device]", f"name = {_value(d.name)}",
              f"hbm_bandwidth = {_value(float(d.hbm_bandwidth))}  # bytes/s",
              f"memory = {int(d.memory)}  # bytes", f"compute_efficiency = {_value(float(d.compute_efficiency))}",
              "flops = { " + ", ".join(f"{k} = {_value(float(v))}" for k, v in sorted(d.flops.items()))
              + " }  # FLOP/s"]
    for field_name in ("kind_efficiency", "kind_memory_efficiency"):
        kinds = getattr(d, field_name)
        if kinds:
            lines.append(f"{field_name} = {{ " + ", ".join(f"{k} = {_value(float(v))}" for k, v in
                                                           sorted(kinds.items())) + " }")
    for section, link in (("intra", hw.intra), ("inter", hw.inter)):
        if link is None:
            continue
        lines += ["", f"[{section}]", f"name = {_value(link.name)}",
                  f"bandwidth = {_value(float(link.bandwidth))}  # bytes/s per direction, effective",
                  f"peak_bandwidth = {_value(float(link.peak_bandwidth))}  # bytes/s per direction, datasheet",
                  f"latency = {_value(float(link.latency))}  # seconds", f"shared = {_value(link.shared)}"]
    return "\n".join(lines) + "\n"
