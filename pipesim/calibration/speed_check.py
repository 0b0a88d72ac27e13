"""Is this the machine a CPU hardware file was calibrated on? One cheap speed probe, cached per machine.

`pipesim simulate --hardware local-cpu` predicts the machine the preset was measured on; on another one the
prediction can miss by tens of percent with nothing said. A hardware file with a `[host] probe_seconds` (the
speed probe, `pipesim.calibration.runs.speed_probe`: a few 1024-wide matmuls forward and backward on one
thread, ~8 ms) says how fast its machine ran that probe; this machine runs it once (about a second with
torch's import), keeps the figure under ~/.cache/pipesim (per host name, CPU model and core count), and when
the two differ by more than the file's `probe_tolerance` prints one line with the command that measures this
machine, once per (machine, hardware file). A file measured on this very machine (`probe_machine`, which
`pipesim calibrate` writes) is not checked: its own speed of the moment is the noise it states.
`PIPESIM_SPEED_CHECK=0` turns it off (the test suite does).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

from pipesim.hardware.machine import Hardware

CACHE_NAME = "speed-probe.json"
PROBE_TOLERANCE = 0.25  # a full calibration's: the local-cpu preset's choice (docs/whatif.md)


def cache_dir() -> Path:
    """~/.cache/pipesim, or $PIPESIM_CACHE_DIR, or $XDG_CACHE_HOME/pipesim."""
    if os.environ.get("PIPESIM_CACHE_DIR"):
        return Path(os.environ["PIPESIM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pipesim"


def machine_key() -> str:
    """What identifies this machine's speed: host name, CPU model, cores."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()} | {model} | {os.cpu_count()} cores"


def _probe() -> float:
    from pipesim.calibration.runs import speed_probe  # local import: torch, only when the cache has no figure

    return speed_probe()


def machine_probe(measure: Callable[[], float] = _probe, where: Path | None = None) -> tuple[float, dict]:
    """(this machine's probe seconds, the cache's contents): measured once per machine, then read back."""
    path = (where or cache_dir()) / CACHE_NAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    key = machine_key()
    if not isinstance(data, dict) or data.get("machine") != key or not isinstance(data.get("seconds"), float):
        data = {"machine": key, "seconds": float(measure()), "warned": []}
        _save(path, data)
    return data["seconds"], data


def _save(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:  # a read-only home: check again next time rather than fail the simulation
        pass


def speed_note(hw: Hardware | None, name: str, measure: Callable[[], float] = _probe,
               where: Path | None = None) -> str | None:
    """The one line to print when `hw` (given as `name`) was calibrated on a machine of another speed, the first
    time this machine meets it; None otherwise (no probe figure in the file, within tolerance, already said)."""
    host = hw.host if hw is not None else None
    if host is None or not host.probe_seconds or not host.probe_tolerance \
            or os.environ.get("PIPESIM_SPEED_CHECK", "1") == "0" or host.probe_machine == machine_key():
        return None  # no figure to compare, the check turned off, or a file measured on this very machine
    seconds, data = machine_probe(measure, where)
    ratio = seconds / host.probe_seconds
    if abs(ratio - 1) <= host.probe_tolerance:
        return None
    said = f"{name} | {host.probe_seconds!r}"
    if said in data.get("warned", []):
        return None
    data.setdefault("warned", []).append(said)
    _save((where or cache_dir()) / CACHE_NAME, data)
    pace = f"{ratio:.2f}x slower" if ratio > 1 else f"{1 / ratio:.2f}x faster"
    return (f"pipesim: note: this machine is {pace} than the one {name} was calibrated on (speed probe "
            f"{seconds * 1e3:.2f} ms vs {host.probe_seconds * 1e3:.2f} ms, beyond its +-{host.probe_tolerance:.0%}), "
            f"so the prediction is for that machine; measure this one: pipesim calibrate --quick --rescale {name} "
            f"-o hw.toml (~10 s) or pipesim calibrate -o hw.toml (~2.5 min), then --hardware hw.toml")


__all__ = ["PROBE_TOLERANCE", "cache_dir", "machine_key", "machine_probe", "speed_note"]
