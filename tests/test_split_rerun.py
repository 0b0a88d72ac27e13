"""Full recomputation under a split backward on a calibrated CPU host: the executor's checkpoint re-runs each layer's
forward in W as well as in I (tests/test_executor_pp.py counts the attention cores), so the cost path charges a
split W that forward once more (`StageCosts.split_rerun`) and nothing elsewhere."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesim.cost.model_costs import model_costs
from pipesim.cost.stage_work import gpt_stage_work
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.options import LayerOptions

LLAMA = ModelConfig(kind="gpt", hidden=64, layers=4, heads=4, kv_heads=2, seq=32, vocab=128, batch=8,
                    ffn_hidden=160, activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                    positions="rope")


def test_a_split_w_pays_full_recomputations_forward_again_on_a_cpu_host():
    """Stage 1 of 2: split_rerun is the host's W seconds with the re-run forward's FLOPs, bytes and ops added, less
    W alone; the re-run is exactly what full recomputation adds to I."""
    hw = load_hardware("local-cpu")
    full, none = LayerOptions(recompute="full"), LayerOptions()
    work = gpt_stage_work(LLAMA, 2, StageLayers.uniform(2), first=False, last=True, opts=full, executor_ops=True)
    plain = gpt_stage_work(LLAMA, 2, StageLayers.uniform(2), first=False, last=True, opts=none, executor_ops=True)
    rerun = work.split_rerun
    assert rerun["flops"] == work.flops["I"] - plain.flops["I"] > 0
    assert rerun["moved"] == work.moved["I"] - plain.moved["I"] > 0
    assert rerun["ops"] == work.ops["I"] - plain.ops["I"] > 0
    stages = model_costs(LLAMA, 2, 4, hw, Job(recompute="full")).table.stages
    w = (work.flops["W"], work.moved["W"], LLAMA.dtype, "W", work.ops["W"])
    expected = hw.compute_time(w[0] + rerun["flops"], w[1] + rerun["moved"], w[2], w[3], w[4] + rerun["ops"]) - \
        hw.compute_time(*w)
    assert stages[1].split_rerun == pytest.approx(expected, rel=1e-12) and expected > 0
    assert stages[0].split_rerun == 0.0  # the first stage's W is its whole backward: one re-run, in I's place


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_nothing_to_rerun_without_full_recomputation_or_off_a_cpu_host(recompute):
    """Selective recomputation's core has no weight in W's path (the executor re-runs it in I only), and a GPU preset
    times the stacks users run there."""
    cpu = load_hardware("local-cpu")
    assert all(s.split_rerun == 0.0 for s in model_costs(LLAMA, 2, 4, cpu, Job(recompute=recompute)).table.stages)
    gpu = model_costs(replace(LLAMA, dtype="bfloat16"), 2, 4, load_hardware("dgx-h100"),
                      Job(recompute="full", attention="flash")).table.stages
    assert all(s.split_rerun == 0.0 for s in gpu)
