"""`pipesim simulate`: JSON keys and values, traces, the human table, one-line errors with exit 2."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

import schedules
from pipesim.cli import main
from pipesim.commands.common import add_model_args
from pipesim.commands.setup_args import add_setup_args, setup_from_args
from pipesim.timeline import Timeline


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_makespan_and_bubble_in_seconds(capsys):
    code, out, _ = run_cli(capsys, "simulate", "1f1b", "--stages", "4", "--microbatches", "8", "--cost", "F=1,B=2",
                           "--comm", "none", "--json")
    d = json.loads(out)
    assert code == 0 and d["schema"] == "pipesim.simulate/1"
    assert d["makespan"] == 33.0 and d["bubble_fraction"] == pytest.approx(3 / 11, abs=1e-15)
    assert [r["busy"] for r in d["ranks"]] == [24.0] * 4
    assert d["hardware"] is None and d["comm"] == "none" and d["links"] == []


def test_model_on_hardware_models_links_and_memory(capsys):
    code, out, _ = run_cli(capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--model", "gpt", "--layers", "8",
                           "--hardware", "dgx-h100", "--json")
    d = json.loads(out)
    assert code == 0 and d["hardware"] == "dgx-h100" and d["comm"] == "links"
    assert set(d["link_classes"]) == {"nvswitch"} and d["link_classes"]["nvswitch"]["transfers"] == 2 * 3 * 8
    peaks = d["memory"]["peak_activation_bytes"]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > 0  # 1f1b: stage 0 holds the most
    assert d["critical_path"][-1]["end"] == d["makespan"]


def test_comm_none_on_hardware_matches_no_links(capsys):
    args = ("simulate", "zb-h1", "-p", "4", "-m", "8", "--model", "mlp", "--hardware", "dgx-h100", "--json")
    _, with_links, _ = run_cli(capsys, *args)
    _, without, _ = run_cli(capsys, *args, "--comm", "none")
    assert json.loads(without)["makespan"] < json.loads(with_links)["makespan"]


def test_trace_and_json_files(capsys, tmp_path):
    trace, result = tmp_path / "sim.json", tmp_path / "result.json"
    code, out, _ = run_cli(capsys, "simulate", "gpipe", "-p", "2", "-m", "4", "--model", "mlp", "--hardware",
                           "local-cpu", "--trace", str(trace), "--json", str(result))
    assert code == 0 and "makespan" in out and "bubble" in out  # human table still printed
    timeline = Timeline.read(trace)
    assert timeline.source == "simulated" and timeline.num_ranks == 2
    assert timeline.makespan == json.loads(result.read_text())["makespan"]


def test_from_csv(capsys, tmp_path):
    csv = tmp_path / "s.csv"
    code, out, _ = run_cli(capsys, "schedule", "1f1b", "-p", "2", "-m", "3", "--format", "csv")
    csv.write_text(out)
    code, out, _ = run_cli(capsys, "simulate", "--from-csv", str(csv), "--cost", "F=1,B=2", "--json")
    assert code == 0 and json.loads(out)["makespan"] == (3 + 2 - 1) * 3


def test_a_csv_with_a_byte_order_mark_and_a_default_batch_are_named(capsys, tmp_path):
    """Excel's "CSV UTF-8" starts with a byte-order mark, which torch's reader keeps in the first action: named, not
    called a malformed action. A CSV's 3 microbatches do not split the default --batch 64: the line says it is the
    default (a typed --batch 64 is the user's own, and said as before)."""
    csv = tmp_path / "s.csv"
    code, out, _ = run_cli(capsys, "schedule", "1f1b", "-p", "2", "-m", "3", "--format", "csv")
    csv.write_text("\ufeff" + out, encoding="utf-8")
    code, _, err = run_cli(capsys, "simulate", "--from-csv", str(csv), "--cost", "F=1,B=2")
    assert code == 2 and err.strip() == (f"pipesim: error: schedule CSV {csv} starts with a byte-order mark, which "
                                         "torch.distributed.pipelining reads as part of its first action: save it "
                                         "without one")
    csv.write_text(out)
    code, _, err = run_cli(capsys, "simulate", "--from-csv", str(csv), "--model", "gpt")
    assert code == 2 and err.strip() == ("pipesim: error: --batch 64 does not split into dp(1) x 3 microbatches "
                                         "evenly (--batch 64 is the default: give --batch)")
    code, _, err = run_cli(capsys, "simulate", "--from-csv", str(csv), "--model", "gpt", "--batch", "64")
    assert code == 2 and err.strip() == "pipesim: error: --batch 64 does not split into dp(1) x 3 microbatches evenly"
    assert run_cli(capsys, "simulate", "--from-csv", str(csv), "--model", "gpt", "--batch", "48")[0] == 0


def test_same_command_same_output(capsys):
    args = ("simulate", "interleaved-1f1b", "-p", "2", "-m", "4", "-v", "2", "--model", "gpt", "--json")
    outs = {run_cli(capsys, *args)[1] for _ in range(2)}
    assert len(outs) == 1


@pytest.mark.parametrize("argv,message", [
    (["nope", "-p", "2"], "unknown schedule 'nope'"),
    (["1f1b", "--hardware", "no-such-box"], "unknown hardware 'no-such-box'"),
    (["1f1b", "-p", "16", "--hardware", "dgx-h100"], "needs 16 devices (pp 16 x dp 1 x tp 1) but dgx-h100 has 8"),
    (["1f1b", "-p", "4", "--dp", "2", "--tp", "2"], "needs 16 devices (pp 4 x dp 2 x tp 2) but dgx-h100 has 8"),
    (["1f1b", "--cost", "F=1,Q=2"], "malformed --cost"),
    (["1f1b", "-p", "2", "--model", "gpt", "--hidden", "8192", "--layers", "64", "--seq", "4096"], "GiB"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run_cli(capsys, "simulate", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_malformed_hardware_file_exit_2(tmp_path):
    bad = tmp_path / "hw.toml"
    bad.write_text("name = 'x'\ndevices_per_node = -1\n")
    proc = subprocess.run([sys.executable, "-m", "pipesim", "simulate", "1f1b", "-p", "2", "--hardware", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_layer_split_reaches_the_cost_model():
    parser = argparse.ArgumentParser()
    add_model_args(parser)
    add_setup_args(parser)
    args = parser.parse_args(["--model", "mlp", "--layers", "8", "--layer-split", "1,3,3,1", "--hardware", "dgx-h100"])
    costs = setup_from_args(args).costs(schedules.build("1f1b", 4, 8))
    assert costs.layers_per_stage == (1, 3, 3, 1)
    flops = [c.flops_forward for c in costs.table.stages]
    assert flops[1] == 3 * flops[0] and flops[2] == flops[1] and flops[3] == flops[0]
