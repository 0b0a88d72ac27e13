"""CSV and action-notation interop with torch.distributed.pipelining, both directions."""

from __future__ import annotations

import json

import pytest
from torch.distributed.pipelining import schedules as torch_schedules
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

import schedules
from pipesim.errors import PipesimError, ScheduleError
from pipesim.ir import torch_csv
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Action
from pipesim.ir.schedule_check import fifo_mismatches, validate
from tests.launch_shared import register_call


def configs():
    for name in schedules.names():
        v = 2 if schedules.spec(name).virtual else 1
        for p, m in [(2, 4), (3, 6), (4, 8)]:
            if name == "dualpipe" and p % 2:  # two directions meet in the middle: p even only
                continue
            yield name, p, m, v


@pytest.mark.parametrize("name, p, m, v", list(configs()))
def test_round_trip(name, p, m, v):
    sched = schedules.build(name, p, m, v)
    for form in (sched, add_p2p(sched)):
        back = torch_csv.loads(torch_csv.dumps(form))
        assert back.programs == form.programs
        assert back.placement == form.placement
        assert back.num_microbatches == m


@pytest.mark.parametrize("name, p, m, v", list(configs()))
def test_torch_parses_validates_and_dry_runs_our_csv(name, p, m, v):
    sched = schedules.build(name, p, m, v)
    if sched.chains > 1:
        pytest.skip("torch's runtime sends every microbatch through every stage: no two-chain DualPipe")
    parsed = {r: [torch_schedules._Action.from_str(c) for c in row.split(",")]
              for r, row in enumerate(torch_csv.dumps(sched).splitlines())}
    stage_to_rank = torch_schedules._validate_schedule(parsed, p, p * v, m)
    assert [stage_to_rank[s] for s in range(p * v)] == list(sched.placement)
    lowered = {r: [part for c in row.split(",") for part in _expanded(torch_schedules._Action.from_str(c))]
               for r, row in enumerate(torch_csv.dumps(add_p2p(sched)).splitlines())}
    # torch's dry run raises "Schedule is not progressing" on a hang (it cannot step an OVERLAP_F_B,
    # so an overlapped pair runs as its two sub-actions, which lowering keeps adjacent)
    torch_schedules._simulate_comms_compute(lowered, lambda s: sched.placement[s], p * v)


def _expanded(action):
    """torch's OVERLAP_F_B action as its sub-actions; any other action as itself."""
    return list(action.sub_actions) if action.sub_actions else [action]


TORCH_GENERATED = ["GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]


# torch's get_schedule_ops cannot lower single-stage schedules (GPipe) without a process group
GENERATED_CASES = [(n, False) for n in TORCH_GENERATED] + [(n, True) for n in TORCH_GENERATED if n != "GPipe"]


@pytest.mark.parametrize("torch_name, with_comms", GENERATED_CASES)
def test_torch_generated_schedules_load_and_validate(torch_name, with_comms):
    ops = get_schedule_ops(torch_name, 4, 8, with_comms=with_comms)
    text = "\n".join(",".join("" if a is None else str(a) for a in row) for row in ops)
    sched = torch_csv.loads(text, torch_name)
    validate(sched)
    assert sched.num_ranks == 4 and sched.num_microbatches == 8
    if with_comms:
        assert sched.has_comms and fifo_mismatches(sched) == []
        assert sched.meta["ignored_actions"] > 0  # UNSHARD / RESHARD bookkeeping dropped
    if torch_name == "ZBVZeroBubble":
        assert sched.placement == (0, 1, 2, 3, 3, 2, 1, 0)  # V-shaped placement


def test_torch_1f1b_pipeline_order_off_by_one_is_caught():
    """torch 2.13's Schedule1F1B.pipeline_order lists F1..F(m) on the last rank (a known trap)."""
    ops = get_schedule_ops("1F1B", 4, 8)
    text = "\n".join(",".join("" if a is None else str(a) for a in row) for row in ops)
    with pytest.raises(ScheduleError, match="is missing"):
        validate(torch_csv.loads(text, "1F1B"))


@pytest.mark.parametrize(
    "text, message",
    [
        ("0F0,0X1\n", "row 1, column 2: malformed action '0X1'"),
        ("0F0,0B0\n0F1,0B1\n", "stage 0 appears on rank 0 and rank 1"),
        ("2F0,2B0\n", "stage 0 has no actions"),
        ("\n\n", "no actions found"),
    ],
)
def test_malformed_csv(text, message):
    with pytest.raises(PipesimError, match=message):
        torch_csv.loads(text, "bad.csv")


def test_overlap_cells_expand():
    assert torch_csv.parse_cell("(0F3;3B1)OVERLAP_F_B") == [Action.parse("0F3"), Action.parse("3B1")]
    assert torch_csv.parse_cell("0UNSHARD") == []


EXPORTED = [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("dualpipev", 2), ("interleaved-zb", 2),
            ("zb-auto", 1), ("v-half", 2)]


TORCH_RUNTIME = register_call("torch_interop", 2, "tests.workers.torch_runtime_csv:exported_on_rank",
                              [list(e) for e in EXPORTED], 4)  # m = 4, in the session's shared 2-rank launch


@pytest.fixture(scope="module")
def torch_runtime_results(shared_launches) -> dict:
    """Every EXPORTED schedule's CSV stepped in torch's runtime, one result per schedule (tests/launch_shared.py)."""
    return json.loads((shared_launches.case(TORCH_RUNTIME).check() / "out.json").read_text())


@pytest.mark.dist
@pytest.mark.parametrize("name", [name for name, _ in EXPORTED])
def test_exported_csv_runs_in_torch_runtime(torch_runtime_results, name):
    """A schedule designed here loads in torch's _PipelineScheduleRuntime and computes the right loss."""
    result = torch_runtime_results[name]
    assert result["world"] == 2
    assert result["loss_sum"] == pytest.approx(result["expected"], rel=1e-5)
