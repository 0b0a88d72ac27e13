"""Output files (pipesim.outputs): checked before work, written atomically, all or none.

The failing writes are real: a file-size limit (RLIMIT_FSIZE, what a full disk looks like to a writer:
EFBIG instead of ENOSPC) on a real `pipesim` process, and real read-only folders.
"""

from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipesim.errors import PipesimError
from pipesim.outputs import check_distinct, check_file, check_folder, staged_path, write_files, write_text

ROOT = Path(__file__).resolve().parents[1]


def test_check_file_accepts_a_new_file_in_a_writable_folder(tmp_path):
    assert check_file(tmp_path / "r.json", "--json", "json") == tmp_path / "r.json"
    assert check_file(tmp_path / "R.HTML", "--plot", "html") == tmp_path / "R.HTML"  # suffixes case-blind
    assert check_file(None, "--json", "json") is None and check_file("-", "--json", "json") is None  # stdout
    assert list(tmp_path.iterdir()) == []  # the writability probe leaves nothing behind


@pytest.mark.parametrize(("name", "fmt", "message"), [
    ("r.txt", "json", "--x {p}: writes JSON; name the file *.json"),
    ("x.png", "html", "--x {p}: writes HTML; name the file *.html"),
    ("x.jpg", "png", "--x {p}: writes PNG; name the file *.png"),
    ("hw.json", "toml", "--x {p}: writes TOML; name the file *.toml"),
    ("sub", "json", "--x {p}: is a folder; name a file (*.json)"),
    ("nodir/r.json", "json", "--x {p}: folder {d}/nodir does not exist"),
])
def test_check_file_refuses(tmp_path, name, fmt, message):
    (tmp_path / "sub").mkdir()
    p = tmp_path / name
    with pytest.raises(PipesimError) as err:
        check_file(p, "--x", fmt)
    assert str(err.value) == message.format(p=p, d=tmp_path)


def test_check_file_refuses_a_device_and_a_read_only_folder(tmp_path):
    with pytest.raises(PipesimError, match="exists and is not a regular file"):
        check_file("/dev/full", "--json", "json")
    read_only = "/sys" if os.geteuid() == 0 else str(tmp_path)  # root ignores permission bits; sysfs is read-only
    if os.geteuid() != 0:
        tmp_path.chmod(0o555)
    try:
        with pytest.raises(PipesimError, match="is not writable"):
            check_file(f"{read_only}/r.json", "--json", "json")
        with pytest.raises(PipesimError, match="is not writable"):
            check_folder(f"{read_only}/new-folder", "--save-dir")
    finally:
        tmp_path.chmod(0o755)


def test_check_folder(tmp_path):
    assert check_folder(tmp_path / "a" / "b", "--keep") == tmp_path / "a" / "b"  # creatable: fine, not created
    assert not (tmp_path / "a").exists()
    (tmp_path / "f").write_text("x")
    with pytest.raises(PipesimError, match="exists and is not a folder"):
        check_folder(tmp_path / "f", "--keep")
    with pytest.raises(PipesimError, match="is not a folder"):
        check_folder(tmp_path / "f" / "sub", "--keep")


def test_check_distinct(tmp_path):
    check_distinct(("--json", tmp_path / "a.json"), ("--trace", tmp_path / "b.json"), ("--plot", None))
    with pytest.raises(PipesimError, match="--json and --trace name the same file"):
        check_distinct(("--json", tmp_path / "a.json"), ("--trace", tmp_path / "." / "a.json"))


def test_write_files_writes_all_with_a_normal_mode(tmp_path):
    write_files({tmp_path / "a.json": "{}\n", tmp_path / "b.png": b"\x89PNG"})
    assert (tmp_path / "a.json").read_text() == "{}\n" and (tmp_path / "b.png").read_bytes() == b"\x89PNG"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.png"]


def test_write_files_is_all_or_none(tmp_path):
    (tmp_path / "a.json").write_text("old")
    with pytest.raises(PipesimError, match="cannot write"):
        write_files({tmp_path / "a.json": "new", tmp_path / "gone" / "b.json": "x"})  # second folder missing
    assert (tmp_path / "a.json").read_text() == "old"  # the first file was not replaced
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # and its temporary file is gone


def test_staged_path_replaces_on_success_and_removes_on_failure(tmp_path):
    target = tmp_path / "x.png"
    with staged_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".png"
        tmp.write_bytes(b"png")
    assert target.read_bytes() == b"png"
    with pytest.raises(RuntimeError), staged_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("kaleido died")
    assert target.read_bytes() == b"png" and [p.name for p in tmp_path.iterdir()] == ["x.png"]


def _limit_file_size() -> None:
    """In the child: files may not grow past 8 KiB (writes fail with EFBIG, as on a full disk)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))


def _pipesim(argv: list[str], cwd: Path, *, full: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "pipesim", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False, preexec_fn=_limit_file_size if full else None)


@pytest.mark.parametrize("argv", [
    ["simulate", "1f1b", "-p", "2", "-m", "4", "--json", "r.json", "--trace", "t.json"],  # JSON small, trace not
    ["sweep", "--schedules", "gpipe,1f1b", "--json", "s.json", "--plot", "s.html"],
    ["schedule", "1f1b", "--plot", "u.html"],
    ["plot", "t.json", "-o", "c.html"],
], ids=["simulate", "sweep", "schedule", "plot"])
def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, argv):
    src = _pipesim(["simulate", "1f1b", "-p", "2", "-m", "4", "--trace", "t.json"], tmp_path, full=False)
    assert src.returncode == 0, src.stderr
    before = {p.name for p in tmp_path.iterdir()}
    done = _pipesim(argv, tmp_path, full=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "cannot write" in done.stderr and "File too large" in done.stderr
    assert {p.name for p in tmp_path.iterdir()} == before  # no partial file, no temporary file


def test_simulate_with_a_bad_trace_writes_no_json(tmp_path):
    done = _pipesim(["simulate", "1f1b", "--json", "r.json", "--trace", "/nonexistent/t.json"], tmp_path, full=False)
    assert done.returncode == 2 and done.stderr == ("pipesim: error: --trace /nonexistent/t.json: folder "
                                                    "/nonexistent does not exist\n")
    assert list(tmp_path.iterdir()) == []


def test_outputs_replace_an_existing_file_whole(tmp_path):
    (tmp_path / "r.json").write_text("an older, longer result " * 1000)
    done = _pipesim(["simulate", "1f1b", "-p", "2", "-m", "2", "--cost", "F=1,B=2", "--json", "r.json"], tmp_path,
                    full=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.json").read_text().startswith("{") and "older" not in (tmp_path / "r.json").read_text()
    write_text(tmp_path / "r.json", "x")
    assert (tmp_path / "r.json").read_text() == "x"


def test_validate_never_overwrites_a_tracked_report_by_default(tmp_path):
    """`pipesim validate` writes to pipesim-validate/ by default and refuses to replace a file git tracks there
    unless --out names it; it refuses before measuring anything."""
    report = tmp_path / "pipesim-validate" / "validation.md"
    report.parent.mkdir()
    report.write_text("the tracked report")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q"], ["add", "pipesim-validate/validation.md"], ["commit", "-qm", "report"]):
        subprocess.run([*git, *cmd], cwd=tmp_path, check=True, capture_output=True)
    done = _pipesim(["validate", "--quick", "--no-png"], tmp_path, full=False)
    assert done.returncode == 2 and done.stderr == ("pipesim: error: pipesim-validate/validation.md is tracked by "
                                                    "git; name the report with --out to overwrite it\n")
    assert report.read_text() == "the tracked report"
