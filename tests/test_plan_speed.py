"""The planner's speed-ups stay exact: the memory lower bound never exceeds `rank_memory`'s peak (so pruning
by it drops nothing that fits), each family's in-flight closed form and placement match the built schedules,
the estimate's per-chunk seconds are model_costs', a process pool gives the serial result, published
layouts are in the space, and the winner's CSV runs in torch's runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import schedules
from pipesim.cli import main
from pipesim.cost.model_costs import model_costs
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir import torch_csv
from pipesim.ir.deps import releases_activations
from pipesim.ir.schedule import Kind
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.parallel_dims import ParallelDims
from pipesim.plan.evaluate import Evaluator
from pipesim.plan.memory_bound import first_rank_inflight, rank_chunks
from pipesim.plan.search import plan
from pipesim.plan.space import Candidate, PlanRequest, admits, enumerate_candidates
from tests.launch_shared import register_call
from tests.plan_checks import bounds_hold

SMALL = ModelConfig(kind="gpt", hidden=256, layers=12, heads=8, seq=256, vocab=4000, batch=48, dtype="bfloat16")


def _configs():
    for name in schedules.names():
        vs = (2, 3) if schedules.spec(name).virtual else (1,)
        for v in vs:
            for p in (2, 3, 4):
                for m in (1, 2, p - 1, p, p + 1, 2 * p, 3 * p):
                    if m >= 1 and admits(name, p, m, v):
                        yield name, p, m, v


def _peak_count(sched, rank=0) -> int:
    live = best = 0
    for a in sched.programs[rank]:
        if a.kind == Kind.F:
            live += 1
            best = max(best, live)
        if releases_activations(a.kind):
            live -= 1
    return best


@pytest.mark.parametrize("name, p, m, v", sorted(set(_configs())))
def test_inflight_closed_form_and_placement_match_the_built_schedule(name, p, m, v):
    try:  # the arithmetic pre-filter (space.admits) let it through, so the builder must take it
        sched = schedules.build(name, p, m, v)
    except PipesimError as exc:
        pytest.fail(f"admits({name}, p={p}, m={m}, v={v}) but the builder refuses: {exc}")
    assert first_rank_inflight(name, p, m, v) <= _peak_count(sched)
    held = rank_chunks(name, p, v)
    if held is not None:
        assert held == [[sched.model_stage(s) for s in sched.stages_of(r)] for r in range(p)]


def test_memory_bound_never_exceeds_the_exact_peak():
    req = PlanRequest(SMALL, load_hardware("dgx-h100").with_nodes(1), 8, sequence_parallel=(True, False),
                      zeros=(0, 1, 2, 3))
    # mbs 1 and 6 keep the test to seconds (6 reaches the m < p cases); ZeRO 1 and 3 bracket 2
    checked = bounds_hold(req, lambda c: c.mbs in (1, 6) and c.zero != 2)
    for c, bound, peak in checked:
        if c.p == 1 and c.recompute == "none":
            assert bound == peak  # one stage, no recompute working set: the bound is the peak
    assert len(checked) > 300


@pytest.mark.parametrize("t, mbs, recompute, sp", [(1, 2, "none", False), (2, 4, "full", True),
                                                   (4, 1, "selective", False)])
def test_chunk_seconds_follow_model_costs_per_stage(t, mbs, recompute, sp):
    req = PlanRequest(SMALL, load_hardware("dgx-h100"), 8)
    ev = Evaluator(req)
    for p, v in ((1, 1), (2, 1), (4, 2), (5, 1), (3, 3)):  # even and uneven cuts
        c = Candidate("1f1b" if v == 1 else "interleaved-1f1b", p, v, t, 8 // (t * p) or 1, mbs,
                      SMALL.batch // mbs, recompute, 0, sp)
        job = Job(ParallelDims(tp=t), recompute=recompute, sp=sp, attention=ev.attention)
        costs = model_costs(SMALL, p * v, SMALL.batch // mbs, req.hardware, job)
        direct = [s.forward + s.backward_input + s.backward_weight for s in costs.table.stages]
        assert ev.chunk_seconds(c) == pytest.approx(direct, rel=1e-9)  # affine in the layers


def test_process_pool_gives_the_serial_result():
    req = PlanRequest(SMALL, load_hardware("dgx-h100"), 8, ("1f1b", "interleaved-1f1b", "zb-h1", "zb-v"))
    serial = plan(req, max_candidates=40, progress=False, workers=1)
    pooled = plan(req, max_candidates=40, progress=False, workers=2)
    assert [r.to_dict() for r in pooled.rows] == [r.to_dict() for r in serial.rows]
    assert pooled.counts == {**serial.counts, "schedules_built": pooled.counts["schedules_built"]}
    assert len(serial.rows) == 40


def test_included_candidate_is_simulated_even_past_the_cap():
    req = PlanRequest(SMALL, load_hardware("dgx-h100"), 8, ("1f1b", "gpipe"))
    slow = Candidate("gpipe", 8, 1, 1, 1, 1, 48, "full", 0)
    result = plan(req, max_candidates=3, progress=False, include=(slow,))
    assert slow in [r.candidate for r in result.rows] and len(result.rows) == 3
    assert slow not in [r.candidate for r in plan(req, max_candidates=3, progress=False).rows]
    with pytest.raises(PipesimError, match="not in the search space"):
        plan(req, progress=False, include=(Candidate("zb-v", 4, 2, 1, 2, 1, 24, "none", 0),))


NAR21_76B = ModelConfig(kind="gpt", hidden=10240, layers=60, heads=80, seq=2048, vocab=51200, batch=1792,
                        dtype="float16")


def test_published_layouts_are_in_the_space():
    """NAR21's 76B (interleaved, v 3, t 8 without sequence parallelism, full recompute) and Llama 3 405B's
    p 16 over 126 layers (uneven) are candidates."""
    req = PlanRequest(NAR21_76B, load_hardware("dgx-a100").with_nodes(128), 1024, sequence_parallel=(True, False))
    assert Candidate("interleaved-1f1b", 4, 3, 8, 32, 2, 28, "full", 0, False) in set(enumerate_candidates(req))
    llama = ModelConfig(kind="gpt", hidden=16384, layers=126, heads=128, seq=8192, vocab=128256, batch=2048,
                        dtype="bfloat16", kv_heads=8, ffn_hidden=53248)
    req = PlanRequest(llama, load_hardware("dgx-h100").with_nodes(2048), 16384, ("1f1b",), zeros=(1,))
    assert Candidate("1f1b", 16, 1, 8, 128, 1, 16, "none", 1, True) in set(enumerate_candidates(req))


# 2 GPUs, an odd batch (no data parallelism), tp 1: the winner is a 2-stage pipeline
WINNER_PLAN = ["plan", "--model", "gpt", "--hidden", "64", "--layers", "4", "--heads", "2", "--seq", "64", "--vocab",
               "500", "--batch", "3", "--dtype", "bfloat16", "--hardware", "dgx-h100", "--gpus", "2", "--max-tp", "1",
               "--schedules", "1f1b,interleaved-1f1b,zb-h1", "--workers", "1"]


def winner_in_torch_runtime_on_rank(folder) -> None:
    """Rank side, in the session's shared 2-rank launch (tests/launch_shared.py): rank 0 makes the same plan as the
    test (the planner is deterministic) and exports its winner's CSV; every rank steps that CSV in torch's runtime
    (tests/workers/torch_runtime_csv.py); rank 0 writes the result to out.json."""
    import torch.distributed as dist

    from tests.workers.torch_runtime_csv import run_case

    folder = Path(folder)
    if dist.get_rank() == 0:
        code = main([*WINNER_PLAN, "--export-csv", str(folder / "winner.csv"), "--json", str(folder / "plan.json")])
        assert code == 0, code
    dist.barrier()
    best = json.loads((folder / "plan.json").read_text())["rows"][0]
    result = run_case(str(folder / "winner.csv"), best["virtual"], best["microbatches"])
    if dist.get_rank() == 0:
        (folder / "out.json").write_text(json.dumps(result))


WINNER_IN_TORCH = register_call("plan_winner_torch_runtime", 2, f"{__name__}:winner_in_torch_runtime_on_rank")


def test_exported_csv_runs_in_torch_runtime(tmp_path, capsys, shared_launches):
    """2 GPUs, an odd batch (no data parallelism), tp 1: the winner is a 2-stage pipeline; its CSV is the
    schedule the plan simulated and torch's runtime steps it to the unsplit model's loss."""
    csv_path, out = tmp_path / "winner.csv", tmp_path / "plan.json"
    assert main([*WINNER_PLAN, "--export-csv", str(csv_path), "--json", str(out)]) == 0
    capsys.readouterr()
    best = json.loads(out.read_text())["rows"][0]
    sched = torch_csv.load(csv_path)
    assert (sched.num_ranks, sched.num_microbatches) == (best["pp"], best["microbatches"]) == (2, best["microbatches"])
    built = schedules.build(best["schedule"], 2, best["microbatches"], best["virtual"])
    assert sched.programs == built.programs
    # torch's runtime steps this very CSV: the shared launch's rank 0 planned the same winner, byte for byte
    d = shared_launches.case(WINNER_IN_TORCH).check()
    assert (d / "winner.csv").read_bytes() == csv_path.read_bytes()
    got = json.loads((d / "out.json").read_text())
    assert got["world"] == 2
    assert got["loss_sum"] == pytest.approx(got["expected"], rel=1e-5)


def test_plot_marks_the_pareto_front(tmp_path, capsys):
    from pipesim.plots.plan_figure import plan_front  # local import: plotly, only this test

    html = tmp_path / "plan.html"
    assert main(["plan", "--model", "gpt", "--hidden", "128", "--layers", "4", "--heads", "4", "--seq", "128",
                 "--vocab", "1000", "--batch", "8", "--dtype", "bfloat16", "--hardware", "dgx-h100", "--gpus", "4",
                 "--max-candidates", "30", "--plot", str(html), "--json", str(tmp_path / "p.json"),
                 "--top", "30", "--workers", "1"]) == 0
    capsys.readouterr()
    text = html.read_text()
    assert "Pareto front" in text and "winner" in text and "peak memory per GPU (GiB)" in text
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    front = plan_front(rows)
    for r in rows:  # every row is on the front or dominated by a row on it
        assert r in front or any(f["tokens_per_s"] >= r["tokens_per_s"] and f["peak_memory"] <= r["peak_memory"]
                                 for f in front)
    fastest = max(rows, key=lambda r: r["tokens_per_s"])
    assert fastest["tokens_per_s"] == max(f["tokens_per_s"] for f in front)
