"""Writing figures: self-contained HTML always, PNG through kaleido when a Chromium is present.

HTML embeds plotly.js (include_plotlyjs=True), so it opens offline; both formats are written atomically
(a failed export leaves no file). kaleido 1.x drives a local
Chromium and can hang without one, so PNG export finds the browser first and runs kaleido in a
child process under a timeout: a missing or stuck browser is one error line, never a hang.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import plotly.graph_objects as go

from pipesim.errors import PipesimError
from pipesim.outputs import staged_path, write_text

PNG_TIMEOUT = 120.0  # seconds for one PNG, browser start included
DEBIAN_CHROMIUM = "/usr/bin/chromium"  # where Debian's `chromium` package puts it
NO_CHROMIUM = "PNG export needs Chromium (apt-get install chromium); HTML was written"

_KALEIDO_CHILD = """
import sys
import plotly.io as pio
fig = pio.read_json(sys.argv[1])
fig.write_image(sys.argv[2], format="png", width=int(sys.argv[3]), height=int(sys.argv[4]), scale=2)
"""


def html_text(fig: go.Figure) -> str:
    """A standalone page with plotly.js inlined (works offline, no CDN)."""
    config = {"displaylogo": False, "scrollZoom": True, "toImageButtonOptions": {"format": "png", "scale": 2}}
    return fig.to_html(include_plotlyjs=True, full_html=True, config=config)


def write_html(fig: go.Figure, path: str | Path) -> Path:
    """The standalone page, written atomically (pipesim.outputs)."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise PipesimError(f"cannot write {path}: folder {path.parent} does not exist")
    write_text(path, html_text(fig))
    return path


def find_chromium() -> str | None:
    """The Chromium kaleido should drive: $BROWSER_PATH, /usr/bin/chromium, or one on PATH."""
    for candidate in (os.environ.get("BROWSER_PATH"), DEBIAN_CHROMIUM):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _run_bounded(cmd: list[str], *, env: dict, cwd: str, timeout: float) -> tuple[int | None, str]:
    """Run `cmd` in its own process group; on timeout kill the whole group (Chromium included)."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stderr
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, ""


def write_png(fig: go.Figure, path: str | Path, *, timeout: float = PNG_TIMEOUT) -> Path:
    """Render `fig` to PNG with kaleido; raises PipesimError when no Chromium (or kaleido) is usable."""
    browser = find_chromium()
    if browser is None:
        raise PipesimError(NO_CHROMIUM)
    try:
        import kaleido  # noqa: F401
    except ImportError:
        raise PipesimError("PNG export needs kaleido (pip install 'pipesim[png]'); HTML was written") from None
    path = Path(path)
    width = int(fig.layout.width or 1400)
    height = int(fig.layout.height or 700)
    env = {**os.environ, "BROWSER_PATH": browser}
    with tempfile.TemporaryDirectory(prefix="pipesim-png-") as tmp, staged_path(path) as staged:
        spec = Path(tmp) / "figure.json"
        spec.write_text(fig.to_json())
        cmd = [sys.executable, "-c", _KALEIDO_CHILD, str(spec), str(staged.resolve()), str(width), str(height)]
        code, stderr = _run_bounded(cmd, env=env, cwd=tmp, timeout=timeout)
        if code is None:
            raise PipesimError(f"PNG export timed out after {timeout:.0f} s (Chromium at {browser}); "
                               "HTML was written")
        if code != 0 or staged.stat().st_size == 0:
            last = (stderr.strip().splitlines() or ["unknown error"])[-1]
            raise PipesimError(f"PNG export failed ({last}); HTML was written")
    return path
