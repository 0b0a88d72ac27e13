"""A flag given where it does nothing is refused in one line (exit 2, nothing written or launched), never ignored:
calibrate --from-measurements / --gpu, run's fault injection, plot's view flags, plan --finalists, bench collectives
(--lecture or the table), and the bench scripts' own parsers."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from executor.run_config import RunConfig
from pipesim.cli import main
from pipesim.commands import bench_cmd
from pipesim.errors import PipesimError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests/data/gpu_measurements_h100_sample.csv"


def _refused(capsys, argv: list[str]) -> str:
    """The one line `pipesim ARGV` printed, having exited 2 with nothing on stdout."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err.rstrip("\n")


# -- 1. calibrate: the flags of the CPU calibration and of a traced run's model do nothing with --from-measurements

@pytest.mark.parametrize(("extra", "line"), [
    (["--devices", "0"], "--devices sets the ranks of a CPU calibration's file: it does nothing with "
                         "--from-measurements"),
    (["--quick", "--rescale", "local-cpu"], "--rescale rescales a CPU hardware file (with --quick): it does nothing "
                                            "with --from-measurements"),
    (["--quick"], "--quick shortens --gpu's measurement: it does nothing with --from-measurements"),
    (["--keep", "KEEP"], "--keep keeps a CPU calibration's timelines: it does nothing with --from-measurements"),
    (["--hidden", "2048", "--batch", "8"], "--hidden sizes a traced run's model (--from-trace): it does nothing with "
                                           "--from-measurements"),
    (["--batch", "8"], "--batch sizes a traced run's model (--from-trace): it does nothing with --from-measurements"),
    (["--num-experts", "4"], "--num-experts sizes a traced run's model (--from-trace): it does nothing with "
                             "--from-measurements"),
])
def test_calibrate_from_measurements_refuses_the_flags_it_does_not_use(capsys, tmp_path, extra, line):
    out = tmp_path / "hw.toml"
    extra = [str(tmp_path / "keep") if a == "KEEP" else a for a in extra]
    assert _refused(capsys, ["calibrate", "-o", str(out), "--from-measurements", str(SAMPLE), *extra]) == \
        f"pipesim: error: {line}"
    assert not out.exists() and not (tmp_path / "keep").exists()


def test_calibrate_gpu_refuses_the_cpu_calibrations_flags_before_measuring(capsys, tmp_path):
    out = tmp_path / "hw.toml"
    assert _refused(capsys, ["calibrate", "-o", str(out), "--gpu", "--devices", "8"]) == \
        "pipesim: error: --devices sets the ranks of a CPU calibration's file: it does nothing with --gpu"
    assert not out.exists()


@pytest.mark.parametrize(("extra", "line"), [
    (["--hidden", "512"], "--hidden sizes a traced run's model (--from-trace): it does nothing with the executor runs"),
    (["--hardware", "dgx-h100"], "--hardware names the base file of --from-trace or --gpu: it does nothing with the "
                                 "executor runs"),
    (["--quick", "--rescale", "local-cpu", "--devices", "3"], "--devices sets the ranks of a measured file; a "
                                                              "rescaled one keeps its base's: it does nothing with "
                                                              "--quick --rescale"),
])
def test_the_cpu_calibrations_refuse_what_they_do_not_use_before_running(capsys, tmp_path, extra, line):
    out = tmp_path / "hw.toml"
    assert _refused(capsys, ["calibrate", "-o", str(out), *extra]) == f"pipesim: error: {line}"
    assert not out.exists()


def test_calibrate_from_measurements_keeps_the_flags_it_uses(capsys, tmp_path):
    out = tmp_path / "hw.toml"
    assert main(["calibrate", "-o", str(out), "--from-measurements", str(SAMPLE), "--family", "H100",
                 "--hardware", "dgx-h100"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out}; use it with: pipesim simulate ... " \
                                                       f"--hardware {out}"


# -- 2. run: a fault that could never fire, or fault flags without the rank that fails

RUN = ["run", "1f1b", "--nproc", "2", "--model", "mlp", "-m", "4", "--print-config"]


@pytest.mark.parametrize(("extra", "line"), [
    (["--fail-rank", "1", "--fail-at", "9F99"], "--fail-at 9F99: rank 1 (pipeline rank 1: stage 1, microbatches 0 to "
                                                "3) never runs it, so the fault could never fire"),
    (["--fail-rank", "0", "--fail-at", "1F0"], "--fail-at 1F0: rank 0 (pipeline rank 0: stage 0, microbatches 0 to "
                                               "3) never runs it, so the fault could never fire"),
    (["--fail-rank", "1", "--fail-at", "0SEND_F1"], "--fail-at 0SEND_F1: rank 1 (pipeline rank 1: stage 1, "
                                                    "microbatches 0 to 3) never runs it, so the fault could never "
                                                    "fire"),
    (["--fail-at", "1F2", "--fail-mode", "kill"], "--fail-at 1F2 needs --fail-rank RANK: the rank that fails there"),
    (["--fail-at", "1F2"], "--fail-at 1F2 needs --fail-rank RANK: the rank that fails there"),
    (["--fail-rank", "1"], "--fail-rank 1 needs --fail-at ACTION: the action where it fails, e.g. 1F3"),
    (["--fail-rank", "1", "--fail-mode", "hang"], "--fail-mode hang says how --fail-at's action fails: give it with "
                                                  "--fail-rank and --fail-at"),
    (["--fail-mode", "raise"], "--fail-mode raise says how --fail-at's action fails: give it with --fail-rank and "
                               "--fail-at"),
])
def test_run_refuses_a_fault_that_could_never_fire(capsys, extra, line):
    assert _refused(capsys, [*RUN, *extra]) == f"pipesim: error: {line}"


def test_run_refuses_a_fault_on_another_pipeline_ranks_stage_under_dp(capsys):
    """dp 2 x pp 2: global rank 1 is pipeline rank 0's second replica, which never runs stage 1."""
    argv = ["run", "1f1b", "--nproc", "4", "--dp", "2", "--model", "mlp", "-m", "4", "--print-config"]
    assert _refused(capsys, [*argv, "--fail-rank", "1", "--fail-at", "1F0"]) == (
        "pipesim: error: --fail-at 1F0: rank 1 (pipeline rank 0: stage 0, microbatches 0 to 3) never runs it, so the "
        "fault could never fire")
    assert main([*argv, "--fail-rank", "2", "--fail-at", "1F0"]) == 0  # global rank 2 is pipeline rank 1
    assert json.loads(capsys.readouterr().out)[0]["fail_rank"] == 2


@pytest.mark.parametrize("extra", [["--fail-rank", "1", "--fail-at", "1F2"],
                                   ["--fail-rank", "1", "--fail-at", "1B3", "--fail-mode", "kill"],
                                   ["--fail-rank", "0", "--fail-at", "0SEND_F1"]])
def test_run_keeps_a_fault_the_rank_runs(capsys, extra):
    assert main([*RUN, *extra]) == 0
    cfg = json.loads(capsys.readouterr().out)[0]
    mode = extra[extra.index("--fail-mode") + 1] if "--fail-mode" in extra else "raise"
    assert (cfg["fail_rank"], cfg["fail_at"], cfg["fail_mode"]) == (int(extra[1]), extra[3], mode)


def test_an_executor_config_with_a_fault_that_never_fires_is_refused():
    """`python -m executor --config` checks the same (RunConfig.check), the interleaved rank's stages named."""
    cfg = RunConfig(names=("interleaved-1f1b",), microbatches=4, virtual=2, fail_rank=1, fail_at="2F0")
    with pytest.raises(PipesimError) as exc:
        cfg.check(2)
    assert str(exc.value) == ("--fail-at 2F0: rank 1 (pipeline rank 1: stages 1, 3, microbatches 0 to 3) never runs "
                              "it, so the fault could never fire")
    assert len(RunConfig(names=("interleaved-1f1b",), microbatches=4, virtual=2, fail_rank=1, fail_at="3F0")
               .check(2)) == 1


# -- 3. plot: --step, --unit, --force (and --width) where they cannot act

@pytest.fixture(scope="module")
def plot_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("plot")
    assert main(["simulate", "1f1b", "-p", "2", "-m", "4", "--trace", str(folder / "sim.json")]) == 0
    assert main(["sweep", "--schedules", "1f1b", "--stages", "2", "--microbatches", "4",
                 "--json", str(folder / "sweep.json")]) == 0
    return folder


@pytest.mark.parametrize(("name", "extra", "line"), [
    ("sim.json", ["--step", "99"], "--step picks a step of a measured run; SIM is simulated"),
    ("sim.json", ["--step", "1"], "--step picks a step of a measured run; SIM is simulated"),
    ("sim.json", ["--force"], "--force compares a simulated and a measured timeline of different shapes: give it "
                              "with one of each"),
    ("sim.json", ["--width", "800"], "--width sizes the PNG: give it with --png"),
    ("sweep.json", ["--step", "2"], "--step acts on timelines; SWEEP is a sweep, whose plots have no step or time "
                                    "axis"),
    ("sweep.json", ["--unit", "us"], "--unit acts on timelines; SWEEP is a sweep, whose plots have no step or time "
                                     "axis"),
    ("sweep.json", ["--force"], "--force acts on timelines; SWEEP is a sweep, whose plots have no step or time axis"),
])
def test_plot_refuses_a_view_flag_where_it_cannot_act(capsys, plot_files, tmp_path, name, extra, line):
    capsys.readouterr()
    out = tmp_path / "x.html"
    path = str(plot_files / name)
    line = line.replace("SIM", path).replace("SWEEP", path)
    assert _refused(capsys, ["plot", path, "-o", str(out), *extra]) == f"pipesim: error: {line}"
    assert not out.exists()


def test_plot_keeps_unit_on_a_simulated_timeline(capsys, plot_files, tmp_path):
    capsys.readouterr()
    out = tmp_path / "x.html"
    assert main(["plot", str(plot_files / "sim.json"), "-o", str(out), "--unit", "us"]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"


# -- 4. plan: --finalists only with --ilp

PLAN = ["plan", "--model", "gpt", "--hidden", "512", "--layers", "8", "--heads", "8", "--seq", "512", "--vocab", "8000",
        "--batch", "16", "--dtype", "bfloat16", "--hardware", "dgx-h100", "--gpus", "4", "--schedules", "1f1b"]


def test_plan_refuses_finalists_without_ilp(capsys):
    assert _refused(capsys, [*PLAN, "--finalists", "5"]) == (
        "pipesim: error: --finalists needs --ilp [SECONDS] (the ILP search of the best K layouts it sets)")


# -- 5. bench collectives: --elements only with --lecture, the table's flags only without it

TABLE_ONLY = ("is for the table of --sizes and --ops; --lecture runs the lecture's demo instead (all_reduce and "
              "reduce_scatter of --elements floats, timed once)")


@pytest.mark.parametrize(("extra", "line"), [
    (["--nproc", "2", "--sizes", "1K", "--ops", "all_reduce", "--elements", "5"],
     "--elements sizes the --lecture demo: give it with --lecture (the table's buffers are --sizes)"),
    *[(["--lecture", *flags], f"{flags[0]} {TABLE_ONLY}")
      for flags in (["--sizes", "1K", "--ops", "broadcast"], ["--ops", "broadcast"], ["--iters", "5"],
                    ["--warmup", "0"], ["--plot", "c.html"])],
])
def test_bench_collectives_refuses_flags_of_the_other_mode_before_torchrun(capsys, monkeypatch, extra, line):
    monkeypatch.setattr(bench_cmd, "_torchrun", lambda *a: pytest.fail("torchrun started"))
    assert _refused(capsys, ["bench", "collectives", *extra]) == f"pipesim: error: {line}"


def test_bench_collectives_defaults_stay_the_tables():
    args = argparse.Namespace(sizes=None, ops=None, iters=None, warmup=None, plot=None, json=None,
                                        lecture=False, elements=None, backend="gloo", timeout=120.0, nproc=2)
    cfg = bench_cmd.collectives_config(args)
    assert (cfg.sizes, cfg.iters, cfg.warmup) == ((1024, 64 * 1024, 1024**2, 16 * 1024**2), 20, 2)
    assert cfg.ops == bench_cmd.OPS
    lecture = bench_cmd.collectives_config(argparse.Namespace(**{**vars(args), "lecture": True, "elements": 4096}))
    assert (lecture.lecture, lecture.elements) == (True, 4096)


# -- 6. the bench scripts' parsers: one line, exit 2

@pytest.mark.parametrize("bench", ["simulator", "executor", "late-recv", "published"])
def test_bench_script_flag_mistakes_are_one_line(capsys, bench):
    with pytest.raises(SystemExit) as exc:
        main(["bench", bench, "--", "--bogus"])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"pipesim bench {bench}: error: unrecognized arguments: --bogus\n")


def test_bench_script_flag_mistake_from_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "pipesim", "bench", "simulator", "--", "--bogus"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", "pipesim bench simulator: error: unrecognized arguments: --bogus\n")
