"""Every command of docs/published_examples.md: the published large-model configurations fit 80 GiB with the
papers' features and are refused (one line naming the rank, total and largest term) without them."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from pipesim.cli import main

DOC = Path(__file__).resolve().parent.parent / "docs" / "published_examples.md"
LINE = re.compile(r"^(pipesim simulate .*?)\s+# (fits|refused)$")
GiB = 2**30


def _examples() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in map(LINE.match, DOC.read_text().splitlines()) if m]


def test_the_doc_has_every_paper_row():
    rows = _examples()
    # NAR21 x (fits, refused), KOR22 x (selective, full, refused), Llama 3 x 3, BLOOM x 2, MT-NLG (3 fits, 1 refused)
    assert len(rows) == 2 * 10 + 3 * 4 + 3 + 2 + 4
    assert sum(1 for cmd, _ in rows if "--model-config llama3-405b" in cmd) == 3  # Llama 3, BLOOM (fits, refused)
    assert sum(1 for cmd, _ in rows if "jean-zay-a100.toml" in cmd) == 2


@pytest.mark.parametrize("command,outcome", _examples(), ids=lambda x: x if x in ("fits", "refused") else None)
def test_published_row(command, outcome, tmp_path, capsys):
    argv = shlex.split(command)[1:] + ["--json", str(tmp_path / "out.json")]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    if outcome == "fits":
        assert code == 0, err
        ranks = json.loads((tmp_path / "out.json").read_text())["memory"]["ranks"]
        assert max(r["total"] for r in ranks) <= 80 * GiB
        assert all(r["total"] == sum(r[k] for k in ("parameters", "gradients", "optimizer_states", "activations",
                                                     "recompute", "comm_buffers")) for r in ranks)
    else:
        assert code == 2
        assert len(err.splitlines()) == 1
        assert re.match(r"pipesim: error: rank \d+ \(stages? [\d,]+\) needs [\d.]+ GiB, the largest term "
                        r"activations [\d.]+ GiB for up to \d+ in-flight microbatches .* has 80.00 GiB$", err), err
