"""The quick calibration's closed form (one factor on every duration) and the speed probe's note, with an injected
measurement (no timing in the tests)."""

from __future__ import annotations

import json

import pytest

from pipesim.calibration.plan import LECTURE_MLP, run_spec, simulate_run
from pipesim.calibration.rescale import rescale_plan, scaled
from pipesim.calibration.speed_check import machine_key, machine_probe, speed_note
from pipesim.hardware.toml_io import load_hardware


@pytest.mark.parametrize("s", [0.5, 1.8])
def test_scaled_hardware_predicts_every_step_s_times_longer(s):
    """Every duration times s: the simulated step (core sharing, gloo's posting and late RECVs, links) is s x."""
    base = load_hardware("local-cpu")
    for run in [*rescale_plan(), run_spec("demo", "1f1b", 8, LECTURE_MLP), run_spec("p4", "1f1b", 8, LECTURE_MLP,
                                                                                   p=4)]:
        assert simulate_run(scaled(base, s), run).makespan == pytest.approx(s * simulate_run(base, run).makespan,
                                                                             rel=1e-9)


def test_rescale_plan_leaves_the_demo_configuration_out():
    assert all(not (r["schedule"] == "1f1b" and r["microbatches"] == 8 and r["model"] == LECTURE_MLP)
               for r in rescale_plan())


def test_speed_note_once_per_machine_and_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESIM_SPEED_CHECK", "1")
    hw = load_hardware("local-cpu")  # probe 8.48 ms, tolerance 25 %
    calls = []

    def slow() -> float:
        calls.append(1)
        return 2 * hw.host.probe_seconds

    note = speed_note(hw, "local-cpu", measure=slow, where=tmp_path)
    assert note is not None and note.count("\n") == 0
    assert "2.00x slower" in note and "pipesim calibrate --quick --rescale local-cpu" in note
    assert speed_note(hw, "local-cpu", measure=slow, where=tmp_path) is None  # said once
    assert len(calls) == 1  # measured once, then read from the cache
    assert machine_probe(slow, tmp_path)[0] == 2 * hw.host.probe_seconds


def test_speed_note_silent_within_tolerance_or_without_a_probe_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESIM_SPEED_CHECK", "1")
    hw = load_hardware("local-cpu")
    assert speed_note(hw, "local-cpu", measure=lambda: 1.2 * hw.host.probe_seconds, where=tmp_path) is None
    assert speed_note(load_hardware("dgx-h100"), "dgx-h100", measure=lambda: 1.0, where=tmp_path / "x") is None
    monkeypatch.setenv("PIPESIM_SPEED_CHECK", "0")
    assert speed_note(hw, "local-cpu", measure=lambda: 1.0, where=tmp_path / "y") is None


def test_simulate_prints_the_note_on_stderr_once(tmp_path, monkeypatch, capsys):
    from pipesim.cli import main

    monkeypatch.setenv("PIPESIM_SPEED_CHECK", "1")
    monkeypatch.setenv("PIPESIM_CACHE_DIR", str(tmp_path))
    (tmp_path / "speed-probe.json").write_text(json.dumps({"machine": machine_key(), "seconds": 0.002, "warned": []}))
    argv = ["simulate", "1f1b", "-p", "2", "-m", "4", "--model", "mlp", "--hardware", "local-cpu"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "4.24x faster" in err
    assert main(argv) == 0
    assert capsys.readouterr().err == ""


def test_a_file_measured_on_this_machine_is_not_checked(tmp_path, monkeypatch):
    from dataclasses import replace

    monkeypatch.setenv("PIPESIM_SPEED_CHECK", "1")
    hw = load_hardware("local-cpu")
    mine = replace(hw, host=replace(hw.host, probe_machine=machine_key()))
    calls = []
    assert speed_note(mine, "mine.toml", measure=lambda: calls.append(1) or 1.0, where=tmp_path) is None
    assert calls == []  # not even probed
