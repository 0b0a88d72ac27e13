"""DualPipe trains like GPipe (and the single-process reference) on four CPU ranks: two model copies, half the
microbatches each way, their gradients summed between the two ranks holding a stage (executor.replicas)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.executor_helpers import TINY_GPT, assert_matches_reference, chain, load_run, model_of

STEPS = 3
GPT = [*TINY_GPT[:-1], "16"]  # batch 16: 8 microbatches of 2


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    d = tmp_path_factory.mktemp("dualpipe4")
    common = ["--microbatches", "8", *GPT, "--steps", str(STEPS), "--quiet", "--pg-timeout", "20"]
    even = ["dualpipe,gpipe", "--nproc", "4", *common, "--save-dir", str(d / "even")]
    uneven = ["dualpipe", *common, "--layer-split", "1,2,1,0", "--save-dir", str(d / "uneven")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "pipesim", "run", *chain(even, uneven)], env=env,
                          capture_output=True, text=True, timeout=300)
    return d, proc


@pytest.mark.dist
def test_dualpipe_matches_gpipe_and_the_reference_on_four_ranks(four_ranks):
    d, proc = four_ranks
    assert proc.returncode == 0, proc.stderr
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
