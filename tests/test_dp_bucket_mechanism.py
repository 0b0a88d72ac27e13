"""Issue 15's data-parallel mechanism in the simulator, in closed form: gradient buckets overlapped with the last
backward, ZeRO 1's bucketed reduce-scatter and parameter gather, and the SMs NCCL's channels take from the compute
beside them (pipesim.comm.comm_options, pipesim.sim.step, pipesim.comm.overlap_interference)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import schedules
from pipesim.cli import main
from pipesim.comm.collective_algos import collective_seconds
from pipesim.comm.comm_options import CommOptions, bucket_fractions
from pipesim.cost.device_profiles import profile_of
from pipesim.cost.kernel_costs import kernel_seconds
from pipesim.cost.model_costs import model_costs, uniform_costs
from pipesim.cost.step_costs import StepCollective, StepCosts
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.schedule import Kind
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.kernel_types import FlashAttention, Gemm
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.piece_kernels import embedding_kernels, head_kernels
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.simulator import simulate

US = 1e-6  # seconds per microsecond
MS = 1e-3  # seconds per millisecond
A100X2 = load_hardware("dgx-a100").with_nodes(2)  # NVSwitch 240 GB/s in a node, one 23.75 GB/s HDR NIC per GPU
H100 = load_hardware("dgx-h100")
CPU = load_hardware("local-cpu")


# -- mechanism 2 (data-parallel part): gradient buckets overlapped with the last backward -----------------------

PARAMS = 4_000_000  # parameters of the stage on one tp rank


def _dp1(costs):
    """The same costs on one data-parallel replica (the rest of their job kept)."""
    return replace(costs, job=replace(costs.job, dims=replace(costs.job.dims, dp=1)))


def _one_stage_dp2(grad_bytes: int, step: StepCosts | None = None):
    """p = 1, dp = 2 on dgx-h100 (devices 0 and 1), F 1 ms, backward 2 ms (1 ms to 3 ms)."""
    costs = uniform_costs(1, {"F": MS, "I": MS, "W": MS})
    return replace(costs, job=Job(ParallelDims(dp=2)), dp_grad_bytes=(grad_bytes,), param_counts=(PARAMS,), step=step)


def test_bucket_fractions_fill_in_reverse_layer_order_with_a_remainder_last():
    assert bucket_fractions(PARAMS, PARAMS // 4) == (0.25, 0.5, 0.75, 1.0)
    assert bucket_fractions(10, 4) == (0.4, 0.8, 1.0)
    assert bucket_fractions(10, 10) == (1.0,) and bucket_fractions(0, 5) == (1.0,)
    assert CommOptions(overlap_grad_reduce=True).bucket_params(8) == 40_000_000  # Megatron: max(40M, 1M x dp)
    assert CommOptions(overlap_grad_reduce=True).bucket_params(64) == 64_000_000


def test_buckets_are_ready_as_the_backward_passes_them_and_only_the_last_is_exposed():
    g = 8_000_000  # bytes: 2 MB per bucket, reduced in ~10 us, well inside each 0.5 ms slice of the backward
    sched = schedules.build("1f1b", 1, 1)
    opts = CommOptions(overlap_grad_reduce=True, ddp_bucket_size=PARAMS // 4)
    res = simulate(sched, with_comm(_one_stage_dp2(g), opts), H100)
    c = collective_seconds(H100, "all_reduce", [0, 1], g // 4)
    assert [(r.kind, r.nbytes, r.start) for r in res.collectives] == [
        ("all_reduce", g // 4, MS + 2 * MS * f) for f in (0.25, 0.5, 0.75)] + [("all_reduce", g // 4, 3 * MS)]
    assert res.collectives[-1].end == 3 * MS + c  # the exposed tail: the last bucket's reduction
    whole = simulate(sched, _one_stage_dp2(g), H100)  # today: one all_reduce after the backward
    assert [(r.nbytes, r.start) for r in whole.collectives] == [(g, 3 * MS)]
    assert whole.collectives[0].end == 3 * MS + collective_seconds(H100, "all_reduce", [0, 1], g)


def test_slow_buckets_queue_on_the_collective_stream():
    g = 4 * 10**9  # bytes: 1 GB per bucket, each longer than the 0.5 ms the backward takes to fill the next
    sched = schedules.build("1f1b", 1, 1)
    opts = CommOptions(overlap_grad_reduce=True, ddp_bucket_size=PARAMS // 4)
    res = simulate(sched, with_comm(_one_stage_dp2(g), opts), H100)
    c = collective_seconds(H100, "all_reduce", [0, 1], g // 4)
    assert c > 0.5 * MS
    assert res.collectives[0].start == 1.5 * MS
    assert [r.start for r in res.collectives[1:]] == [r.end for r in res.collectives[:-1]]
    tail = res.collectives[-1].end - 3 * MS  # what the backward did not hide
    assert tail == pytest.approx(4 * c - 1.5 * MS, rel=1e-12)


def test_zero1_reduce_scatters_in_buckets_and_gathers_the_parameters_after_the_optimizer():
    g, a, opt = 8_000_000, 4_000_000, 0.1 * MS
    step = StepCosts(collectives=((StepCollective("reduce_scatter", g, "grads"),
                                   StepCollective("all_gather", a, "params")),),
                     optimizer_seconds=(opt,), optimizer_bytes=(0,), zero=1)
    sched = schedules.build("1f1b", 1, 1)
    opts = CommOptions(overlap_grad_reduce=True, ddp_bucket_size=PARAMS // 2)
    res = simulate(sched, with_comm(_one_stage_dp2(g, step), opts), H100)
    rs = [r for r in res.collectives if r.kind == "reduce_scatter"]
    assert [(r.nbytes, r.start) for r in rs] == [(g // 2, 2 * MS), (g // 2, 3 * MS)]
    end = res.step_ends[0]
    assert end.optimizer_start == rs[-1].end and end.optimizer_end == rs[-1].end + opt
    (ag,) = [r for r in res.collectives if r.kind == "all_gather"]
    assert (ag.nbytes, ag.start) == (a, end.optimizer_end) and res.step_time == ag.end


def test_slow_buckets_cost_the_backward_they_run_beside():
    """The same queued buckets, now with the backward losing NCCL's SMs beside them (ComputeOp.shared): a B of
    2 ms alone gains e = 2 ms wholly beside a collective, so it loses share = e / (2 + e) = 1/2 of its progress
    while the buckets it issued ran; it ends later by that overlap x share, and the step with it."""
    g = 4 * 10**9  # bytes: 1 GB per bucket
    sched = schedules.build("1f1b", 1, 1)
    opts = CommOptions(overlap_grad_reduce=True, ddp_bucket_size=PARAMS // 4)
    free = simulate(sched, with_comm(_one_stage_dp2(g), opts), H100)
    costs = replace(_one_stage_dp2(g), sm_share={(0, "B"): 2 * MS})
    res = simulate(sched, with_comm(costs, opts), H100)
    assert [(r.start, r.end) for r in res.collectives] == [(r.start, r.end) for r in free.collectives]
    overlap = sum(max(0.0, min(r.end, 3 * MS) - r.start) for r in free.collectives)  # seconds inside [1, 3] ms
    b = next(i for i, a in enumerate(res.schedule.programs[0]) if a.kind == Kind.B and a.stage == 0)
    assert res.ends[0][b] == pytest.approx(3 * MS + overlap / 2, rel=1e-12)
    assert res.sm_shared == [pytest.approx(overlap / 2, rel=1e-12)]
    assert res.to_dict()["ranks"][0]["dp_sm_share"] == res.sm_shared[0]
    assert "dp_sm_share" not in free.to_dict()["ranks"][0]
    # without dp nothing is shared: the same costs at dp 1 run as before, bit for bit
    one = simulate(sched, with_comm(_dp1(costs), opts), H100)
    assert one.ends == simulate(sched, with_comm(_dp1(_one_stage_dp2(g)), opts), H100).ends


def test_a_compute_beside_its_ranks_reduce_scatter_runs_slower_while_it_runs():
    """ZeRO 2 reduce-scatters after every backward; the next microbatch's F meets the first one on the rank's
    collective stream. p = 1, m = 2: F0 [0, 1], B0 [1, 3] ms, then the reduce-scatter of c seconds from 3 ms. F1
    (1 ms alone, e = 1 ms beside: half pace) runs c at half pace, then the rest alone: it ends at
    3 + c + (1 - c / 2) ms when c < 2 ms."""
    g = 450_000_000  # bytes of gradients: the reduce-scatter over the two H100s takes c (about 0.6 ms here)
    step = StepCosts(collectives=((StepCollective("reduce_scatter", g, "microbatch"),),), optimizer_seconds=(0.0,),
                     optimizer_bytes=(0,), zero=2)
    sched = schedules.build("1f1b", 1, 2)
    costs = replace(_one_stage_dp2(g, step), sm_share={(0, "F"): MS})
    res = simulate(sched, costs, H100)
    c = collective_seconds(H100, "reduce_scatter", [0, 1], g)
    assert 0 < c < 2 * MS
    rs = [r for r in res.collectives if r.kind == "reduce_scatter"]
    assert (rs[0].start, rs[0].end) == (3 * MS, 3 * MS + c)
    f1 = [i for i, a in enumerate(res.schedule.programs[0]) if a.kind == Kind.F][1]
    assert res.starts[0][f1] == 3 * MS
    assert res.ends[0][f1] == pytest.approx(3 * MS + c + (MS - c / 2), rel=1e-12)
    assert res.sm_shared == [pytest.approx(c / 2, rel=1e-12)]  # F1's lost seconds: nothing else met a collective
    plain = simulate(sched, _one_stage_dp2(g, step), H100)  # no share: 1 ms, the overlap free
    assert plain.ends[0][f1] == 4 * MS


def test_model_costs_share_is_the_kernels_on_the_sms_nccl_leaves():
    """On a GPU preset with dp > 1, each action's share is its kernels' seconds with every GEMM on sms - channels
    SMs (the wave model of pipesim.device.gemm) less its seconds alone; dp = 1: none."""
    model = ModelConfig(kind="gpt", hidden=1024, layers=2, heads=16, seq=1024, vocab=1024, batch=8, dtype="bfloat16")
    hw = load_hardware("dgx-a100")
    profile = profile_of(hw.device.family, hw.device.kernels)
    costs = model_costs(model, 1, 2, hw, Job(ParallelDims(dp=2)))
    opts = Job().layer_options(model)
    free = profile.sms - profile.nccl_channels
    ks = layer_kernels(model, 2, opts)
    extra_f = 2 * sum(kernel_seconds(k, "bfloat16", profile, free) - kernel_seconds(k, "bfloat16", profile)
                      for k in ks.F if isinstance(k, Gemm))
    shared = costs.sm_share
    assert set(shared) == {(0, "F"), (0, "W"), (0, "B")}  # the first stage runs its whole backward in W
    assert shared[(0, "F")] == pytest.approx(extra_f + _head_embedding_extra(model, hw, profile, free), rel=1e-9)
    assert shared[(0, "B")] == shared[(0, "W")] > 0
    assert model_costs(model, 1, 2, hw, Job()).sm_share == {}
    # no device family: no kernels, no channels
    assert model_costs(model, 1, 2, CPU, Job(ParallelDims(dp=2))).sm_share == {}


def test_flash_attention_shares_the_sms_too():
    """With flash attention each action's share adds its flash kernels' extra waves on sms - channels SMs (the
    memory-bound kernels stay as alone): the forward's share is its GEMMs' and its flash kernel's extras."""
    model = ModelConfig(kind="gpt", hidden=1024, layers=2, heads=16, seq=1024, vocab=1024, batch=8, dtype="bfloat16")
    hw = load_hardware("dgx-a100")
    profile = profile_of(hw.device.family, hw.device.kernels)
    free = profile.sms - profile.nccl_channels
    opts = Job(attention="flash").layer_options(model)
    ks = layer_kernels(model, 2, opts)
    flash = [k for k in ks.F if isinstance(k, FlashAttention)]
    assert len(flash) == 1 and kernel_seconds(flash[0], "bfloat16", profile, free) > kernel_seconds(
        flash[0], "bfloat16", profile)  # 2 x 16 heads x 8 query blocks = 256 blocks: 4 waves on 84 SMs, 3 on 108
    extra_f = 2 * sum(kernel_seconds(k, "bfloat16", profile, free) - kernel_seconds(k, "bfloat16", profile)
                      for k in ks.F if isinstance(k, (Gemm, FlashAttention)))
    costs = model_costs(model, 1, 2, hw, Job(ParallelDims(dp=2), attention="flash"))
    assert costs.sm_share[(0, "F")] == pytest.approx(extra_f + _head_embedding_extra(model, hw, profile, free),
                                                     rel=1e-9)


def _head_embedding_extra(model, hw, profile, free) -> float:
    """The forward GEMMs of the first and last pieces (embedding, head) on `free` SMs, less alone."""
    opts = Job().layer_options(model)
    return sum(kernel_seconds(k, "bfloat16", profile, free) - kernel_seconds(k, "bfloat16", profile)
               for pk in (embedding_kernels(model, 2, opts), head_kernels(model, 2, opts)) for k in pk.F
               if isinstance(k, Gemm))


def test_ddp_bucket_size_needs_overlap_grad_reduce(capsys):
    with pytest.raises(PipesimError, match="--ddp-bucket-size needs --overlap-grad-reduce"):
        CommOptions(ddp_bucket_size=10)
    code = main(["simulate", "1f1b", "-p", "2", "-m", "2", "--model", "gpt", "--ddp-bucket-size", "10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--ddp-bucket-size needs --overlap-grad-reduce" in err[0]


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_the_flags_reach_simulate_and_sweep(command, tmp_path, capsys):
    out = tmp_path / "out.json"
    common = ["--model", "gpt", "--hidden", "512", "--layers", "4", "--heads", "8", "--seq", "256", "--batch", "8",
              "--tp", "2", "--dp", "2", "--hardware", "dgx-h100", "--json", str(out)]
    shape = ["1f1b", "-p", "2", "-m", "4"] if command == "simulate" else ["--schedules", "1f1b", "--stages", "2",
                                                                         "--microbatches", "4"]
    flags = ["--scatter-gather", "--overlap-grad-reduce", "--ddp-bucket-size", "1000", "--blocking-p2p"]
    assert main([command, *shape, *common, *flags]) == 0
    data = json.loads(out.read_text())
    assert data["options"]["scatter_gather"] is True and data["options"]["ddp_bucket_size"] == 1000
    assert data["options"]["blocking_p2p"] is True


def with_comm(costs, options: CommOptions):
    """The same costs with the job's communication switches set to `options`."""
    return replace(costs, job=replace(costs.job, comm=options))
