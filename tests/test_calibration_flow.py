"""The calibration annex is a client: its modules import one way, and nothing below it imports it.

Read with ast (module-level and function-local imports alike), so a lazy import cannot hide an
arrow that runs back.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "pipesim.calibration"
# the flow: the torchrun worker and its launcher, the timelines read, the fit, the hardware file, the report,
# and the validation campaign that drives them all
ORDER = ("runs", "speed_check", "reused", "launcher", "fit", "measured", "plan", "refine", "calibrate", "rescale",
         "from_trace", "validation", "isolated", "report", "plots", "campaign", "gpu", "gpu_measure")
CLIENTS = ("pipesim/commands", "pipesim/cli.py", "pipesim/__main__.py")  # the CLI sits on top of it


def _imported(path: Path) -> set[str]:
    """Every absolute module name `path` imports (`from a import b` counts as a and a.b)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_order_names_every_module_of_the_package():
    files = {p.stem for p in (ROOT / "pipesim" / "calibration").glob("*.py")} - {"__init__"}
    assert files == set(ORDER)


def test_modules_import_only_earlier_steps_of_the_flow():
    for i, name in enumerate(ORDER):
        used = {n.split(".")[2] for n in _imported(ROOT / "pipesim" / "calibration" / f"{name}.py")
                if n.startswith(PKG + ".")}
        later = sorted(used - set(ORDER[:i]))
        assert not later, f"{PKG}.{name} imports {later}, which come after it in the flow"


def test_nothing_outside_the_cli_imports_the_calibration():
    offenders = []
    for pkg in ("pipesim", "executor", "schedules"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("pipesim/calibration/") or rel.startswith(CLIENTS):
                continue
            if any(n == PKG or n.startswith(PKG + ".") for n in _imported(path)):
                offenders.append(rel)
    assert offenders == []
