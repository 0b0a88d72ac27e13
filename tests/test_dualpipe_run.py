"""DualPipe trains like GPipe (and the single-process reference) on four CPU ranks: two model copies, half the
microbatches each way, their gradients summed between the two ranks holding a stage (executor.replicas)."""

from __future__ import annotations

import json

import pytest

from tests.executor_helpers import TINY_GPT, assert_matches_reference, chain, load_run, model_of
from tests.launch_shared import register_run

STEPS = 3
GPT = [*TINY_GPT[:-1], "16"]  # batch 16: 8 microbatches of 2


def _four_rank_flags(d):
    common = ["--microbatches", "8", *GPT, "--steps", str(STEPS), "--quiet", "--pg-timeout", "20"]
    even = ["dualpipe,gpipe", *common, "--save-dir", str(d / "even")]
    uneven = ["dualpipe", *common, "--layer-split", "1,2,1,0", "--save-dir", str(d / "uneven")]
    return chain(even, uneven)


FOUR_RANKS = register_run("dualpipe_run", 4, _four_rank_flags)  # in the session's shared 4-rank launch


@pytest.fixture(scope="module")
def four_ranks(shared_launches):
    """The case's folder (tests/launch_shared.py); fails, naming the case, unless every rank finished it."""
    return shared_launches.case(FOUR_RANKS).check()


@pytest.mark.dist
def test_dualpipe_matches_gpipe_and_the_reference_on_four_ranks(four_ranks):
    d = four_ranks
    model = model_of(GPT)
    for where, name in (("even", "dualpipe"), ("even", "gpipe"), ("uneven", "dualpipe")):
        assert_matches_reference(d / where, name, model, STEPS)  # load_run: the two copies agree bit for bit
    dual, _ = load_run(d / "even", "dualpipe")
    gpipe, _ = load_run(d / "even", "gpipe")
    assert dual == pytest.approx(gpipe, rel=1e-6)
    result = json.loads((d / "even" / "dualpipe" / "result.json").read_text())
    assert result["layers_per_stage"] == [1, 1, 1, 1] and result["stages"] == 8
    elements = result["param_elements_per_rank"]  # each rank holds model stages r and 3 - r
    gpipe_elements = json.loads((d / "even" / "gpipe" / "result.json").read_text())["param_elements_per_rank"]
    assert elements == [gpipe_elements[r] + gpipe_elements[3 - r] for r in range(4)]
