"""The import graph of pipesim, executor and schedules: one way up, no cycles, the CLI on top.

Every `import` and `from ... import` is read with ast, module-level and function-local alike
(relative imports resolved; those under `if TYPE_CHECKING:` never run: they count for cycles only);
`from pkg import name` points at `pkg.name` when that is a module, else at `pkg`. An import of a
module's own ancestor package is not an edge (Python initialises the
package first; the schedules registry relies on it). Three rules:

1. No cycles (each strongly connected component is printed with one cycle through it).
2. Only the CLI imports the CLI: nothing outside `pipesim.commands`, `pipesim.cli` and
   `pipesim.__main__` imports `pipesim.commands`.
3. A function-local import must keep something heavy out of a command's start-up. It is allowed
   when (a) it imports a heavy third-party package (HEAVY: torch, plotly, kaleido, selenium,
   networkx, numpy, scipy, pandas: each import costs more than pipesim's whole `--help`), or (b) it imports a module
   of ours that loads a heavy package at import time, directly or through module-level imports
   (its package `__init__`s included) -- computed here, not taken on trust -- or (c) its line
   carries a `# local import: <why>` comment for any other reason. Anything else (a stdlib
   module, a light module of ours) belongs at the top of the file.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipesim", "executor", "schedules")
CLI = "pipesim.commands"
CLI_ENTRY = ("pipesim.cli", "pipesim.__main__")
HEAVY = ("torch", "plotly", "kaleido", "selenium", "networkx", "numpy", "scipy", "pandas")
MARK = "# local import:"


@dataclass(frozen=True)
class Import:
    """One import statement's target, as written and as resolved to a module of ours (or None)."""

    module: str  # the importing module
    line: int
    name: str  # the absolute dotted name imported
    target: str | None  # the module of ours it resolves to
    local: bool  # inside a function
    marked: bool  # its line carries MARK
    typing_only: bool = False  # under `if TYPE_CHECKING:`: never runs, but still a dependency (cycles count it)


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _comments(source: str) -> dict[int, str]:
    return {tok.start[0]: tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}


def _type_checking_only(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:`: its imports name types for annotations and never run."""
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _walk(node: ast.AST, in_function: bool = False, typing_only: bool = False):
    """(import node, inside a function?, under `if TYPE_CHECKING:`?) for every import under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function, typing_only
        yield from _walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                         typing_only or _type_checking_only(child))


def imports(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    known = modules(root, packages)
    found = []
    for mod, path in known.items():
        source = path.read_text()
        comments = _comments(source)
        is_pkg = path.name == "__init__.py"
        for node, local, typing_only in _walk(ast.parse(source)):
            marked = MARK in comments.get(node.lineno, "")
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join([*pkg, base] if base else pkg)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for name in dict.fromkeys(names):
                found.append(Import(mod, node.lineno, name, _resolve(name, known), local, marked, typing_only))
    return found


def graph(found: list[Import], *, module_level_only: bool = False) -> nx.DiGraph:
    """Edges between our modules (an import of one's own ancestor package left out)."""
    g = nx.DiGraph()
    for imp in found:
        g.add_node(imp.module)
        t = imp.target
        if t is None or t == imp.module or imp.module.startswith(t + ".") or (
                module_level_only and (imp.local or imp.typing_only)):
            continue
        g.add_edge(imp.module, t)
    return g


def cycles(found: list[Import]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module."""
    g = graph(found)
    return [[a for a, _ in nx.find_cycle(g.subgraph(c))] for c in nx.strongly_connected_components(g) if len(c) > 1]


def cli_imports(found: list[Import]) -> list[str]:
    def is_cli(m: str) -> bool:
        return m == CLI or m.startswith(CLI + ".") or m in CLI_ENTRY

    return sorted({f"{i.module} -> {i.target}" for i in found
                   if i.target and is_cli(i.target) and not is_cli(i.module)})


def heavy_at_import(found: list[Import]) -> set[str]:
    """Our modules whose import loads a HEAVY package (module-level imports, ancestors' __init__ included)."""
    g = graph(found, module_level_only=True)
    for mod in list(g.nodes):
        parts = mod.split(".")
        for k in range(1, len(parts)):
            if ".".join(parts[:k]) in g:
                g.add_edge(mod, ".".join(parts[:k]))  # importing a.b.c runs a/__init__ and a/b/__init__
    direct = {i.module for i in found if not i.local and not i.typing_only and i.name.split(".")[0] in HEAVY}
    return {m for m in g.nodes if m in direct or direct & nx.descendants(g, m)}


def reused_names(root: Path, folders: tuple[str, ...] = (*PACKAGES, "bench", "tests", "examples")) -> list[str]:
    """Module file names (package `__init__`/`__main__` aside) that occur more than once in the project."""
    seen: dict[str, list[str]] = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            if path.name not in ("__init__.py", "__main__.py"):
                seen.setdefault(path.name, []).append(str(path.relative_to(root)))
    return sorted(f"{name}: {', '.join(paths)}" for name, paths in seen.items() if len(paths) > 1)


def bad_local_imports(found: list[Import]) -> list[str]:
    heavy = heavy_at_import(found)
    bad = []
    for i in found:
        if not i.local or i.marked or i.name.split(".")[0] in HEAVY:
            continue
        if i.target in heavy:
            continue
        bad.append(f"{i.module}:{i.line} imports {i.name} inside a function")
    return sorted(bad)


# --- the project -------------------------------------------------------------------------------

def test_no_import_cycles():
    found = cycles(imports(ROOT))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join([*c, c[0]]) for c in found)


def test_only_the_cli_imports_the_cli():
    found = cli_imports(imports(ROOT))
    assert not found, "library modules importing pipesim.commands:\n" + "\n".join(found)


def test_function_local_imports_keep_heavy_modules_out_of_start_up():
    found = bad_local_imports(imports(ROOT))
    assert not found, (f"function-local imports of nothing heavy (move them to the top, or mark the line "
                       f"'{MARK} <why>'):\n" + "\n".join(found))


def test_no_module_name_is_used_twice():
    found = reused_names(ROOT)
    assert not found, "module names used twice (a reader cannot tell which one is meant):\n" + "\n".join(found)


# --- the checker itself, on a made-up package --------------------------------------------------

def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_finds_cycles_cli_imports_and_light_local_imports(tmp_path):
    root = _package(tmp_path, {
        "pipesim/__init__.py": "",
        "pipesim/a.py": "from . import b\n",
        "pipesim/b.py": "def f():\n    from pipesim.a import x\n",  # cycle through a function-local import
        "pipesim/plotting.py": "import plotly\n",
        "pipesim/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n",  # never runs
        "pipesim/hint_a.py": "from pipesim import hint_b\n",
        "pipesim/hint_b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipesim import hint_a\n",
        "pipesim/uses.py": ("def f():\n    import os\n    import torch.nn\n    from pipesim import plotting\n"
                            "    import json  # local import: measured, 2 s\n"),
        "pipesim/commands/__init__.py": "",
        "pipesim/commands/run_cmd.py": "from pipesim import a\n",
        "pipesim/cli.py": "from pipesim.commands import run\n",
        "pipesim/lib.py": "from .commands.run_cmd import main\n",
    })
    found = imports(root, ("pipesim",))
    assert sorted(sorted(c) for c in cycles(found)) == [["pipesim.a", "pipesim.b"],
                                                        ["pipesim.hint_a", "pipesim.hint_b"]]  # annotations count
    assert cli_imports(found) == ["pipesim.lib -> pipesim.commands.run_cmd"]
    assert bad_local_imports(found) == ["pipesim.b:2 imports pipesim.a inside a function",
                                        "pipesim.uses:2 imports os inside a function"]
    assert heavy_at_import(found) == {"pipesim.plotting"}


def indexed_modules(doc: str) -> set[str]:
    """The module paths docs/architecture.md's index lists (its table rows that start with a path in backticks)."""
    rows = [line.split("`")[1] for line in doc.splitlines() if line.startswith("| `")]
    return {path for path in rows if path.endswith(".py")}


def project_modules(root: Path) -> set[str]:
    """Every module file of the three packages (package `__init__`/`__main__` aside), as a path from the root."""
    return {str(p.relative_to(root)) for pkg in PACKAGES for p in (root / pkg).rglob("*.py")
            if p.name not in ("__init__.py", "__main__.py")}


def test_architecture_doc_indexes_every_module_and_no_other():
    listed, present = indexed_modules((ROOT / "docs" / "architecture.md").read_text()), project_modules(ROOT)
    assert not present - listed, f"modules missing from docs/architecture.md's index: {sorted(present - listed)}"
    assert not listed - present, f"docs/architecture.md indexes modules that do not exist: {sorted(listed - present)}"


def test_checker_finds_a_module_name_used_twice(tmp_path):
    root = _package(tmp_path, {
        "pipesim/__init__.py": "",
        "pipesim/progress.py": "",
        "pipesim/sim/__init__.py": "",
        "pipesim/sim/links.py": "",
        "executor/__init__.py": "",
        "executor/progress.py": "",
        "tests/test_links.py": "",
    })
    assert reused_names(root, ("pipesim", "executor", "tests")) == [
        "progress.py: pipesim/progress.py, executor/progress.py"]
