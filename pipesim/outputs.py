"""Output files: checked before any work starts, written atomically, all or none.

A command names its outputs up front (`check_file`, `check_folder`), so a typo in a path costs one
line and exit 2 instead of a finished run whose result is lost. Writes go to a temporary file in
the destination folder and are renamed over the target (`os.replace`), so a reader never sees half a
file and a failure (a full disk, a read-only folder) leaves nothing behind: `write_files` writes a
command's files together or not at all.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from pipesim.errors import PipesimError

FORMATS = {  # format -> (accepted suffixes, what the file holds)
    "json": ((".json",), "JSON"),
    "html": ((".html", ".htm"), "HTML"),
    "png": ((".png",), "PNG"),
    "toml": ((".toml",), "TOML"),
    "md": ((".md",), "Markdown"),
}


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # what open() would give a new file; mkstemp's 0600 is too private


def check_file(path: str | Path | None, flag: str, fmt: str) -> Path | None:
    """The output `path` of `flag`, or None when not given (or '-', stdout); PipesimError when it cannot work:
    wrong suffix for `fmt`, a folder, not a regular file, a folder that is missing or not writable."""
    if path is None or str(path) == "-":
        return None
    if not str(path).strip():
        raise PipesimError(f"{flag} needs a file name, got an empty one")
    p = Path(path)
    suffixes, what = FORMATS[fmt]
    where = f"{flag} {path}"
    if p.is_dir():
        raise PipesimError(f"{where}: is a folder; name a file (*{suffixes[0]})")
    if p.exists() and not p.is_file():
        raise PipesimError(f"{where}: exists and is not a regular file")
    if p.suffix.lower() not in suffixes:
        raise PipesimError(f"{where}: writes {what}; name the file *{suffixes[0]}")
    _check_writable_folder(p.parent, where)
    return p


def check_folder(path: str | Path | None, flag: str) -> Path | None:
    """An output folder of `flag`: an existing writable folder, or one that can be created under one."""
    if path is None:
        return None
    if not str(path).strip():
        raise PipesimError(f"{flag} needs a folder name, got an empty one")
    p = Path(path)
    where = f"{flag} {path}"
    if p.exists() and not p.is_dir():
        raise PipesimError(f"{where}: exists and is not a folder")
    existing = p
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise PipesimError(f"{where}: {existing} is not a folder")
    _check_writable_folder(existing, where)
    return p


def check_distinct(*named: tuple[str, Path | None]) -> None:
    """Two flags naming the same file would overwrite each other: refuse."""
    seen: dict[Path, str] = {}
    for flag, p in named:
        if p is None:
            continue
        key = p.resolve()
        if key in seen:
            raise PipesimError(f"{seen[key]} and {flag} name the same file {p}")
        seen[key] = flag


def check_apart(outputs: Iterable[tuple[str, Path | None]], inputs: Iterable[tuple[str, str | Path | None]]) -> None:
    """An output naming a file the command reads would replace its own input: refuse. An input folder is read
    whole, so an output inside it is refused too (the next run would read it as an input)."""
    read = [(flag, Path(p).resolve()) for flag, p in inputs if p and Path(p).exists()]
    for flag, p in outputs:
        if p is None:
            continue
        out = p.resolve()
        for source, path in read:
            if out == path:
                raise PipesimError(f"{flag} {p} is the file {source} reads: give another file")
            if path.is_dir() and path in out.parents:
                raise PipesimError(f"{flag} {p} is inside {path}, the folder {source} reads: give another folder")


def _check_writable_folder(folder: Path, where: str) -> None:
    """The folder exists and a file can be created in it: tried, since permission bits do not tell root
    about a read-only mount."""
    if not folder.is_dir():
        raise PipesimError(f"{where}: folder {folder} does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=".pipesim-probe-", dir=folder)
    except OSError as exc:
        raise PipesimError(f"{where}: folder {folder} is not writable ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)


def _fail(path: Path, exc: OSError) -> PipesimError:
    return PipesimError(f"cannot write {path}: {exc.strerror or exc}")


def write_files(files: dict[Path, str | bytes]) -> None:
    """Write every file or none: each to a temporary file beside it, then all renamed into place."""
    staged: list[tuple[str, Path]] = []
    current = next(iter(files), Path("."))
    try:
        for current, data in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{current.name}.", suffix=".tmp", dir=current.parent or ".")
            staged.append((tmp, current))
            with os.fdopen(fd, "wb") as fh:
                fh.write(data.encode() if isinstance(data, str) else data)
            os.chmod(tmp, FILE_MODE)
        for tmp, current in staged:
            os.replace(tmp, current)
    except OSError as exc:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise _fail(current, exc) from None


def write_text(path: str | Path, text: str) -> None:
    """One file, atomically (see `write_files`)."""
    write_files({Path(path): text})


@contextlib.contextmanager
def staged_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix) for a writer that wants a file name (kaleido);
    renamed over `path` when the block ends normally, removed when it raises."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent or ".")
        os.close(fd)
    except OSError as exc:
        raise _fail(path, exc) from None
    try:
        yield Path(tmp)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except OSError as exc:
        raise _fail(path, exc) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
