"""Calibration: the hardware file round-trips, step-level refinements and message figures are exact, the CLI works.

The compute fit itself: test_calibrate_fit.py; sharing the host's cores: test_host_sharing.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipesim.calibration.calibrate import build_hardware
from pipesim.calibration.fit import ComputeFit
from pipesim.calibration.measured import (
    comm_action_seconds,
    in_run_latency,
    late_recv_delay,
    message_delays,
    samples_from_timeline,
)
from pipesim.calibration.plan import LECTURE_MLP, QUICK_MLP, run_spec, simulate_run
from pipesim.calibration.refine import refine_corun, refine_oversubscription, refine_time_slice
from pipesim.cost.stage_work import action_flops, stage_flops
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import hardware_to_toml, load_hardware
from pipesim.model.config import ModelConfig
from pipesim.timeline import Event, Timeline
from tests.test_host_sharing import cpu_hardware


def test_action_flops_first_stage_has_no_input_gradient():
    f = (1.0, 2.0, 3.0)
    assert action_flops("F", 1, f) == ((1.0, 0.0, 0.0), 1)
    assert action_flops("B", 0, f) == ((0.0, 2.0, 3.0), 2)
    assert action_flops("I", 0, f) == ((0.0, 0.0, 0.0), 1)
    assert action_flops("W", 0, f) == ((0.0, 2.0, 3.0), 2)  # a plain backward, charged like a B
    assert action_flops("I", 1, f) == ((0.0, 2.0, 0.0), 1)
    assert action_flops("W", 1, f) == ((0.0, 0.0, 3.0), 1)


def test_samples_from_timeline_profiles_runnable_ranks_and_skips_warmup():
    model = {"kind": "mlp", "hidden": 64, "layers": 2, "batch": 8}
    ev = [Event(0, "compute", "F", 0, 0, 0.0, 1.0, step=0),  # warmup step: left out
          Event(0, "compute", "F", 0, 0, 10.0, 11.0, step=1),
          Event(1, "recv", "RECV_F", 1, 0, 9.0, 11.25, step=1),  # waiting in a RECV: not runnable
          Event(1, "send", "SEND_B", 1, 9, 10.5, 10.75, 8, 0, step=1),  # posting a SEND: runnable
          Event(1, "compute", "F", 1, 0, 11.25, 12.0, step=1),
          Event(0, "compute", "F", 0, 1, 11.0, 12.5, step=1),
          Event(1, "compute", "B", 1, 0, 12.0, 14.0, step=1)]
    tl = Timeline("measured", "1f1b", 2, ev, {"model": model, "p": 2, "v": 1, "m": 2, "warmup": 1})
    samples = samples_from_timeline(tl)
    fl = stage_flops(ModelConfig(**model), 2, 2)
    mm = 2 * 4 * 64 * 64  # FLOPs of one layer's matmul on 4 rows
    assert fl[0] == (mm, 0.0, mm)  # the first stage's first layer has no input gradient (the data needs none)
    assert fl[1] == (mm, mm, mm)
    # (seconds, seconds alone / with 2 runnable, overheads charged)
    assert [(s.seconds, s.profile, s.overheads) for s in samples] == [
        (1.0, (0.75, 0.25), 1), (0.75, (0.0, 0.75), 1), (1.5, (0.25, 1.25), 1), (2.0, (1.5, 0.5), 2)]
    assert samples[3].flops == (0.0, fl[1][1], fl[1][2])
    assert [s.ops for s in samples] == [2, 2, 2, 3]  # one layer per stage: F linear + GeLU; B their 2 + dW


def _fit() -> ComputeFit:
    return ComputeFit(rate=(2e10, 1e10, 1.6e10), overhead=2e-4, corun=0.15, mean_abs_error=0.0, samples=10)


def test_hardware_file_round_trips_and_times_kinds(tmp_path):
    hw = build_hardware(_fit(), overhead=2.5e-4, latency=8e-5, bandwidth=9e8, membw=8e9, cores=2, devices=4,
                        source="test")
    path = tmp_path / "hw.toml"
    path.write_text(hardware_to_toml(hw))
    back = load_hardware(str(path))
    assert back == hw and hash(back) == hash(hw)
    assert back.host.node_corun_slowdown == 0.15 and back.host.cores == 2
    assert back.compute_time(1e9, 0.0, "float32", "I") == pytest.approx(1e9 / 1e10 + 2.5e-4)
    assert back.compute_time(1e9, 0.0, "float32", "W") == pytest.approx(1e9 / 1.6e10 + 2.5e-4)
    assert back.compute_time(1e9, 0.0, "float32") == pytest.approx(1e9 / 2e10 + 2.5e-4)


def test_presets_keep_their_figures():
    hw = load_hardware("dgx-h100")
    assert hw.device.kind_efficiency is None and hw.host is None
    assert hw.compute_time(1e12, 0.0, "bfloat16", "I") == hw.compute_time(1e12, 0.0, "bfloat16")


def test_bad_kind_efficiency_is_one_line(tmp_path):
    hw = build_hardware(_fit(), overhead=0.0, latency=0.0, bandwidth=1e9, membw=1e9, cores=2, devices=2, source="")
    path = tmp_path / "bad.toml"
    path.write_text(hardware_to_toml(hw).replace("kind_efficiency = { F", "kind_efficiency = { X = 1.0, F"))
    with pytest.raises(PipesimError, match=r"\[device\].kind_efficiency has unknown kind 'X'"):
        load_hardware(str(path))


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, timeout=timeout)


def test_calibrate_cli_bad_output_dir_is_one_line(tmp_path):
    proc = _cli("calibrate", "-o", str(tmp_path / "missing" / "hw.toml"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "does not exist" in proc.stderr


def test_calibrate_quick_writes_a_file_simulate_accepts(tmp_path):
    out = tmp_path / "hw.toml"
    proc = _cli("calibrate", "--quick", "-o", str(out), "--keep", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    hw = load_hardware(str(out))
    assert hw.host.cores >= 1 and hw.intra.bandwidth > 0 and hw.device.kind_efficiency["F"] == 1.0
    assert sorted(p.name for p in (tmp_path / "runs").glob("round0/p2/fit-*.json")) == ["fit-1f1b-m2.json",
                                                                                      "fit-zb-h1-m4.json"]
    meta = Timeline.read(tmp_path / "runs" / "round0" / "p2" / "fit-1f1b-m2.json").meta
    assert 0 < meta["probe_before"] < 1 and 0 < meta["probe_after"] < 1  # the speed probe ran beside the run
    assert meta["probe"] == (meta["probe_before"] + meta["probe_after"]) / 2
    sim = _cli("simulate", "1f1b", "-p", "2", "-m", "4", "--model", "mlp", "--hidden", "256", "--layers", "4",
               "--batch", "16", "--hardware", str(out), "--json")
    assert sim.returncode == 0, sim.stderr
    assert '"hardware": "calibrated-cpu"' in sim.stdout


def test_refine_corun_recovers_the_step_level_co_run_slowdown():

    hw = cpu_hardware(2, 0.0)
    runs = [run_spec("a", "1f1b", 4, QUICK_MLP), run_spec("b", "gpipe", 4, QUICK_MLP)]
    truth = hw.with_host(node_corun_slowdown=0.5 * 17 / 50)  # a grid point: found exactly
    measured = {r["id"]: simulate_run(truth, r).makespan for r in runs}
    assert refine_corun(hw, runs, measured).host.node_corun_slowdown == truth.host.node_corun_slowdown


def test_refine_oversubscription_uses_only_runs_with_more_ranks_than_cores():

    hw = cpu_hardware(2, 0.0)
    # stages long enough for 3-4 ranks to be runnable at once (QUICK_MLP's are shorter than a message)
    runs = [run_spec("a", "1f1b", 4, QUICK_MLP), run_spec("b", "gpipe", 8, LECTURE_MLP, p=4)]
    truth = hw.with_host(oversubscription_slowdown=13 / 50)  # a grid point of [0, 1]
    measured = {r["id"]: simulate_run(truth, r).makespan for r in runs}
    measured["a"] *= 2  # a 2-rank run never enters this fit
    got = refine_oversubscription(hw, runs, measured)
    assert got.host.oversubscription_slowdown == truth.host.oversubscription_slowdown
    assert refine_oversubscription(hw, runs[:1], measured) is hw  # nothing oversubscribed: unchanged


def test_refine_time_slice_recovers_slice_and_slowdown_from_the_crowded_run():

    hw = cpu_hardware(2, 0.0)
    runs = [run_spec("a", "1f1b", 4, QUICK_MLP), run_spec("b", "1f1b", 8, LECTURE_MLP, p=4)]
    # grid points of both searches
    truth = hw.with_host(time_slice=3e-3, oversubscription_slowdown=13 / 50)
    steps, bubbles = {}, {}
    for r in runs:
        res = simulate_run(truth, r)
        steps[r["id"]], bubbles[r["id"]] = res.makespan, res.bubble_fraction
    steps["a"] *= 2  # a 2-rank run never enters this fit
    got = refine_time_slice(hw, runs, steps, bubbles)
    assert got.host == truth.host
    assert refine_time_slice(hw, runs[:1], steps, bubbles) is hw  # nothing oversubscribed: unchanged


def test_sum_roofline_and_split_overhead_round_trip(tmp_path):
    fit = ComputeFit(rate=(2e10, 1e10, 1.6e10), overhead=2e-4, corun=0.0, mean_abs_error=0.0, samples=10,
                     bandwidth=5e9, split_overhead=1e-4)
    hw = build_hardware(fit, overhead=2e-4, latency=1e-4, bandwidth=1e9, membw=2e10, cores=2, devices=2, source="")
    assert hw.roofline == "sum" and hw.device.hbm_bandwidth == 5e9 and hw.host.split_backward_overhead == 1e-4
    path = tmp_path / "hw.toml"
    path.write_text(hardware_to_toml(hw))
    back = load_hardware(str(path))
    assert back == hw
    assert back.compute_time(1e9, 1e8, "float32", "F") == pytest.approx(1e9 / 2e10 + 1e8 / 5e9 + 2e-4)
    path.write_text(hardware_to_toml(hw).replace('roofline = "sum"', 'roofline = "min"'))
    with pytest.raises(PipesimError, match='roofline must be "max" or "sum"'):
        load_hardware(str(path))


def test_split_group_overhead_counts_the_stage_parameter_groups(tmp_path):
    from dataclasses import replace

    import schedules
    from pipesim.cost.table import CostTable
    from pipesim.sim.simulator import simulate

    # a core per rank, no slowdowns: compute runs as on devices of their own
    hw = load_hardware("local-cpu").with_host(node_corun_slowdown=0.0, oversubscription_slowdown=0.0, time_slice=0.0,
                                              split_backward_overhead=0.25, split_group_overhead=0.125)
    plain = CostTable.uniform(2, 1.0, 1.0, 1.0)
    grouped = CostTable(tuple(replace(c, weight_ops=4) for c in plain.stages))  # 4 groups: +0.5 s per W
    # stage 1: I +0.25, W +0.25 + 0.5 (autograd once per group); stage 0's W is a plain backward: nothing
    longer = CostTable((plain.stages[0], replace(plain.stages[1], backward_input=1.25, backward_weight=1.75)))
    zb = schedules.build("zb-h1", 2, 4)
    a, b = simulate(zb, grouped, hw, comm=False), simulate(zb, longer, None, comm=False)
    assert (a.starts, a.ends) == (b.starts, b.ends)
    (tmp_path / "hw.toml").write_text(hardware_to_toml(hw))
    assert load_hardware(str(tmp_path / "hw.toml")).host.split_group_overhead == 0.125


def test_split_input_walks_the_stage_graph(tmp_path):
    from dataclasses import replace

    import schedules
    from pipesim.cost.table import CostTable
    from pipesim.sim.simulator import simulate

    hw = load_hardware("local-cpu").with_host(node_corun_slowdown=0.0, oversubscription_slowdown=0.0, time_slice=0.0,
                                              split_group_overhead=0.0, split_graph_overhead=0.0625)
    plain = CostTable.uniform(2, 1.0, 1.0, 1.0)
    walked = CostTable(tuple(replace(c, backward_ops=8) for c in plain.stages))  # 8 ops: +0.5 s per split I
    # stage 1's I only: stage 0's I is empty (its W a plain backward), W does not walk
    longer = CostTable((plain.stages[0], replace(plain.stages[1], backward_input=1.5)))
    zb = schedules.build("zb-h1", 2, 4)
    a, b = simulate(zb, walked, hw, comm=False), simulate(zb, longer, None, comm=False)
    assert (a.starts, a.ends) == (b.starts, b.ends)
    (tmp_path / "hw.toml").write_text(hardware_to_toml(hw))
    assert load_hardware(str(tmp_path / "hw.toml")).host.split_graph_overhead == 0.0625


def test_split_backward_overhead_enters_the_zb_h1_closed_form():
    from dataclasses import replace

    import schedules
    from pipesim.cost.table import CostTable
    from pipesim.sim.simulator import simulate

    hw = load_hardware("local-cpu").with_host(node_corun_slowdown=0.0, oversubscription_slowdown=0.0, time_slice=0.0,
                                              split_backward_overhead=0.5)
    plain = CostTable.uniform(2, 1.0, 1.0, 1.0)
    # the same as stage 1's I and W costing 0.5 s more each, and nothing else (the executor's first
    # stage has no input gradient: its W is a plain backward, without the split's bookkeeping)
    longer_table = CostTable((plain.stages[0], replace(plain.stages[1], backward_input=1.5, backward_weight=1.5)))
    for m in (2, 4, 8):
        zb = schedules.build("zb-h1", 2, m)
        with_overhead = simulate(zb, plain, hw, comm=False)
        longer = simulate(zb, longer_table, None, comm=False)
        assert (with_overhead.starts, with_overhead.ends) == (longer.starts, longer.ends)
        assert with_overhead.makespan == 1.0 + m * (1.0 + 1.5 + 1.5)  # the last stage never idles after 0F0
    fused = schedules.build("1f1b", 2, 2)  # a fused B pays nothing extra: (m + p - 1)(t_F + t_B)
    assert simulate(fused, CostTable.uniform(2, 1.0, 1.0, 1.0), hw, comm=False).makespan == 9.0


def _message_timeline(p: int) -> Timeline:
    """Step 0 is warmup (its 100 s RECV is left out); step 1 has one waiting and two late RECVs."""
    ev = [Event(0, "send", "SEND_F", 0, 0, 0.0, 0.25, 8, 1, step=0),
          Event(1, "recv", "RECV_F", 1, 0, 1.0, 101.0, 8, 0, step=0),  # late, but in the warmup step
          Event(0, "compute", "F", 0, 0, 110.0, 111.0, step=1),
          Event(0, "send", "SEND_F", 0, 0, 111.0, 111.25, 8, 1, step=1),
          Event(1, "recv", "RECV_F", 1, 0, 110.5, 112.0, 8, 0, step=1),  # waiting: 112 - 111.25
          Event(0, "send", "SEND_F", 0, 1, 112.0, 112.25, 8, 1, step=1),
          Event(1, "compute", "F", 1, 0, 112.0, 113.0, step=1),
          Event(1, "recv", "RECV_F", 1, 1, 113.0, 114.5, 8, 0, step=1),  # late: 114.5 - 113
          Event(1, "send", "SEND_B", 1, 0, 114.5, 114.75, 8, 0, step=1),
          Event(0, "recv", "RECV_B", 0, 0, 115.0, 115.5, 8, 1, step=1)]  # late: 115.5 - 115
    return Timeline("measured", "1f1b", p, ev, {"p": p, "warmup": 1})


def test_send_figure_is_the_mean_of_the_measured_steps_sends():
    ev = [Event(0, "send", "SEND_F", 0, 0, 0.0, 9.0, 8, 1, step=0),  # warmup step: left out
          Event(0, "compute", "F", 0, 0, 10.0, 11.0, step=1),
          Event(0, "send", "SEND_F", 0, 0, 11.0, 12.0, 8, 1, step=1),
          Event(0, "send", "SEND_F", 0, 1, 13.0, 15.0, 8, 1, step=1),
          Event(0, "send", "SEND_F", 0, 2, 16.0, 22.0, 8, 1, step=1),
          Event(1, "recv", "RECV_F", 1, 0, 10.0, 12.5, 8, 0, step=1),
          Event(1, "compute", "B", 1, 0, 12.5, 14.0, step=1)]
    tl = Timeline("measured", "1f1b", 2, ev, {"p": 2, "warmup": 1})
    # sends of 1, 2 and 6 s: the mean 3 (the median would be 2); 4 comm actions over 1 + 2 overheads
    assert comm_action_seconds([tl]) == (3.0, 4 / 3)
    assert comm_action_seconds([]) == (0.0, 0.0)


def test_message_delays_split_waiting_from_late_recvs_and_fit_the_delays():
    tl = _message_timeline(2)
    assert message_delays(tl) == [(0.75, 8, False), (1.5, 8, True), (0.5, 8, True)]
    assert late_recv_delay([tl]) == 1.0  # mean of the late RECVs only
    assert late_recv_delay([]) == 0.0


def test_in_run_latency_from_the_waiting_receives():
    tl = _message_timeline(2)  # one waiting RECV: delivered 0.75 s after its SEND was posted, 8 bytes
    assert in_run_latency([tl], 16.0, 9.0) == 0.25  # 0.75 - 8 / 16
    assert in_run_latency([tl], 8.0, 9.0) == 0.0  # never negative
    assert in_run_latency([], 16.0, 9.0) == 9.0  # no messages: the ping-pong's figure


def test_message_figures_round_trip_and_default_to_zero(tmp_path):

    base = load_hardware("dgx-h100")
    assert base.host is None  # GPUs: no SEND posting, no late RECVs
    assert "late_recv_delay" not in hardware_to_toml(base)
    hw = load_hardware("local-cpu").with_host(send_overhead=2.5e-4, late_recv_delay=1.25e-3)
    path = tmp_path / "hw.toml"
    path.write_text(hardware_to_toml(hw))
    assert load_hardware(str(path)) == hw
