"""Every registered schedule takes an uneven layer split with chunks that hold no layers (a GPT's first chunk
with only the embedding, its last with only the head, as Llama 3 405B's 126 layers over 128 chunks; any other
empty chunk is an identity stage): simulated with the split's costs, and trained on two CPU ranks to the
reference's losses and parameters."""

from __future__ import annotations

import subprocess
import sys

import pytest

import schedules
from pipesim.cost.model_costs import model_costs
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig, split_layers
from pipesim.sim.sim_setup import SimSetup
from tests.executor_helpers import TINY_GPT, TINY_MLP, assert_matches_reference, chain, model_of
from tests.launch_shared import register_run

MODEL = ModelConfig(kind="gpt", hidden=64, heads=4, seq=32, vocab=128, layers=12, batch=16)
STEPS = 2


def empty_ends_split(chunks: int, layers: int) -> tuple[int, ...]:
    """0 layers in the first and last chunk, one in each other, the rest on the second."""
    split = [0] + [1] * (chunks - 2) + [0]
    split[1] += layers - sum(split)
    return tuple(split)


@pytest.mark.parametrize("name", schedules.names())
def test_every_schedule_simulates_with_empty_end_chunks(name):
    sched = schedules.build(name, 4, 8)
    split = empty_ends_split(sched.model_stages, MODEL.layers)
    setup = SimSetup(hardware=load_hardware("local-cpu"), model=MODEL, layer_split=split)
    costs = setup.costs(sched)
    assert costs.layers_per_stage == tuple(split[sched.model_stage(s)] for s in range(sched.num_stages))
    forward = [c.forward for c in costs.table.stages]
    first, heavy = sched.replicas(0)[0], sched.replicas(1)[0]
    assert 0 < forward[first] < forward[heavy]  # the embedding alone is cheaper than the 2nd chunk's blocks
    even = SimSetup(hardware=load_hardware("local-cpu"), model=MODEL).run(sched)
    rank = sched.rank_of(heavy)  # the rank holding the piled-up chunk works longer than with an even split
    assert setup.run(sched).busy(rank) > even.busy(rank)


def inner_empty_split(sched, layers: int) -> tuple[int, ...]:
    """0 layers in every chunk rank 1 holds (inner chunks for p = 4), one in each other, the rest on the first."""
    empty = {sched.model_stage(s) for s in sched.stages_of(1)}
    split = [0 if c in empty else 1 for c in range(sched.model_stages)]
    split[0] += layers - sum(split)
    return tuple(split)


def overheads(hw, dtype: str) -> tuple[float, float, float]:
    """Seconds of an F, I and W with no work: the cost equation's per-action overheads."""
    return tuple(hw.compute_time(0.0, 0.0, dtype, k, 0.0) for k in "FIW")


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
@pytest.mark.parametrize("hardware", ["local-cpu", "dgx-h100"])  # roofline; GPU kernel path
def test_an_empty_inner_chunk_costs_the_per_action_overheads_only(kind, hardware):
    hw = load_hardware(hardware)
    model = ModelConfig(kind=kind, hidden=64, heads=4, seq=32, vocab=128, layers=4, batch=16)
    stages = model_costs(model, 4, 8, hw, layer_split=[2, 0, 0, 2]).table.stages
    for empty in stages[1:3]:
        assert (empty.forward, empty.backward_input, empty.backward_weight) == overheads(hw, model.dtype)
        assert (empty.param_bytes, empty.activation_bytes, empty.flops_forward) == (0, 0, 0)
        assert empty.boundary_bytes == stages[0].boundary_bytes  # it passes on what it received
    assert overheads(hw, model.dtype) == ((0.0,) * 3 if hardware == "local-cpu" else (hw.per_action_overhead,) * 3)


@pytest.mark.parametrize("name", schedules.names())
def test_every_schedule_simulates_with_empty_inner_chunks(name):
    """Rank 1 holds only identity stages: on a GPU preset it is busy for the per-action overheads of its
    actions alone, m (F + I + W) per chunk it holds (an overlapped F&B pair: by the overlap rule)."""
    sched = schedules.build(name, 4, 8)
    hw = load_hardware("dgx-h100")
    split = inner_empty_split(sched, MODEL.layers)
    setup = SimSetup(hardware=hw, model=MODEL, layer_split=split)
    costs = setup.costs(sched)
    assert costs.layers_per_stage == tuple(split[sched.model_stage(s)] for s in range(sched.num_stages))
    result = setup.run(sched)
    if not sched.overlaps:
        chunks = len(sched.stages_of(1))
        assert result.busy(1) == pytest.approx(sched.num_microbatches * chunks * sum(overheads(hw, MODEL.dtype)),
                                               rel=1e-12)
    assert result.busy(1) < result.busy(0) / 10  # rank 0 holds the embedding and the piled-up layers


@pytest.mark.parametrize(("split", "why"), [((4, 4, 4, 1), "summing to the model's 12 layers"),
                                            ((4, 4, 4), "must have 4 entries"),
                                            ((6, -1, 7, 0), "0 or more layers")])
def test_a_split_that_sums_wrong_is_refused_in_one_line(split, why):
    setup = SimSetup(hardware=load_hardware("local-cpu"), model=MODEL, layer_split=split)
    with pytest.raises(PipesimError, match=why):
        setup.costs(schedules.build("1f1b", 4, 8))


def test_a_model_without_layers_is_refused():
    with pytest.raises(PipesimError, match="at least one"):
        split_layers(0, 2, [0, 0])


def test_the_cli_refuses_a_bad_split_in_one_line_with_exit_2():
    proc = subprocess.run([sys.executable, "-m", "pipesim", "simulate", "1f1b", "-p", "2", "-m", "4", "--model", "mlp",
                           "--hidden", "64", "--layers", "4", "--batch", "8", "--hardware", "local-cpu",
                           "--layer-split", "3,0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "summing to the model's 4 layers" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _names_with(chunks: int) -> str:
    return ",".join(n for n in schedules.names() if schedules.build(n, 2, 4).model_stages == chunks)


# identity stages (no layers, not a chain's end) on 2 ranks: a GPT's inner chunk on rank 1 that receives from
# rank 0 and sends back (interleaved-1f1b, dualpipev: then on to its local chunk 2; 1,2,0,1: received locally),
# and an MLP's first chunk that holds nothing (rank 0 passes the data on and updates no parameter)
IDENTITY_RUNS = (("inner", "interleaved-1f1b,dualpipev", TINY_GPT, "1,0,2,1"),
                 ("inner-local", "dualpipev", TINY_GPT, "1,2,0,1"),
                 ("mlp-first", "1f1b,zb-h1,dualpipe", TINY_MLP, "0,4"),
                 ("mlp-last", "1f1b,zb-h1", TINY_MLP, "4,0"))


def _empty_chunk_flags(d):
    """Two ranks: every one-chunk-per-rank schedule with split 0,4 (rank 0: the embedding only), then every
    two-chunk one with 0,2,2,0, then the identity-stage runs of IDENTITY_RUNS."""
    run = ["--microbatches", "4", "--steps", str(STEPS), "--quiet"]
    gpt = [*run, *TINY_GPT]
    one = [_names_with(2), *gpt, "--pg-timeout", "20", "--layer-split", "0,4", "--save-dir", str(d / "one")]
    two = [_names_with(4), *gpt, "--layer-split", "0,2,2,0", "--save-dir", str(d / "two")]
    identity = [[names, *run, *model, "--layer-split", split, "--save-dir", str(d / where)]
                for where, names, model, split in IDENTITY_RUNS]
    return chain(one, two, *identity)


EMPTY_CHUNK_RUNS = register_run("uneven_chunks", 2, _empty_chunk_flags)  # in the session's shared 2-rank launch


@pytest.fixture(scope="module")
def empty_chunk_runs(shared_launches):
    """The case's folder (tests/launch_shared.py); fails, naming the case, unless every rank finished it."""
    return shared_launches.case(EMPTY_CHUNK_RUNS).check()


@pytest.mark.dist
def test_every_schedule_trains_like_the_reference_with_an_empty_chunk(empty_chunk_runs):
    d = empty_chunk_runs
    names = [(n, "one") for n in _names_with(2).split(",")] + [(n, "two") for n in _names_with(4).split(",")]
    assert {n for n, _ in names} == set(schedules.names())
    for name, where in names:
        assert_matches_reference(d / where, name, model_of(TINY_GPT), STEPS)


@pytest.mark.dist
@pytest.mark.parametrize(("where", "names", "model", "split"), IDENTITY_RUNS, ids=[r[0] for r in IDENTITY_RUNS])
def test_identity_stages_train_like_the_reference(empty_chunk_runs, where, names, model, split):
    d = empty_chunk_runs
    for name in names.split(","):
        assert_matches_reference(d / where, name, model_of(model), STEPS)
