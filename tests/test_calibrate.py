"""Calibration: the fits recover known figures exactly, the hardware file round-trips, the CLI works for real."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipesim.calibrate import action_flops, build_hardware, stage_flops
from pipesim.calibrate_fit import ComputeFit, Sample, fit_compute, fit_link
from pipesim.errors import PipesimError
from pipesim.hardware_toml import hardware_to_toml, load_hardware
from pipesim.host_model import HostSharing, runnable_profile, speed
from pipesim.measured import samples_from_timeline
from pipesim.model_config import ModelConfig
from pipesim.timeline import Event, Timeline

RATES = (20e9, 12e9, 16e9)  # FLOP/s of F, I, W


def _synthetic(beta: float, overhead: float = 3e-4, bandwidth: float | tuple[float, float, float] | None = None,
               split: float = 0.0, gamma: float | None = None, per_op: float = 0.0,
               split_group: float = 0.0) -> list[Sample]:
    """Exact samples of the model the fit assumes, over varied sizes, kinds and runnable ranks (2 cores).

    Each action runs its first quarter alone and the rest with 2 runnable ranks; with `gamma`, also
    some with 4 runnable (turn-taking at half speed, less gamma per rank beyond the cores).
    `bandwidth`: one figure for all memory traffic, or one per kind (F, I, W).
    """
    bws = bandwidth if isinstance(bandwidth, tuple) else (bandwidth,) * 3
    out = []
    crowds = ((1.0,), (0.25, 0.75)) + (((0.5, 0.0, 0.0, 0.5),) if gamma is not None else ())
    g = gamma or 0.0
    for size in (1e7, 3e7, 9e7):
        per = 4e6 + size / 100  # bytes: a weight-sized part plus a part growing with the work
        for flops, n, sp in (((size, 0, 0), 1, 0), ((0, size, 0), 1, 1), ((0, 0, size), 1, 1),
                             ((0, size, 2 * size), 2, 0)):
            moved = tuple(per * (1 + k) if f else 0.0 for k, f in enumerate(flops))  # bytes by kind
            ops = 4.0 + 2 * n + (size == 3e7)  # framework ops, not proportional to anything else
            groups = sp * (2.0 + 3 * (size == 9e7))  # a split I or W: the stage's parameter groups
            for shares in crowds:
                work = n * overhead + sum(f / r for f, r in zip(flops, RATES, strict=True)) + sp * split
                work += ops * per_op + groups * split_group
                if bandwidth:
                    work += sum(b / w for b, w in zip(moved, bws, strict=True) if b)
                # seconds such that sum_k t_k * speed(k) = work, with t_k = share_k * seconds
                per_second = sum(x * speed(k, 2, beta, g) for k, x in enumerate(shares, start=1))
                seconds = work / per_second
                out.append(Sample(flops, seconds, tuple(x * seconds for x in shares), n, moved, sp,
                                  ops if per_op else 0.0, groups if split_group else 0.0))
    return out


def test_fit_compute_recovers_rates_overhead_and_corun_exactly():
    fit = fit_compute(_synthetic(beta=0.25), cores=2)
    assert fit.corun == pytest.approx(0.25, abs=1e-12) and fit.oversub == 0.0  # nothing crowded: gamma not scanned
    assert fit.rate == pytest.approx(RATES, rel=1e-9)
    assert fit.overhead == pytest.approx(3e-4, rel=1e-9)
    assert fit.mean_abs_error < 1e-9 and fit.samples == 24


def test_fit_compute_recovers_turn_taking_slowdown():
    fit = fit_compute(_synthetic(beta=0.1, gamma=0.3), cores=2)
    assert (fit.corun, fit.oversub) == (pytest.approx(0.1, abs=1e-12), pytest.approx(0.3, abs=1e-12))
    assert fit.rate == pytest.approx(RATES, rel=1e-9) and fit.mean_abs_error < 1e-9


def test_fit_compute_recovers_memory_bandwidth_and_split_overhead():
    fit = fit_compute(_synthetic(beta=0.1, bandwidth=8e9, split=5e-4), cores=2, memory=True)
    assert fit.corun == pytest.approx(0.1, abs=1e-12) and fit.rate == pytest.approx(RATES, rel=1e-6)
    assert fit.bandwidth == pytest.approx(8e9, rel=1e-6) and fit.split_overhead == pytest.approx(5e-4, rel=1e-6)
    assert fit.overhead == pytest.approx(3e-4, rel=1e-6)


def test_fit_compute_recovers_a_memory_bandwidth_per_kind_and_the_per_op_cost(tmp_path):
    bws = (8e9, 6e9, 1.2e10)
    fit = fit_compute(_synthetic(beta=0.05, bandwidth=bws, split=2e-4, per_op=3e-5, split_group=7e-5), cores=2,
                      memory="kinds")
    assert fit.split_group == pytest.approx(7e-5, rel=1e-6) and fit.split_overhead == pytest.approx(2e-4, rel=1e-6)
    assert fit.memory_kinds == pytest.approx(bws, rel=1e-6) and fit.bandwidth == pytest.approx(8e9, rel=1e-6)
    assert fit.per_op == pytest.approx(3e-5, rel=1e-6) and fit.overhead == pytest.approx(3e-4, rel=1e-6)
    assert fit.rate == pytest.approx(RATES, rel=1e-6) and fit.corun == pytest.approx(0.05, abs=1e-12)
    moved = (1e6, 2e6, 3e6)
    assert fit.predict((0, 0, 0), 1, moved, ops=2) == pytest.approx(
        fit.overhead + 1e6 / 8e9 + 2e6 / 6e9 + 3e6 / 1.2e10 + 2 * fit.per_op)
    hw = build_hardware(fit, overhead=0.0, latency=0.0, bandwidth=1e9, membw=1e9, cores=2, devices=2, source="")
    assert hw.device.kind_memory_efficiency == pytest.approx({"F": 1.0, "I": 0.75, "W": 1.5})
    assert hw.per_op_overhead == fit.per_op
    assert hw.compute_time(0.0, 1.2e10, "float32", "W") == pytest.approx(1.0)  # 1.2e10 bytes at 8e9 * 1.5
    (tmp_path / "hw.toml").write_text(hardware_to_toml(hw))
    assert load_hardware(str(tmp_path / "hw.toml")) == hw  # kind_memory_efficiency round-trips


def test_fit_compute_never_returns_a_negative_cost():
    # actions with more ops ran faster: an unconstrained fit would price an op below zero; the
    # constrained one drops the per-op term and refits the rest
    samples = [Sample((f, 0.0, 0.0), f / 1e9 * (1.0 - 0.02 * ops), ops=ops)
               for f in (1e7, 2e7, 4e7) for ops in (1.0, 5.0, 9.0)]
    fit = fit_compute(samples, fit_corun=False)
    assert fit.per_op == 0.0 and fit.overhead >= 0.0 and fit.rate[0] > 0
    # refitted without the term (clipping it to 0 instead would leave the rest at values that only made
    # sense beside a negative op cost: 1.46 ms per action, errors up to +27 %)
    assert fit.overhead == pytest.approx(0.0, abs=1e-12) and fit.mean_abs_error < 0.07
    assert fit_compute(samples, fit_corun=False, per_op=False).per_op == 0.0


def test_fit_compute_without_fixed_costs_always_finds_a_rate():
    # bigger actions ran no longer (noise in a tiny plan): with a per-action cost in the fit the FLOP
    # rate comes out non-physical; FLOP rates alone are determined by any positive durations
    samples = [Sample((f, 0.0, 0.0), 1e-3 - f * 1e-11) for f in (1e6, 2e6, 4e6, 8e6)]
    with pytest.raises(PipesimError, match="non-positive compute rate"):
        fit_compute(samples, fit_corun=False)
    fit = fit_compute(samples, fit_corun=False, fixed=False)
    assert fit.rate[0] > 0 and fit.overhead == 0.0 and fit.split_overhead == 0.0


def test_fit_compute_without_corun_keeps_beta_zero():
    fit = fit_compute(_synthetic(beta=0.0), cores=2, fit_corun=False)
    assert fit.corun == 0.0 and fit.rate == pytest.approx(RATES, rel=1e-9)


def test_fit_compute_needs_samples_and_weighs_relative_errors():
    with pytest.raises(PipesimError, match="at least 4"):
        fit_compute(_synthetic(0.0)[:3])
    same = [Sample((1e7, 0, 0), 1e-3), Sample((1e7, 0, 0), 1.2e-3), Sample((1e7, 0, 0), 0.9e-3),
            Sample((1e7, 0, 0), 1.1e-3)]
    fit = fit_compute(same, fit_corun=False)  # one size: the relative least-squares constant sum(1/t) / sum(1/t^2)
    inv = [1 / s.seconds for s in same]
    assert fit.predict((1e7, 0, 0)) == pytest.approx(sum(inv) / sum(i * i for i in inv), rel=1e-9)


def test_predict_and_work_match_the_fitted_equation():
    fit = ComputeFit(rate=(1e9, 2e9, 4e9), overhead=1e-3, corun=0.5, mean_abs_error=0.0, samples=0)
    assert fit.predict((1e9, 2e9, 4e9), overheads=2) == pytest.approx(2e-3 + 3.0)
    # 1 s alone, 3 s with 2 runnable on 2 cores (beta 0.5: 2/3 speed), 4 s with 4 runnable (1/2 / 1.5 / 1.4)
    sample = Sample((1.0, 0, 0), 8.0, (1.0, 3.0, 0.0, 4.0))
    assert sample.work(2, 0.5, 0.2) == pytest.approx(1.0 + 3.0 / 1.5 + 4.0 * 0.5 / 1.5 / 1.4)
    assert Sample((1.0, 0, 0), 8.0).work(2, 0.5) == 8.0  # no profile: alone


def test_fit_link_recovers_latency_and_bandwidth():
    pts = [(n, 50e-6 + n / 1.4e9) for n in (4, 1024, 65536, 1 << 20, 8 << 20)]
    lat, bw = fit_link(pts)
    assert lat == pytest.approx(50e-6, rel=1e-9) and bw == pytest.approx(1.4e9, rel=1e-9)
    with pytest.raises(PipesimError, match="two message sizes"):
        fit_link(pts[:1])
    with pytest.raises(PipesimError, match="do not grow"):
        fit_link([(4, 2e-3), (1 << 20, 1e-3)])


def test_action_flops_first_stage_has_no_input_gradient():
    f = (1.0, 2.0, 3.0)
    assert action_flops("F", 1, f) == ((1.0, 0.0, 0.0), 1)
    assert action_flops("B", 0, f) == ((0.0, 2.0, 3.0), 2)
    assert action_flops("I", 0, f) == ((0.0, 0.0, 0.0), 1)
    assert action_flops("W", 0, f) == ((0.0, 2.0, 3.0), 1)
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
    assert fl[0] == (2 * 4 * 64 * 64, 2 * 4 * 64 * 64, 2 * 4 * 64 * 64)
    # (seconds, seconds alone / with 2 runnable, overheads charged)
    assert [(s.seconds, s.profile, s.overheads) for s in samples] == [
        (1.0, (0.75, 0.25), 1), (0.75, (0.0, 0.75), 1), (1.5, (0.25, 1.25), 1), (2.0, (1.5, 0.5), 2)]
    assert samples[3].flops == (0.0, fl[1][1], fl[1][2])
    assert [s.ops for s in samples] == [2, 2, 2, 3]  # one layer per stage: F linear + GeLU; B their 2 + dW


def test_speed_and_runnable_profile_closed_forms():
    assert speed(1, 2, 0.1) == 1.0 and speed(0, 2, 0.1) == 1.0
    assert speed(2, 2, 0.1) == pytest.approx(1 / 1.1)  # a core each, shared memory
    assert speed(4, 2, 0.1) == pytest.approx(0.5 / 1.1)  # 4 runnable on 2 cores take turns
    assert speed(4, 2, 0.0, 0.25) == pytest.approx(0.5 / 1.5)  # and pay 0.25 per runnable rank beyond the cores
    assert speed(3, 2, 0.0) == pytest.approx(2 / 3)
    busy = [[(0.0, 1.0), (2.0, 4.0)], [(0.5, 3.0)]]
    assert runnable_profile([(0.0, 4.0), (5.0, 6.0)], busy, 3) == [[0.0, 2.5, 1.5], [1.0, 0.0, 0.0]]
    assert runnable_profile([(0.0, 4.0)], busy, 2) == [[0.0, 4.0]]  # counts above max_count are clipped


def _sharing_run(cores: int, corun: float, oversub: float, jobs: list[tuple[int, float, float]]) -> dict[int, float]:
    """Finish time of each (rank, start, work) job under HostSharing on one node."""
    import simpy

    env = simpy.Environment()
    host = HostSharing(env, [0] * len(jobs), cores, corun, oversub)
    ends: dict[int, float] = {}

    def job(rank: int, start: float, work: float):
        yield env.timeout(start)
        host.start(rank, work, lambda: ends.__setitem__(rank, env.now))

    for j in jobs:
        env.process(job(*j))
    env.run()
    return ends


def test_host_sharing_retimes_running_work_when_ranks_start_and_stop():
    # one core: rank 0 alone for 0.5 s (1.5 s of work left), then both at half speed until rank 1's 1 s
    # of work is done at 2.5, then rank 0's last 0.5 s alone
    assert _sharing_run(1, 0.0, 0.0, [(0, 0.0, 2.0), (1, 0.5, 1.0)]) == {1: 2.5, 0: 3.0}
    # two cores, co-run 0.25: both at 0.8 from 0.5; rank 1 done at 0.5 + 1 / 0.8, rank 0 then has 0.5 left
    ends = _sharing_run(2, 0.25, 0.0, [(0, 0.0, 2.0), (1, 0.5, 1.0)])
    assert ends[1] == pytest.approx(1.75) and ends[0] == pytest.approx(2.25)
    # three ranks on two cores with 0.5 per rank beyond: 2/3 / 1.5 speed each while all three run
    ends = _sharing_run(2, 0.0, 0.5, [(0, 0.0, 1.0), (1, 0.0, 1.0), (2, 0.0, 1.0)])
    assert ends == {0: pytest.approx(2.25), 1: pytest.approx(2.25), 2: pytest.approx(2.25)}


def _fit() -> ComputeFit:
    return ComputeFit(rate=(2e10, 1e10, 1.6e10), overhead=2e-4, corun=0.15, mean_abs_error=0.0, samples=10)


def test_hardware_file_round_trips_and_times_kinds(tmp_path):
    hw = build_hardware(_fit(), overhead=2.5e-4, latency=8e-5, bandwidth=9e8, membw=8e9, cores=2, devices=4,
                        source="test")
    path = tmp_path / "hw.toml"
    path.write_text(hardware_to_toml(hw))
    back = load_hardware(str(path))
    assert back == hw and hash(back) == hash(hw)
    assert back.node_corun_slowdown == 0.15 and back.host_cores == 2
    assert back.compute_time(1e9, 0.0, "float32", "I") == pytest.approx(1e9 / 1e10 + 2.5e-4)
    assert back.compute_time(1e9, 0.0, "float32", "W") == pytest.approx(1e9 / 1.6e10 + 2.5e-4)
    assert back.compute_time(1e9, 0.0, "float32") == pytest.approx(1e9 / 2e10 + 2.5e-4)


def test_presets_keep_their_figures():
    hw = load_hardware("dgx-h100")
    assert hw.device.kind_efficiency is None and hw.node_corun_slowdown == 0.0
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
    assert hw.host_cores >= 1 and hw.intra.bandwidth > 0 and hw.device.kind_efficiency["F"] == 1.0
    assert sorted(p.name for p in (tmp_path / "runs").glob("round0/p2/fit-*.json")) == ["fit-1f1b-m2.json",
                                                                                      "fit-zb-h1-m4.json"]
    meta = Timeline.read(tmp_path / "runs" / "round0" / "p2" / "fit-1f1b-m2.json").meta
    assert 0 < meta["probe_before"] < 1 and 0 < meta["probe_after"] < 1  # the speed probe ran beside the run
    assert meta["probe"] == (meta["probe_before"] + meta["probe_after"]) / 2
    sim = _cli("simulate", "1f1b", "-p", "2", "-m", "4", "--model", "mlp", "--hidden", "256", "--layers", "4",
               "--batch", "16", "--hardware", str(out), "--json")
    assert sim.returncode == 0, sim.stderr
    assert '"hardware": "calibrated-cpu"' in sim.stdout


def _cpu(cores: int, corun: float):
    from dataclasses import replace

    return replace(load_hardware("local-cpu"), host_cores=cores, node_corun_slowdown=corun,
                   oversubscription_slowdown=0.0)


def test_simulator_host_sharing():
    import schedules
    from pipesim.costs import CostTable
    from pipesim.simulator import simulate

    table = CostTable.uniform(2, 1.0, 1.0, 1.0)
    naive = schedules.build("naive", 2, 1)
    # no two ranks ever compute at once: sharing changes nothing, the closed form m * p * (F + B) holds
    assert simulate(naive, table, _cpu(1, 0.5), comm=False).makespan == 6.0
    one = schedules.build("1f1b", 2, 4)
    free = simulate(one, table, None, comm=False).makespan
    assert free == (4 + 2 - 1) * 3.0
    assert simulate(one, table, _cpu(2, 0.0), comm=False).makespan == free  # a core each, no co-run cost
    shared = simulate(one, table, _cpu(1, 0.0), comm=False)
    corun = simulate(one, table, _cpu(2, 0.25), comm=False)
    assert free < corun.makespan and free < shared.makespan
    # one core, processor sharing: both ranks runnable -> each at half speed, re-timed whenever one
    # starts or stops (0F1 and 1F0 share 1..3; 0B0 runs 1 unit beside 1F1, then 1 beside 1B1, ...)
    assert shared.makespan == 24.0  # = all 2 x 4 x (F + B) of work; the core is never idle
    rank0 = [(str(a), s, e) for a, s, e in zip(shared.schedule.programs[0], shared.starts[0], shared.ends[0])
             if a.kind.value in ("F", "B")]
    assert rank0 == [("0F0", 0.0, 1.0), ("0F1", 1.0, 3.0), ("0B0", 5.0, 9.0), ("0F2", 9.0, 11.0),
                     ("0B1", 11.0, 15.0), ("0F3", 15.0, 17.0), ("0B2", 17.0, 21.0), ("0B3", 22.0, 24.0)]
    again = simulate(one, table, _cpu(1, 0.0), comm=False)
    assert again.starts == shared.starts and again.ends == shared.ends  # deterministic


def test_refine_overhead_recovers_the_step_level_overhead():
    from dataclasses import replace

    from pipesim.calibrate import QUICK_MLP, refine_overhead, run_spec, simulate_run

    hw = replace(_cpu(2, 0.1), per_action_overhead=5e-4)
    runs = [run_spec("a", "1f1b", 4, QUICK_MLP), run_spec("b", "zb-h1", 4, QUICK_MLP, p=3)]
    top = 4 * 5e-4
    truth = replace(hw, per_action_overhead=top * 37 / 120)
    measured = {r["id"]: simulate_run(truth, r).makespan for r in runs}
    assert refine_overhead(hw, runs, measured).per_action_overhead == truth.per_action_overhead


def test_refine_corun_recovers_the_step_level_co_run_slowdown():
    from dataclasses import replace

    from pipesim.calibrate import QUICK_MLP, refine_corun, run_spec, simulate_run

    hw = _cpu(2, 0.0)
    runs = [run_spec("a", "1f1b", 4, QUICK_MLP), run_spec("b", "gpipe", 4, QUICK_MLP)]
    truth = replace(hw, node_corun_slowdown=0.5 * 17 / 50)  # a grid point: found exactly
    measured = {r["id"]: simulate_run(truth, r).makespan for r in runs}
    assert refine_corun(hw, runs, measured).node_corun_slowdown == truth.node_corun_slowdown


def test_refine_oversubscription_uses_only_runs_with_more_ranks_than_cores():
    from dataclasses import replace

    from pipesim.calibrate import LECTURE_MLP, QUICK_MLP, refine_oversubscription, run_spec, simulate_run

    hw = _cpu(2, 0.0)
    # stages long enough for 3-4 ranks to be runnable at once (QUICK_MLP's are shorter than a message)
    runs = [run_spec("a", "1f1b", 4, QUICK_MLP), run_spec("b", "gpipe", 8, LECTURE_MLP, p=4)]
    truth = replace(hw, oversubscription_slowdown=13 / 50)  # a grid point of [0, 1]
    measured = {r["id"]: simulate_run(truth, r).makespan for r in runs}
    measured["a"] *= 2  # a 2-rank run never enters this fit
    assert refine_oversubscription(hw, runs, measured).oversubscription_slowdown == truth.oversubscription_slowdown
    assert refine_oversubscription(hw, runs[:1], measured) is hw  # nothing oversubscribed: unchanged


def test_typical_samples_and_runs_take_the_median():
    from pipesim.calibrate_fit import typical_samples
    from pipesim.measured import typical_run, typical_step

    def s(t: float) -> Sample:
        return Sample((1.0, 0.0, 0.0), t)

    groups = {("b", 0, "F"): [s(5.0), s(4.0)], ("a", 1, "B"): [s(1.0), s(3.0), s(2.0)]}
    assert typical_samples(groups) == [s(2.0), s(4.0)]  # sorted by key; the lower median of an even count

    def run(span: float) -> Timeline:
        return Timeline("measured", "naive", 1, [Event(0, "compute", "F", 0, 0, 0.0, span, step=0)], {})

    runs = [run(3.0), run(1.0), run(2.0), run(9.0)]
    assert typical_run(runs) is runs[2] and typical_step(runs) == 2.0 and typical_step(runs[:1]) == 3.0


def test_sum_roofline_and_split_overhead_round_trip(tmp_path):
    fit = ComputeFit(rate=(2e10, 1e10, 1.6e10), overhead=2e-4, corun=0.0, mean_abs_error=0.0, samples=10,
                     bandwidth=5e9, split_overhead=1e-4)
    hw = build_hardware(fit, overhead=2e-4, latency=1e-4, bandwidth=1e9, membw=2e10, cores=2, devices=2, source="")
    assert hw.roofline == "sum" and hw.device.hbm_bandwidth == 5e9 and hw.split_backward_overhead == 1e-4
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
    from pipesim.costs import CostTable
    from pipesim.simulator import simulate

    hw = replace(load_hardware("local-cpu"), host_cores=None, split_backward_overhead=0.25, split_group_overhead=0.125)
    plain = CostTable.uniform(2, 1.0, 1.0, 1.0)
    grouped = CostTable(tuple(replace(c, weight_ops=4) for c in plain.stages))  # 4 groups: +0.5 s per I or W
    longer = CostTable.uniform(2, 1.0, 1.75, 1.75)
    zb = schedules.build("zb-h1", 2, 4)
    a, b = simulate(zb, grouped, hw, comm=False), simulate(zb, longer, None, comm=False)
    assert (a.starts, a.ends) == (b.starts, b.ends)
    (tmp_path / "hw.toml").write_text(hardware_to_toml(hw))
    assert load_hardware(str(tmp_path / "hw.toml")).split_group_overhead == 0.125


def test_split_backward_overhead_enters_the_zb_h1_closed_form():
    from dataclasses import replace

    import schedules
    from pipesim.costs import CostTable
    from pipesim.simulator import simulate

    hw = replace(load_hardware("local-cpu"), host_cores=None, split_backward_overhead=0.5)
    for m in (2, 4):  # the same as I and W costing 0.5 s more each, and nothing else
        zb = schedules.build("zb-h1", 2, m)
        with_overhead = simulate(zb, CostTable.uniform(2, 1.0, 1.0, 1.0), hw, comm=False)
        longer = simulate(zb, CostTable.uniform(2, 1.0, 1.5, 1.5), None, comm=False)
        assert (with_overhead.starts, with_overhead.ends) == (longer.starts, longer.ends)
    assert with_overhead.makespan == 17.5
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


def test_message_delays_split_waiting_from_late_recvs_and_fit_the_delays():
    from pipesim.calibrate import oversubscribed_recv_delay
    from pipesim.measured import late_recv_delay, message_delays

    tl = _message_timeline(2)
    assert message_delays(tl) == [(0.75, 8, False), (1.5, 8, True), (0.5, 8, True)]
    assert late_recv_delay([tl]) == 1.0  # mean of the late RECVs only
    assert late_recv_delay([]) == 0.0
    # 4 ranks on 2 cores: 2 ranks beyond the cores; (1.0 - 0.5) / 2 per extra rank
    assert oversubscribed_recv_delay([_message_timeline(4)], 0.5, 2) == 0.25
    assert oversubscribed_recv_delay([], 0.5, 2) == 0.0
    assert oversubscribed_recv_delay([_message_timeline(4)], 2.0, 2) == 0.0  # never negative


def test_in_run_latency_from_the_waiting_receives():
    from pipesim.calibrate import in_run_latency

    tl = _message_timeline(2)  # one waiting RECV: delivered 0.75 s after its SEND was posted, 8 bytes
    assert in_run_latency([tl], 16.0, 9.0) == 0.25  # 0.75 - 8 / 16
    assert in_run_latency([tl], 8.0, 9.0) == 0.0  # never negative
    assert in_run_latency([], 16.0, 9.0) == 9.0  # no messages: the ping-pong's figure


def test_message_figures_round_trip_and_default_to_zero(tmp_path):
    from dataclasses import replace

    base = load_hardware("dgx-h100")
    assert (base.send_overhead, base.late_recv_delay, base.oversubscribed_recv_delay) == (0.0, 0.0, 0.0)
    assert "late_recv_delay" not in hardware_to_toml(base)
    hw = replace(load_hardware("local-cpu"), send_overhead=2.5e-4, late_recv_delay=1.25e-3,
                 oversubscribed_recv_delay=6.25e-4)
    path = tmp_path / "hw.toml"
    path.write_text(hardware_to_toml(hw))
    assert load_hardware(str(path)) == hw
