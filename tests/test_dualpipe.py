"""DualPipe (bidirectional, two model copies): its chains in the IR, the repository's order, the README's
bubble, parameter and activation memory, and the costs of replicated stages."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

import schedules
from pipesim.cost.chain_costs import on_chains
from pipesim.cost.device_profiles import profile_of
from pipesim.cost.model_costs import ParallelCosts
from pipesim.cost.rank_memory import rank_memory
from pipesim.cost.step_costs import StepCosts, step_costs
from pipesim.cost.table import CostTable
from pipesim.errors import PipesimError, ScheduleError
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir import torch_csv
from pipesim.ir.graph import critical_path, overlap_durations
from pipesim.ir.inflight import inflight_by_rank
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Action, Kind, Schedule
from pipesim.ir.schedule_check import validate
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.sim_setup import SimSetup
from pipesim.sim.simulator import simulate


def timed(sched, table):
    return overlap_durations(sched, table.duration, table.overlap_forward_seconds)


@pytest.mark.parametrize("p", [2, 4, 6, 8])
@pytest.mark.parametrize("extra", [0, 2, 6])
def test_readme_bubble_and_makespan_under_uniform_costs(p, extra):
    """F = I = W = 1 per stage, F&B = F + B: every rank works 3m and idles (p/2 - 1)(F&B + B - 3W), the
    DualPipe README's bubble; the simulator agrees with the task graph."""
    m = 2 * p + extra
    sched = schedules.build("dualpipe", p, m)
    table = replace(CostTable.uniform(2 * p, 1.0, 1.0, 1.0), overlap_given=3.0)
    durations = timed(sched, table)
    assert [sum(durations(a) for a in prog) for prog in sched.programs] == [3 * m] * p
    bubble = (p // 2 - 1) * (3 + 2 - 3 * 1)
    assert critical_path(sched, durations).makespan == 3 * m + bubble
    assert simulate(sched, table, comm=False).makespan == 3 * m + bubble


@pytest.mark.parametrize(("fiw", "fb"), [((1.0, 1.0, 1.0), 2.5), ((2.0, 3.0, 1.0), 6.0), ((1.0, 2.0, 1.0), None)])
@pytest.mark.parametrize("p, m", [(4, 8), (4, 12), (6, 14), (8, 16)])
def test_same_timing_as_dualpipev_on_half_the_ranks(fiw, fb, p, m):
    """DualPipe on p ranks is DualPipeV on p/2 (DeepSeek: the V is DualPipe cut in half): with a chunk of the V
    costing a stage here, the makespans are equal under any costs and overlap rule."""
    ours = schedules.build("dualpipe", p, m)
    v = schedules.build("dualpipev", p // 2, m // 2)
    t2 = replace(CostTable.uniform(2 * p, *fiw), overlap_given=fb)
    tv = replace(CostTable.uniform(p, *fiw), overlap_given=fb)
    assert critical_path(ours, timed(ours, t2)).makespan == critical_path(v, timed(v, tv)).makespan
    assert simulate(ours, t2, comm=False).makespan == simulate(v, tv, comm=False).makespan


@pytest.mark.parametrize("p", [2, 4, 6, 8])
def test_activation_memory_is_pp_plus_one_stages_on_every_rank(p):
    for m in (2 * p, 4 * p + 2):
        assert inflight_by_rank(schedules.build("dualpipe", p, m)) == [p + 1] * p


def test_order_is_the_repositorys_eight_steps():
    """DualPipe.step's warm-up: rank r runs (p/2 - h - 1) * 2 forwards of its phase 0 (h = min(r, p-1-r)), then
    h + 1 pairs (phase 0, phase 1); phase 0 is the forward direction on the first half of the ranks."""
    sched = schedules.build("dualpipe", 4, 8)
    assert sched.cells(0)[:4] == ["0F0", "0F1", "0F2", "7F4"]
    assert sched.cells(1)[:4] == ["1F0", "6F4", "1F1", "6F5"]
    assert sched.cells(2)[:4] == ["5F4", "2F0", "5F5", "2F1"]
    assert sched.cells(3)[:4] == ["4F4", "4F5", "4F6", "3F0"]
    # ranks r and p-1-r run one program with the two directions swapped
    for r in range(4):
        kinds = [(sched.model_stage(a.stage), a.kind, a.microbatch % 4) for a in sched.programs[r]]
        twin = [(sched.model_stage(a.stage), a.kind, a.microbatch % 4) for a in sched.programs[3 - r]]
        assert [k[1:] for k in kinds] == [k[1:] for k in twin]
    assert len(sched.overlaps) > 0


def test_chains_place_two_copies_and_route_each_half_of_the_microbatches():
    sched = schedules.build("dualpipe", 4, 8)
    assert sched.num_stages == 8 and sched.chains == 2 and sched.model_stages == 4
    assert [sched.stages_of(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert [sched.model_stage(s) for s in (0, 7, 3, 4)] == [0, 3, 3, 0]
    assert list(sched.microbatch_stages(3)) == [0, 1, 2, 3] and list(sched.microbatch_stages(4)) == [4, 5, 6, 7]
    assert sched.replicas(5) == (1, 5)
    lowered = validate(sched)
    # no transfer between the chains: stage 3 (last of chain 0) and stage 4 (first of chain 1) exchange nothing
    assert not any(a.kind in (Kind.SEND_F, Kind.RECV_B) and a.stage == 3 for prog in lowered.programs for a in prog)
    assert not any(a.kind in (Kind.RECV_F, Kind.SEND_B) and a.stage == 4 for prog in lowered.programs for a in prog)
    assert lowered.chains == 2 and add_p2p(sched).to_dict()["chains"] == 2


def test_a_microbatch_off_its_chain_is_rejected():
    sched = schedules.build("dualpipe", 2, 4)
    bad_prog = (*sched.programs[0], Action(0, Kind.F, 3))  # mb 3 belongs to chain 1 (stages 2, 3)
    bad = sched.with_programs((bad_prog, sched.programs[1]))
    with pytest.raises(ScheduleError, match="microbatch 3 visits stages 2..3 only"):
        validate(bad)
    with pytest.raises(ScheduleError, match="chains must split"):
        validate(Schedule("x", 3, sched.placement, sched.programs, chains=2))


@pytest.mark.parametrize(("p", "m"), [(3, 6), (4, 6), (4, 9)])
def test_builder_refuses_odd_ranks_and_short_or_odd_batches(p, m):
    with pytest.raises(PipesimError, match="dualpipe needs"):
        schedules.build("dualpipe", p, m)


def test_each_rank_holds_two_model_stages_parameters_and_costs():
    """Model mode: a stage costs what its model stage costs, and rank r holds model stages r and p-1-r, twice
    1F1B's parameters on average (the README's 2x)."""
    model = ModelConfig(kind="gpt", hidden=64, heads=4, seq=32, vocab=128, layers=8, batch=16)
    setup = SimSetup(hardware=load_hardware("local-cpu"), model=model, layer_split=(3, 2, 2, 1))
    dual, one = schedules.build("dualpipe", 4, 8), schedules.build("1f1b", 4, 8)
    cd, c1 = setup.costs(dual), setup.costs(one)
    assert cd.layers_per_stage == (3, 2, 2, 1, 3, 2, 2, 1)
    assert [cd.table.stages[s] for s in range(8)] == [c1.table.stages[s % 4] for s in range(8)]
    pd, p1 = [m.parameters for m in rank_memory(dual, cd)], [m.parameters for m in rank_memory(one, c1)]
    assert pd == [p1[r] + p1[3 - r] for r in range(4)]
    assert sum(pd) == 2 * sum(p1)


@pytest.mark.parametrize("name", ["dualpipe", "zb-v"])
def test_a_rank_holding_both_ends_shares_the_tied_head(name):
    """A tied head on a rank that also holds the embedding is that embedding (DeepSeek-V3 report 3.2.3): DualPipe's
    first and last ranks and a V placement's rank 0 hold one h x V matrix less than the two stages' sum; the others
    are unchanged."""
    model = ModelConfig(kind="gpt", hidden=64, heads=4, seq=32, vocab=128, layers=8, batch=16, tied_embeddings=True)
    setup = SimSetup(hardware=load_hardware("local-cpu"), model=model)
    sched = schedules.build(name, 4, 8)
    costs = setup.costs(sched)
    n = sched.model_stages
    sums = [sum(costs.param_counts[s] for s in sched.stages_of(r)) for r in range(sched.num_ranks)]
    shared = [any(sched.model_stage(s) == 0 for s in sched.stages_of(r))
              and any(sched.model_stage(s) == n - 1 for s in sched.stages_of(r)) for r in range(sched.num_ranks)]
    assert costs.embedding_copy_counts[n - 1] == 64 * 128 and sum(shared) == (2 if name == "dualpipe" else 1)
    got = [m.parameters for m in rank_memory(sched, costs)]
    per_param = got[1] // sums[1]  # bytes per parameter (rank 1 holds neither end in either schedule)
    assert got == [(c - 64 * 128 * both) * per_param for c, both in zip(sums, shared, strict=True)]


def test_cost_mode_charges_every_stage_the_full_cost():
    """--cost is one rank's share of the model; a DualPipe stage is a full model stage (not a half chunk)."""
    setup = SimSetup(cost={"F": 1.0, "I": 1.0, "W": 1.0})
    table = setup.costs(schedules.build("dualpipe", 4, 8)).table
    assert table.num_stages == 8 and {(c.forward, c.backward_input) for c in table.stages} == {(1.0, 1.0)}
    assert setup.run(schedules.build("dualpipe", 4, 8)).makespan == 26.0


def test_torch_csv_round_trip_recovers_the_chains():
    """torch's CSV has no column for chains: loading infers them from where each microbatch runs."""
    sched = schedules.build("dualpipe", 4, 8)
    for form in (sched, add_p2p(sched)):
        back = torch_csv.loads(torch_csv.dumps(form))
        assert back.chains == 2 and back.programs == form.programs and back.overlaps == form.overlaps
    assert torch_csv.loads(torch_csv.dumps(schedules.build("1f1b", 4, 8))).chains == 1


def _costs_with_step(sched, hw, counts, *, step: bool, dp: int = 1, zero: int = 0):
    """F = I = W = 1 ms per stage, F&B = 2.5 ms, 1 MB messages, `counts` parameters per model stage (bf16 mixed
    precision); with `step` the optimizer and the replicas' swap are simulated (pipesim.sim.step)."""
    n = sched.model_stages
    table = replace(CostTable.uniform(n, 1e-3, 1e-3, 1e-3, boundary_bytes=1_000_000), overlap_given=2.5e-3)
    job = Job(ParallelDims(dp=dp), zero=zero)
    costs = ParallelCosts(table=table, job=job, tp_collectives={}, dp_grad_bytes=(0,) * n,
                          layers_per_stage=(0,) * n, dtype_bytes=2, param_counts=tuple(counts), precision="mixed",
                          step=step_costs(counts, job, hw=hw, precision="mixed") if step else None)
    return on_chains(costs, sched)


def test_replicas_swap_their_gradients_before_the_optimizer():
    """Rank r and rank p-1-r hold the two copies of model stages r and p-1-r: once both have run their programs,
    they swap those stages' gradients in one message each way (latency + bytes / bandwidth over NVLink), then
    each runs its optimizer (Megatron's passes: 46 bytes per bf16-mixed parameter, memory-bound kernels). The
    pipeline's span does not move; the step ends later by exactly the swap and the optimizer."""
    p, m = 4, 8
    hw = load_hardware("dgx-h100")
    sched = schedules.build("dualpipe", p, m)
    counts = [1_000_000 * (k + 1) for k in range(p)]  # parameters per model stage
    result = simulate(sched, _costs_with_step(sched, hw, counts, step=True), hw)
    plain = simulate(sched, _costs_with_step(sched, hw, counts, step=False), hw)
    assert result.makespan == plain.makespan and plain.step_time == plain.makespan
    link = hw.link_between(0, 1)
    prof = profile_of(hw.device.family)
    swaps = [c for c in result.collectives if c.phase == "replicas"]
    assert sorted((c.rank, c.kind, c.nbytes) for c in swaps) == sorted(
        (r, "send_recv", (counts[r] + counts[p - 1 - r]) * 2) for r in range(p))
    finish = [plain.ends[r][-1] for r in range(p)]
    for r in range(p):
        nbytes = (counts[r] + counts[p - 1 - r]) * 2  # bytes: bf16 gradients of both model stages
        begin = max(finish[r], finish[p - 1 - r])
        swap = next(c for c in swaps if c.rank == r)
        assert (swap.start, swap.end) == (begin, begin + (link.latency + nbytes / link.bandwidth))
        end = result.step_ends[r]
        assert end.optimizer_start == swap.end
        # Megatron's bf16-mixed step, 16-bit grads and no loss scale: main-grad copy 6, norm 4, Adam 28, copy
        # back 6, zeroing 2 = 46 bytes per parameter, 5 memory-bound kernels per model stage
        adam = sum(46 * counts[k] / (hw.device.hbm_bandwidth * prof.memory_bound_efficiency) + 5 * prof.kernel_overhead
                   for k in (r, p - 1 - r))  # seconds
        assert end.optimizer == pytest.approx(adam, rel=1e-12)
    assert result.step_time == max(e.step_end for e in result.step_ends) > result.makespan
    row = result.to_dict()
    assert row["schedule"]["virtual"] == 1 and result.timeline().meta["v"] == 1  # p chunks over p ranks
    assert [r["replica_exchange"] for r in row["ranks"]] == [next(c.end - c.start for c in swaps if c.rank == r)
                                                             for r in range(p)]
    assert {c["phase"] for c in row["collectives"]} == {"replicas"}


def test_no_swap_without_step_costs_or_links():
    """A CPU preset without --zero models no step (today's figures, bit for bit), and without links nothing is timed."""
    model = ModelConfig(kind="gpt", hidden=64, heads=4, seq=32, vocab=128, layers=8, batch=16)
    cpu = SimSetup(hardware=load_hardware("local-cpu"), model=model).run(schedules.build("dualpipe", 4, 8))
    assert cpu.collectives == [] and cpu.step_ends == [] and cpu.step_time == cpu.makespan
    hw = load_hardware("dgx-h100")
    sched = schedules.build("dualpipe", 4, 8)
    quiet = simulate(sched, _costs_with_step(sched, hw, [10**6] * 4, step=True), hw, comm=False)
    assert quiet.collectives == [] and [e.optimizer_start for e in quiet.step_ends] == [
        quiet.ends[r][-1] for r in range(4)]


def test_zero_swaps_the_shard_after_the_reduce_scatter():
    """ZeRO 1 over dp = 2: each rank holds half its gradients after the reduce_scatter, and swaps that half."""
    p, hw = 4, load_hardware("dgx-h100")
    sched = schedules.build("dualpipe", p, 8)
    counts = [1_000_001] * p  # odd: the shard is ceil(P / dp)
    result = simulate(sched, _costs_with_step(sched, hw, counts, step=True, dp=2, zero=1), hw)
    swaps = [c for c in result.collectives if c.phase == "replicas"]
    assert {c.nbytes for c in swaps} == {2 * 500_001 * 2}  # two stages' shards of bf16 gradients
    for c in swaps:
        partner = p - 1 - c.rank
        grads = [g.end for g in result.collectives if g.rank in (c.rank, partner) and g.phase == "grads"]
        assert len(grads) == 4 and c.start == max([*grads, result.ends[c.rank][-1], result.ends[partner][-1]])
        gathers = [g for g in result.collectives if g.rank == c.rank and g.phase == "params"]
        assert gathers and min(g.start for g in gathers) >= result.step_ends[c.rank].optimizer_end > c.end


def test_on_chains_spreads_every_per_stage_figure():
    """Each per-stage tuple and (stage, kind)-keyed table of ParallelCosts and StepCosts, read off their fields,
    comes back with one entry per schedule stage, its model stage's (a field on_chains forgot would stay short:
    Muon's states and the SMs a DP collective takes once were)."""
    sched = schedules.build("dualpipe", 4, 8)
    n = sched.model_stages
    table = CostTable.uniform(n, 1e-3, 1e-3, 1e-3, boundary_bytes=1)
    values = {}
    for f in fields(ParallelCosts):
        if f.type.startswith("tuple"):
            values[f.name] = tuple(range(n))
        elif f.type.startswith("dict"):
            values[f.name] = {(s, "F"): s for s in range(n)}
    step = StepCosts(**{f.name: tuple(range(n)) for f in fields(StepCosts) if f.type.startswith("tuple")})
    spread = on_chains(ParallelCosts(table=table, job=Job(), step=step, **values), sched)
    stages = range(sched.num_stages)
    for name, value in values.items():
        expect = tuple(sched.model_stage(s) for s in stages) if isinstance(value, tuple) else \
            {(s, "F"): sched.model_stage(s) for s in stages}
        assert getattr(spread, name) == expect, name
    for f in fields(StepCosts):
        if f.type.startswith("tuple"):
            assert getattr(spread.step, f.name) == tuple(sched.model_stage(s) for s in stages), f.name
    assert len(spread.table.stages) == sched.num_stages
