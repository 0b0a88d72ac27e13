"""The Zero Bubble paper's Table 5 reproduced from its Table 9 profiled times (bench/zb_paper_table.py): every
cell, and docs/schedules.md holds exactly the table the reproduction prints."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import zb_paper_table  # noqa: E402
from zb_paper_table import COLUMNS, SETTINGS  # noqa: E402

import schedules  # noqa: E402
from schedules.zb_heuristic import paper_heuristic, span, stage_spans  # noqa: E402
from schedules.zb_inputs import AutoCosts  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _each_setting_reproduced_once():
    """The reproduction is deterministic: a setting's rates, computed for its cell test, are the ones markdown()
    prints for the docs test (the bench module's own markdown, through its `reproduce`), not searched twice."""
    original = zb_paper_table.reproduce
    zb_paper_table.reproduce = functools.cache(original)
    yield
    zb_paper_table.reproduce = original


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s.model}-m{s.m}")
def test_every_cell_of_table_5(setting):
    ours = zb_paper_table.reproduce(setting)
    for col, got, paper in zip(COLUMNS, ours, setting.published):
        if col in ("1F1B", "ZB-H1", "ZB-H2"):  # handcrafted: the paper's printed digits exactly
            assert round(got, 4) == paper, (col, got, paper)
        else:  # searched: the issue asks 0.01; the paper's heuristic lands on the printed digits
            assert abs(got - paper) <= 0.01 and round(got, 4) == paper, (col, got, paper)


def test_1f1b_span_is_the_closed_form_without_comm():
    """(m + p - 1)(F + B + W) with no hop: the timing the table uses agrees with Table 2 of the paper."""
    p, m = 4, 8
    costs = AutoCosts.uniform(p, 3.0, 2.0, 1.0)
    assert span(p, schedules.build("1f1b", p, m).programs, costs) == (m + p - 1) * 6.0
    assert span(p, schedules.build("zb-h1", p, m).programs, costs) == m * 6.0 + (p - 1) * (3.0 + 2.0 - 1.0)


def test_heuristic_orders_are_valid_and_time_as_reported():
    s = SETTINGS[0]
    cost, programs = paper_heuristic(s.p, s.m, s.costs(2))
    assert span(s.p, programs, s.costs(2)) == pytest.approx(cost, rel=1e-12)
    first, last = stage_spans(s.p, programs, s.costs(2))
    assert all(a < b for a, b in zip(first, last))
    for prog in programs:  # every F, I, W once, I before its W
        seen = [(a.kind.name, a.microbatch) for a in prog]
        assert sorted(seen) == sorted((k, j) for k in "FIW" for j in range(s.m))
        assert all(seen.index(("I", j)) < seen.index(("W", j)) for j in range(s.m))


def test_docs_hold_the_reproduced_table():
    text = (ROOT / "docs" / "schedules.md").read_text()
    assert zb_paper_table.markdown() in text
