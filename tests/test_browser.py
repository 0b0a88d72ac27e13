"""A real headless Chromium opens the generated HTML: the plot renders, offline, with every bar.

Needs Debian's `chromium` and `chromium-driver` (`make browser-deps`). Without them the tests
skip with that message, except under CI (env CI set), where a missing browser is a failure.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

import schedules
from pipesim.ir.schedule import Kind
from pipesim.plots import compare_figure, timeline_figure, write_html
from pipesim.plots.from_schedule import unit_timeline
from pipesim.timeline import Timeline

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
RENDER_TIMEOUT = 60  # seconds: plotly.js (4.6 MB inline) parses in well under that


def _duration(action) -> float:
    return {Kind.F: 1e-3, Kind.B: 2e-3}.get(action.kind, 0.25e-3)  # seconds


@pytest.fixture(scope="module")
def sim() -> Timeline:
    return unit_timeline(schedules.build("1f1b", 3, 4), _duration, transfer_bytes=lambda a: 1 << 20)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        message = (f"headless browser test needs {' and '.join(missing)} "
                   "(apt-get install chromium chromium-driver, or `make browser-deps`)")
        if os.environ.get("CI"):
            pytest.fail(f"CI must have a browser: {message}")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1600,1000",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    browser.set_page_load_timeout(RENDER_TIMEOUT)
    yield browser
    browser.quit()


def _render(driver, path):
    """Open `path` and wait until plotly has drawn its bars; returns (y tick labels top down, bar paths)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(path.resolve().as_uri())
    WebDriverWait(driver, RENDER_TIMEOUT).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".plotly .main-svg .barlayer .point path"))
    labels = driver.find_elements(By.CSS_SELECTOR, ".plotly .main-svg .yaxislayer-above text")
    ticks = [t.text for t in sorted(labels, key=lambda t: t.location["y"])]  # top to bottom on screen
    bars = driver.find_elements(By.CSS_SELECTOR, ".plotly .main-svg .barlayer .point path")
    return ticks, bars


def test_timeline_renders_every_rank_row_and_bar(driver, sim, tmp_path):
    html = write_html(timeline_figure(sim), tmp_path / "timeline.html")
    ticks, bars = _render(driver, html)
    assert ticks == [f"rank {r} · {s}" for r in range(3) for s in ("compute", "send", "recv")]
    assert len(bars) == len(sim.events)
    assert all(b.get_attribute("d") not in (None, "", "M0,0Z") for b in bars)  # every bar has a shape
    from selenium.webdriver.common.by import By

    labels = {t.text for t in driver.find_elements(By.CSS_SELECTOR, ".barlayer .bartext")}
    assert {"0F0", "2B3"} <= labels  # labels drawn on bars
    shot = tmp_path / "timeline.png"
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_compare_renders_both_runs(driver, sim, tmp_path):
    steps = []
    for k, f in enumerate((1.2, 1.1, 1.3)):
        steps += [replace(e, start=e.start * f + k, end=e.end * f + k, step=k) for e in sim.events]
    meas = Timeline("measured", "1f1b", 3, steps)
    html = write_html(compare_figure(sim, meas), tmp_path / "compare.html")
    ticks, bars = _render(driver, html)
    rows = [f"rank {r} · {s}" for r in range(3) for s in ("compute", "send", "recv")]
    assert ticks == rows + rows
    assert len(bars) == 2 * len(sim.events)
    assert "makespan error" in driver.find_element("css selector", ".plotly .gtitle").text
    assert driver.save_screenshot(str(tmp_path / "compare.png"))
