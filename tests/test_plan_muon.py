"""`pipesim plan --optimizer muon | dist_muon`: the memory bound with Muon's states (never above the exact peak, equal
to it on one stage), the estimate's optimizer tail equal to the simulator's Muon step, ZeRO 0 only, and the exports
(Megatron-LM's arguments alone, the run command's note)."""

from __future__ import annotations

import json

import pytest

from pipesim.cli import main
from pipesim.cost.model_costs import precision_of
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.memory import MemoryBreakdown
from pipesim.model.muon_options import MuonOptions
from pipesim.plan.evaluate import Evaluator
from pipesim.plan.space import PlanRequest, enumerate_candidates
from tests.plan_checks import bounds_hold

LLAMA_TOY = ModelConfig(kind="gpt", hidden=256, layers=8, heads=8, kv_heads=2, ffn_hidden=768, vocab=4000, seq=256,
                        batch=48, dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                        positions="rope")
PLAN = ["plan", "--model-config", "llama3.1-8b", "--seq", "4096", "--batch", "64", "--hardware", "dgx-h100",
        "--nodes", "1", "--framework", "megatron-core", "--top", "3"]


def _request(distributed: bool) -> PlanRequest:
    return PlanRequest(LLAMA_TOY, load_hardware("dgx-h100").with_nodes(1), 8, sequence_parallel=(True, False),
                       zeros=(0,), job=Job(muon=MuonOptions(distributed=distributed)))


@pytest.mark.parametrize("distributed", [False, True])
def test_the_bound_counts_muons_states(distributed):
    checked = bounds_hold(_request(distributed), lambda c: c.mbs in (1, 6))
    ones = [(c, bound, peak) for c, bound, peak in checked if c.p == 1 and c.recompute == "none"]
    assert ones and all(bound == peak for _, bound, peak in ones)  # one stage: the bound is rank_memory's peak
    assert len(checked) > 100


def test_dist_muon_deals_the_state_and_the_step():
    """Over 8 data-parallel ranks dist_muon keeps about an eighth of muon's state and steps about an eighth of it;
    the estimate's tail is the slowest rank's Muon step as the simulator's costs give it."""
    muon, dist = Evaluator(_request(False)), Evaluator(_request(True))
    c = next(c for c in _candidates(muon) if c.p == 2 and c.dp == 4 and c.tp == 1 and c.mbs == 6)
    states = [ev.bounds.muon_states(c, c.job(ev.shared).layer_options(LLAMA_TOY)) for ev in (muon, dist)]
    assert all(d < m for m, d in zip(*states, strict=True))
    precision = precision_of(LLAMA_TOY, None, None, None)  # the search's (bf16: float32 main gradients)
    for ev in (muon, dist):
        step = ev.cost(c).costs.step
        assert ev.optimizer_tail(c, precision) == max(step.optimizer_seconds)
    assert dist.optimizer_tail(c, precision) < muon.optimizer_tail(c, precision)


def _candidates(ev: Evaluator):
    return enumerate_candidates(ev.req)


def test_the_plan_and_its_exports(capsys):
    assert main(PLAN + ["--optimizer", "dist_muon", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {row["zero"] for row in out["rows"]} == {0}
    winner = out["winner"]
    assert winner["megatron_args"][-1] == "--optimizer dist_muon" and "torchtitan_toml" not in winner
    assert winner["simulate_command"].endswith("--optimizer dist_muon")
    assert winner["run_note"] == ("# the executor steps SGD or Adam (pipesim run --optimizer): --optimizer "
                                  "dist_muon's step is a simulate figure")
    assert main(PLAN + ["--optimizer", "muon", "--zero", "1"]) == 2
    assert capsys.readouterr().err.strip() == ("pipesim: error: --optimizer muon needs ZeRO 0 among the plan's "
                                               "--zero, got 1")
    assert main(["plan", "--model-config", "llama3.1-8b", "--seq", "1024", "--batch", "16", "--hardware",
                 "local-cpu", "--layers", "4", "--optimizer", "muon"]) == 2
    assert "no GPU device family" in capsys.readouterr().err


def test_breakdown_is_rank_memorys():
    """The bound's Muon term is the simulator's optimizer_states on a one-stage candidate."""
    ev = Evaluator(_request(True))
    c = next(c for c in _candidates(ev) if c.p == 1 and c.dp == 8 and c.recompute == "none" and c.mbs == 1)
    fullest: MemoryBreakdown = ev.cost(c).fullest
    opts = c.job(ev.shared).layer_options(LLAMA_TOY)
    assert fullest.optimizer_states == ev.bounds.muon_states(c, opts)[0]
