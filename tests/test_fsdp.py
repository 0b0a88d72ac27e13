"""ZeRO 3 as FSDP2 runs it (pipesim.model.fsdp): torchtitan's resharding policy, the units gathered at the peak, and
the simulated gathers and reduce-scatters, in exact times on the dyadic toy machine of test_step_costs."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
import tomllib

import schedules
from pipesim.cli import main
from pipesim.cost.model_costs import ParallelCosts, model_costs
from pipesim.cost.rank_memory import rank_memory
from pipesim.cost.step_costs import StepCollective, StepCosts, stage_step_collectives
from pipesim.cost.table import CostTable
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.fsdp import FsdpPolicy, fsdp_policy, gathered_seconds, resident_fraction
from pipesim.model.memory import step_peak_state
from pipesim.model.param_counts import stage_params
from pipesim.parallel_dims import ParallelDims
from pipesim.plan.memory_bound import MemoryBound
from pipesim.plan.space import Candidate
from pipesim.sim.simulator import simulate
from tests.test_step_costs import GB, toy

RESHARD, KEEP = FsdpPolicy(True, True), FsdpPolicy(False, True)  # no pipelining: always / default, never


def test_torchtitans_policy_table():
    """torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy; without pipelining FSDP2 also frees
    after every backward (torchtitan's accumulation loop), with it torch.distributed.pipelining keeps the chunk."""
    assert fsdp_policy("default", 1) == RESHARD and fsdp_policy("always", 1) == RESHARD
    assert fsdp_policy("never", 1) == KEEP
    assert fsdp_policy("default", 4) == FsdpPolicy(False, False) == fsdp_policy("never", 8)
    assert fsdp_policy("always", 2) == FsdpPolicy(True, False)
    assert fsdp_policy("default", 4).once_per_step and not fsdp_policy("always", 2).once_per_step
    with pytest.raises(PipesimError, match="unknown --fsdp-reshard-after-forward 'sometimes'"):
        fsdp_policy("sometimes", 1)


def test_resident_units_and_the_unit_by_unit_gather():
    assert resident_fraction(KEEP, 34) == 1.0 and resident_fraction(RESHARD, 34) == 2 / 34
    assert resident_fraction(RESHARD, 1) == 1.0
    # a gather of 0.5 s in 4 units beside a 4 s compute: the first unit's eighth of a second, then all of it
    assert gathered_seconds(0.0, 0.0, 0.5, 4.0, 4) == 4.125
    # a gather longer than the compute: its end, then the last unit's share
    assert gathered_seconds(0.0, 0.0, 4.0, 1.0, 4) == 4.25
    # one unit: the whole gather, then the whole compute; a gather queued behind another starts later
    assert gathered_seconds(1.0, 1.5, 2.0, 1.0, 1) == 2.0
    assert gathered_seconds(0.0, 0.0, 0.0, 3.0, 8) == 3.0
    P = 8_000_000  # the peak holds the shard plus 2 of 16 units, not the whole chunk
    assert step_peak_state(P, dp=8, zero=3, resident=2 / 16).parameters == 2 * (P // 8 + P // 8)
    with pytest.raises(PipesimError, match="resident fraction"):
        step_peak_state(P, dp=8, zero=3, resident=0.0)


def test_step_collectives_follow_the_policy():
    p = 1000
    once = (StepCollective("all_gather", 2 * p, "forward"), StepCollective("reduce_scatter", 2 * p, "grads"))
    assert stage_step_collectives(p, dp=4, zero=3, fsdp=FsdpPolicy(False, False)) == once
    assert stage_step_collectives(p, dp=4, zero=3, fsdp=RESHARD) == (
        StepCollective("all_gather", 2 * p, "gather"), StepCollective("reduce_scatter", 2 * p, "microbatch"))
    assert stage_step_collectives(p, dp=4, zero=3, fsdp=FsdpPolicy(True, False)) == (
        StepCollective("all_gather", 2 * p, "gather"), StepCollective("reduce_scatter", 2 * p, "grads"))


def _fsdp_costs(stages: int, layers: int, policy: FsdpPolicy, phase: str) -> ParallelCosts:
    """F = 1 s, B = 2 s; each chunk 2^30 bytes gathered (0.5 s over 2 ranks) and reduced."""
    z3 = (StepCollective("all_gather", GB, "gather"), StepCollective("reduce_scatter", GB, phase))
    step = StepCosts((z3,) * stages, (0.0,) * stages, (0,) * stages, zero=3, fsdp=policy)
    return ParallelCosts(CostTable.uniform(stages, 1.0, 1.0, 1.0), Job(ParallelDims(dp=2), zero=3),
                         tp_collectives={}, dp_grad_bytes=(0,) * stages, layers_per_stage=(layers,) * stages,
                         step=step)


def test_without_pipelining_every_forward_and_backward_gathers_and_every_backward_reduces():
    """One stage of 2 layers (4 units with the embedding and head), m = 2. F0: its gather runs 0-0.5 s, the
    compute waits for the first unit (1/8 s): 0-1.125. B0 gathers again (1.125-1.625): 1.125-3.25, reducing
    unit by unit as it passes them (each 1/8 s). F1's gather queues behind the last unit's reduce (3.375)."""
    result = simulate(schedules.build("1f1b", 1, 2), _fsdp_costs(1, 2, RESHARD, "microbatch"), toy())
    assert list(zip(result.starts[0], result.ends[0])) == [(0.0, 1.125), (1.125, 3.25), (3.25, 4.5), (4.5, 6.625)]
    rows = [(c.kind, c.start, c.end) for c in result.collectives]
    unit = 2.125 / 4  # B's seconds per unit
    assert rows == [("all_gather", 0.0, 0.5), ("all_gather", 1.125, 1.625),
                    *[("reduce_scatter", 1.125 + k * unit, 1.125 + k * unit + 0.125) for k in (1, 2, 3)],
                    ("reduce_scatter", 3.25, 3.375), ("all_gather", 3.375, 3.875), ("all_gather", 4.5, 5.0),
                    *[("reduce_scatter", 4.5 + k * unit, 4.5 + k * unit + 0.125) for k in (1, 2, 3)],
                    ("reduce_scatter", 6.625, 6.75)]
    (end,) = result.step_ends
    assert end.gate_wait == 0.125 + 0.125 + 0.25 + 0.125 and end.optimizer_start == 6.75
    # "never": kept from the forward to the backward, so only the forwards gather
    kept = simulate(schedules.build("1f1b", 1, 2), _fsdp_costs(1, 2, KEEP, "microbatch"), toy())
    assert [c.after for c in kept.collectives if c.kind == "all_gather"] == [0, 2]


def test_with_pipelining_always_gathers_each_freed_chunk_and_reduces_once():
    """1F1B, p = 2, m = 4, reshard after forward only: a forward frees its chunk, a backward keeps it, so a
    forward right after a backward finds it gathered; gradients are reduced after the last backward."""
    result = simulate(schedules.build("1f1b", 2, 4), _fsdp_costs(2, 3, FsdpPolicy(True, False), "grads"), toy(8))
    programs = result.schedule.programs
    gathers = [[str(programs[r][c.after]) for c in result.collectives if c.rank == r and c.kind == "all_gather"]
               for r in (0, 1)]
    assert gathers == [["0F0", "0F1", "0B0", "0B1", "0B2"], ["1F0", "1B0", "1B1", "1B2", "1B3"]]
    last_b = {r: max(i for i, a in enumerate(programs[r]) if str(a).startswith(f"{r}B")) for r in (0, 1)}
    assert all(c.after == last_b[c.rank] for c in result.collectives if c.kind == "reduce_scatter")


def test_model_memory_holds_two_units_without_pipelining():
    """A 4-layer model on one stage, dp 8: default (reshard) holds the shard and 2 of its 6 units gathered,
    never the whole chunk; with pipelining the default keeps its chunks gathered (the step's prefetch)."""
    hw = load_hardware("2x-dgx-h100")
    model = ModelConfig(kind="gpt", hidden=1024, heads=16, seq=1024, layers=4, vocab=32000, batch=32,
                        dtype="bfloat16")
    params = stage_params(model, 1, layers=4, first=True, last=True)
    sched = schedules.build("1f1b", 1, 2)
    for reshard, resident in (("default", round(params * 2 / 6)), ("never", params)):
        job = Job(ParallelDims(dp=8), zero=3, fsdp_reshard=reshard)
        (mem,) = rank_memory(sched, model_costs(model, 1, 2, hw, job))
        assert mem.parameters == 2 * (-(-params // 8) + resident)
    costs = model_costs(model, 2, 4, hw, Job(ParallelDims(pp=2, dp=8), zero=3))
    assert [c.phase for c in costs.step.collectives[0]] == ["forward", "grads"]


def test_the_flag_needs_zero_3_and_is_reported():
    with pytest.raises(PipesimError, match="needs FSDP's sharded parameters"):
        Job(ParallelDims(dp=2), zero=1, fsdp_reshard="always")
    base = [sys.executable, "-m", "pipesim", "simulate", "1f1b", "--stages", "1", "--microbatches", "2",
            "--model", "gpt", "--hidden", "512", "--layers", "2", "--heads", "8", "--seq", "256", "--batch", "8",
            "--dp", "4", "--hardware", "dgx-h100"]
    bad = subprocess.run(base + ["--zero", "2", "--fsdp-reshard-after-forward", "never"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "pipesim: error: --fsdp-reshard-after-forward never needs FSDP's sharded parameters (--zero 3), got --zero 2"]
    ok = subprocess.run(base + ["--zero", "3", "--fsdp-reshard-after-forward", "never", "--json"],
                        capture_output=True, text=True, check=True)
    assert json.loads(ok.stdout)["options"]["fsdp_reshard_after_forward"] == "never"


def test_the_plans_fsdp_export_is_what_it_simulated(tmp_path, capsys):
    """plan --zero 3 on 4 GPUs without pipelining: the torchtitan export names the resharding pipesim timed, and
    the exported simulate command reproduces the planned step and peak memory."""
    out = tmp_path / "plan.json"
    argv = ["plan", "--model", "gpt", "--hidden", "512", "--layers", "8", "--heads", "8", "--seq", "512", "--vocab",
            "8000", "--batch", "16", "--dtype", "bfloat16", "--hardware", "dgx-h100", "--gpus", "4", "--schedules",
            "1f1b", "--zero", "3", "--recompute", "none", "--max-tp", "1", "--json", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    data = json.loads(out.read_text())
    winner = data["rows"][0]
    assert (winner["zero"], winner["pp"]) == (3, 1)
    assert tomllib.loads(data["winner"]["torchtitan_toml"])["parallelism"]["fsdp_reshard_after_forward"] == "default"
    assert main(shlex.split(data["winner"]["simulate_command"])[1:] + ["--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["step_time"] == winner["step_time"]
    assert max(r["total"] for r in sim["memory"]["ranks"]) == winner["peak_memory"]


@pytest.mark.parametrize("p", [1, 2])
def test_the_planners_memory_bound_counts_the_same_units(p):
    """The planner's lower bound holds the same FSDP units as rank_memory (pipesim.model.fsdp.fsdp_units): its model
    state never exceeds the simulated peak, resharded (p = 1) or kept gathered (p = 2)."""
    hw = load_hardware("2x-dgx-h100")
    model = ModelConfig(kind="gpt", hidden=1024, heads=16, seq=1024, layers=4, vocab=32000, batch=32,
                        dtype="bfloat16")
    shared = Job(attention="flash")
    c = Candidate("1f1b", p, 1, 1, 8, 1, 4, "none", 3)
    costs = model_costs(model, p, 4, hw, c.job(shared))
    peak = max(m.total for m in rank_memory(schedules.build("1f1b", p, 4), costs))
    assert MemoryBound(model, shared).bound(c) <= peak
