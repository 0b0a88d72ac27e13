"""The compute fit recovers known figures exactly, never returns a negative cost, and degrades to simpler models."""

from __future__ import annotations

import pytest

from pipesim.calibration.calibrate import build_hardware
from pipesim.calibration.fit import ComputeFit, Sample, fit_compute, fit_link, typical_samples
from pipesim.calibration.measured import interquartile_mean, typical_metrics, typical_run, typical_step
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import hardware_to_toml, load_hardware
from pipesim.sim.host.sharing import speed
from pipesim.timeline import Event, Timeline

RATES = (20e9, 12e9, 16e9)  # FLOP/s of F, I, W


def _synthetic(beta: float, overhead: float = 3e-4, bandwidth: float | tuple[float, float, float] | None = None,
               split: float = 0.0, gamma: float | None = None, per_op: float = 0.0,
               split_group: float = 0.0, per_op_backward: float | None = None,
               split_graph: float = 0.0) -> list[Sample]:
    """Exact samples of the model the fit assumes, over varied sizes, kinds and runnable ranks (2 cores).

    Each action runs its first quarter alone and the rest with 2 runnable ranks; with `gamma`, also
    some with 4 runnable (turn-taking at half speed, less gamma per rank beyond the cores).
    `bandwidth`: one figure for all memory traffic, or one per kind (F, I, W). `per_op_backward`: a
    separate cost per op of I and W work; `split_graph`: a cost per backward op of the stage on split I.
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
            back_ops = ops if flops[0] == 0 else 0.0  # ops of I and W work
            graph = 10.0 + 7 * (size == 1e7) if sp and flops[1] else 0.0  # split I: the stage's backward ops
            op_b = per_op if per_op_backward is None else per_op_backward
            for shares in crowds:
                work = n * overhead + sum(f / r for f, r in zip(flops, RATES, strict=True)) + sp * split
                work += (ops - back_ops) * per_op + back_ops * op_b + groups * split_group + graph * split_graph
                if bandwidth:
                    work += sum(b / w for b, w in zip(moved, bws, strict=True) if b)
                # seconds such that sum_k t_k * speed(k) = work, with t_k = share_k * seconds
                per_second = sum(x * speed(k, 2, beta, g) for k, x in enumerate(shares, start=1))
                seconds = work / per_second
                out.append(Sample(flops, seconds, tuple(x * seconds for x in shares), n, moved, sp,
                                  ops if per_op else 0.0, groups if split_group else 0.0,
                                  back_ops if per_op else 0.0, graph if split_graph else 0.0))
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


def test_fit_compute_recovers_backward_op_cost_and_the_split_input_graph_walk(tmp_path):
    fit = fit_compute(_synthetic(beta=0.05, bandwidth=8e9, split=2e-4, per_op=3e-5, split_group=7e-5,
                                 per_op_backward=2e-5, split_graph=1.5e-5), cores=2, memory=True)
    assert fit.per_op == pytest.approx(3e-5, rel=1e-6) and fit.per_op_backward == pytest.approx(2e-5, rel=1e-6)
    assert fit.split_graph == pytest.approx(1.5e-5, rel=1e-6) and fit.split_group == pytest.approx(7e-5, rel=1e-6)
    assert fit.split_overhead == pytest.approx(2e-4, rel=1e-6) and fit.mean_abs_error < 1e-6
    # a split I of 4 ops (2 of F work would not be there) on a stage of 10 backward ops
    assert fit.predict((0, 0, 0), 1, split=1, ops=4, backward_ops=4, graph=10) == pytest.approx(
        fit.overhead + 2e-4 + 4 * 2e-5 + 10 * 1.5e-5, rel=1e-6)
    hw = build_hardware(fit, overhead=0.0, latency=0.0, bandwidth=1e9, membw=1e9, cores=2, devices=2, source="")
    assert (hw.backward_op_overhead, hw.host.split_graph_overhead) == (fit.per_op_backward, fit.split_graph)
    base = hw.compute_time(0.0, 0.0, "float32", "F")  # the per-action overhead alone
    assert hw.compute_time(0.0, 0.0, "float32", "F", ops=10) - base == pytest.approx(10 * fit.per_op)
    assert hw.compute_time(0.0, 0.0, "float32", "W", ops=10) - base == pytest.approx(10 * fit.per_op_backward)
    (tmp_path / "hw.toml").write_text(hardware_to_toml(hw))
    assert load_hardware(str(tmp_path / "hw.toml")) == hw


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


def test_typical_samples_take_the_median_and_runs_the_interquartile_mean():
    def s(t: float) -> Sample:
        return Sample((1.0, 0.0, 0.0), t)

    groups = {("b", 0, "F"): [s(5.0), s(4.0)], ("a", 1, "B"): [s(1.0), s(3.0), s(2.0)]}
    assert typical_samples(groups) == [s(2.0), s(4.0)]  # sorted by key; the lower median of an even count

    def run(span: float) -> Timeline:
        return Timeline("measured", "naive", 1, [Event(0, "compute", "F", 0, 0, 0.0, span, step=0)], {})

    runs = [run(3.0), run(1.0), run(2.0), run(9.0)]
    assert typical_step(runs) == 2.5  # the middle half of all steps: (2 + 3) / 2; the 9 s outlier is out
    assert typical_run(runs) is runs[0]  # 3.0 and 2.0 are equally near: the earliest
    assert typical_step(runs[:1]) == 3.0 and typical_metrics(runs) == (2.5, 0.0)  # one rank, always busy
    assert interquartile_mean([8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0]) == 4.5  # mean of 3..6
    assert interquartile_mean([5.0, 1.0, 3.0]) == 3.0  # fewer than 4: all
