"""interleaved-zb (torch's ScheduleInterleavedZeroBubble): torch's order, ZB1P's closed form exactly."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

import schedules
from pipesim.cli import main
from pipesim.cost.table import CostTable
from pipesim.cost.zb_auto_costs import MemoryLimit, parse_memory_limit
from pipesim.errors import PipesimError
from pipesim.ir import torch_csv
from pipesim.ir.graph import critical_path
from pipesim.ir.inflight import inflight_by_rank
from pipesim.ir.schedule import Kind
from pipesim.ir.schedule_check import validate
from pipesim.sim.simulator import simulate
from schedules.zb_auto import AutoCosts, zb_auto_schedule


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (3, 6, 3), (4, 8, 2), (4, 6, 2), (5, 15, 2), (4, 12, 3)])
def test_interleaved_zb_is_torchs_order(p, m, v):
    ops = get_schedule_ops("InterleavedZeroBubble", p, m, num_stages_per_rank=v)
    theirs = torch_csv.parse_rows([[str(a) for a in row if a is not None] for row in ops], "torch")
    ours = schedules.build("interleaved-zb", p, m, v)
    assert theirs.programs == ours.programs and theirs.placement == ours.placement
    validate(ours)
    table = CostTable.uniform(p * v, 1.0, 2.0, 1.0)
    assert simulate(theirs, table, comm=False).makespan == simulate(ours, table, comm=False).makespan


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 4), st.integers(2, 3),
       st.sampled_from([(1, 1, 1), (2, 2, 1), (1, 2, 1), (3, 2, 2)]))
def test_interleaved_zb_closed_form(p, k, v, chunk_costs):
    """Per-chunk (t_F, t_I, t_W), m a multiple of p: m v (t_F + t_I + t_W) + (p - 1)(t_F + t_I - t_W), the
    DualPipe README's ZB1P bubble (PP-1)(F + B - 2W) with B = I + W; every rank holds v p chunk
    activations (1F1B's p stages)."""
    f, i, w = chunk_costs
    m = k * p
    sched = schedules.build("interleaved-zb", p, m, v)
    cost = {Kind.F: f, Kind.I: i, Kind.W: w}
    assert critical_path(sched, lambda a: cost.get(a.kind, 0)).makespan == m * v * (f + i + w) + (p - 1) * (f + i - w)
    assert inflight_by_rank(sched) == [min(v * p, v * m)] * p


def test_interleaved_zb_rejects_what_torch_rejects():
    with pytest.raises(PipesimError, match="--virtual >= 2"):
        schedules.build("interleaved-zb", 2, 4, 1)
    with pytest.raises(PipesimError, match="multiple of its 2 rounds"):
        schedules.build("interleaved-zb", 4, 9, 2)


# zb-auto: the Zero Bubble paper's heuristic scheduler --------------------------------------------

CHUNK_COSTS = [(1, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1.5, 0.5)]


def auto(p, m, f, i, w, limit):
    return zb_auto_schedule(p, m, AutoCosts.uniform(p, f, i, w, limit_microbatches=limit))


def makespan(sched, f, i, w):
    cost = {Kind.F: f, Kind.I: i, Kind.W: w}
    return critical_path(sched, lambda a: cost.get(a.kind, 0)).makespan


@pytest.mark.parametrize("f, i, w", CHUNK_COSTS)
@pytest.mark.parametrize("p, m", [(2, 4), (4, 4), (4, 8), (4, 16), (8, 16), (8, 32)])
def test_zb_auto_within_limit_and_never_behind_zb_h1(p, m, f, i, w):
    h1 = makespan(schedules.build("zb-h1", p, m), f, i, w)
    one = auto(p, m, f, i, w, p)  # 1F1B's activation memory: p microbatches per rank
    two = auto(p, m, f, i, w, 2 * p)
    for sched, limit in ((one, p), (two, 2 * p)):
        validate(sched)
        assert max(inflight_by_rank(sched)) <= limit
        table = CostTable.uniform(p, f, i, w, activation_bytes=1000)
        peaks = simulate(sched, table, comm=False).to_dict()["memory"]["peak_activation_bytes"]
        assert max(peaks) <= limit * 1000  # the simulator's memory timeline agrees
    assert makespan(one, f, i, w) <= h1
    if i > w and m >= 2 * p:  # ZB-H1 loses (p - 1)(t_I - t_W); more memory buys it back
        assert makespan(two, f, i, w) < h1
    else:
        assert makespan(two, f, i, w) <= h1


@pytest.mark.parametrize("f, i, w", CHUNK_COSTS)
@pytest.mark.parametrize("p, m", [(2, 2), (2, 8), (4, 4), (4, 8), (4, 16), (8, 8), (8, 16), (8, 32)])
def test_zb_auto_unlimited_reaches_the_lower_bound(p, m, f, i, w):
    """Lower bound: the last rank starts after (p-1) t_F and owns m(t_F+t_I+t_W); and the first rank's last
    W follows the last rank's last I (after its m F's and m I's) and p - 1 more I's up the chain."""
    bound = max((p - 1) * f + m * (f + i + w), (p - 1) * f + m * (f + i) + (p - 1) * i + w)
    got = makespan(auto(p, m, f, i, w, 0), f, i, w)
    assert bound <= got <= 1.01 * bound


def test_zb_auto_memory_limit_below_one_microbatch_is_refused():
    with pytest.raises(PipesimError, match="below one microbatch"):
        zb_auto_schedule(2, 4, AutoCosts((1.0,) * 2, (1.0,) * 2, (1.0,) * 2, (0.0,), (10.0, 10.0), (5.0, 50.0)))


# every schedule with uneven chunks, chunks without layers included -------------------------------

GPT = ["--model", "gpt", "--hidden", "64", "--heads", "2", "--seq", "16", "--vocab", "64", "--layers", "6",
       "--batch", "8", "--hardware", "local-cpu", "--json"]


@pytest.mark.parametrize("name", schedules.names())
def test_every_schedule_simulates_uneven_chunks(capsys, name):
    spec = schedules.spec(name)
    v = spec.default_virtual if spec.virtual else 1
    sched = schedules.build(name, 2, 4, v)  # dualpipe: 2 model chunks, each on two ranks (two chains)
    split = {2: "2,4", 4: "0,3,3,0", 6: "0,1,2,2,1,0"}[sched.model_stages]
    code = main(["simulate", name, "-p", "2", "-m", "4", "-v", str(v), "--layer-split", split, *GPT])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    per_rank = sched.num_stages // 2
    assert [len(r["stages"]) for r in data["ranks"]] == [per_rank, per_rank] and data["makespan"] > 0


# --memory-limit: zb-auto rebuilt for the simulated costs --------------------------------------------


def test_parse_memory_limit():
    assert parse_memory_limit("2x") == MemoryLimit(multiple=2.0)
    assert parse_memory_limit("8GB") == MemoryLimit(bytes=8e9)
    assert parse_memory_limit("1.5KiB") == MemoryLimit(bytes=1536.0)
    assert parse_memory_limit("inf") == MemoryLimit(bytes=float("inf"))
    for bad in ("", "x", "-1x", "3 parsecs", "0"):
        with pytest.raises(PipesimError, match="malformed --memory-limit"):
            parse_memory_limit(bad)


def simulated(capsys, *argv):
    code = main(["simulate", *argv, "--json", "-"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


def test_memory_limit_rebuilds_zb_auto_for_the_costs_and_stays_within_it(capsys):
    base = ["-p", "4", "-m", "8", "--cost", "F=1,I=2,W=1", "--comm", "none", "--activation-bytes", "1000"]
    _, h1 = simulated(capsys, "zb-h1", *base)
    _, one = simulated(capsys, "zb-auto", *base)
    _, two = simulated(capsys, "zb-auto", *base, "--memory-limit", "2x")
    _, bytes_limit = simulated(capsys, "zb-auto", *base, "--memory-limit", "6000")
    assert max(one["memory"]["peak_activation_bytes"]) <= 4 * 1000 and one["makespan"] <= h1["makespan"] == 38
    assert max(two["memory"]["peak_activation_bytes"]) <= 8 * 1000 and two["makespan"] == 35  # the lower bound
    assert max(bytes_limit["memory"]["peak_activation_bytes"]) <= 6000
    assert one["makespan"] >= bytes_limit["makespan"] >= two["makespan"]
    code, err = simulated(capsys, "1f1b", *base, "--memory-limit", "2x")
    assert code == 2 and "applies to zb-auto, zb-2p and zb-v" in err
    code, err = simulated(capsys, "zb-auto", *base, "--memory-limit", "500")
    assert code == 2 and "below one microbatch" in err


@pytest.mark.parametrize("name", ["zb-auto", "zb-2p"])
def test_automatic_scheduler_handles_a_single_microbatch_on_model_costs(name, capsys):
    """p=4, m=1 with a model's costs once stranded a rank in every warm-up setting (a traceback); ZB-H1's order,
    which stashes min(p, m) microbatches, is a candidate that always fits."""
    from pipesim.cli import main

    assert main(["simulate", name, "-p", "4", "-m", "1", "--model", "gpt", "--json"]) == 0
    assert '"makespan"' in capsys.readouterr().out
