"""Megatron-core's --first-last-layers-bf16: an FP8 run's first and last layers (by global index) train in bf16.

A stage whose layers are all of one precision costs exactly what the all-FP8 or the all-bf16 job gives that stage
(kernels, stash, parameters, collectives with the GEMMs they hide behind, FP8 weight copies and their cast), and a
stage holding both is its FP8 part plus its bf16 layers; the multi-token-prediction module stays in FP8, as
Megatron-core's global FP8 context keeps it (multi_token_prediction.py)."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest

from pipesim.cli import main
from pipesim.comm.ub_overlap import UbConfig
from pipesim.cost.model_costs import model_costs
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.kernel_switches import KernelSwitches
from pipesim.model.config import ModelConfig
from pipesim.model.fp8 import Fp8Options
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.layer_precision import Bf16Layers
from pipesim.model.moe import MoeConfig
from pipesim.parallel_dims import ParallelDims
from pipesim.plan.torchtitan_export import torchtitan_fp8

LLAMA = ModelConfig(kind="gpt", hidden=1024, layers=4, heads=8, kv_heads=2, ffn_hidden=2816, vocab=4096, seq=512,
                    batch=8, dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                    positions="rope")
MOE = replace(LLAMA, moe=MoeConfig(8, 2, 512, shared_experts=1, dense_layers=1))
H100 = load_hardware("dgx-h100")
CURRENT = Fp8Options("hybrid", "tensorwise")
EDGES = Bf16Layers(1, 1)
M = 4  # microbatches


def _job(fp8: Fp8Options | None, edges: Bf16Layers | None = None, *, tp: int = 1, ub: bool = False,
         gather: bool = False) -> Job:
    kernels = KernelSwitches(ub=UbConfig() if ub else None)
    return Job(ParallelDims(tp=tp), sp=tp > 1, attention="flash", zero=1 if gather else 0, kernels=kernels, fp8=fp8,
               fp8_param_gather=gather, bf16_layers=edges)


def _stage(costs, s: int) -> tuple:
    """Everything model_costs says of stage s; each action's tp collectives as a multiset (the simulator sums them:
    pipesim.sim.program._tp_time)."""
    st = costs.table.stages[s]
    return (st.forward, st.backward_input, st.backward_weight, st.activation_bytes, st.param_bytes,
            st.recompute_bytes, {k: sorted(map(repr, v)) for k, v in costs.tp_collectives.items() if k[0] == s})


def test_the_bf16_layers_are_the_first_and_last_by_global_index():
    assert Bf16Layers(1, 2).indices(8) == (0, 6, 7)
    assert Bf16Layers(0, 0).indices(8) == ()
    assert Bf16Layers().flags() == ["--first-last-layers-bf16"]
    assert Bf16Layers(2, 0).flags() == ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "2",
                                        "--num-layers-at-end-in-bf16", "0"]
    # a chunk's share: layers 2..5 of 8 hold none; the first chunk the start ones, the last chunk the end ones
    assert Bf16Layers(2, 1).in_chunk(replace(LLAMA, layers=8), 2, 4) == StageLayers()
    assert Bf16Layers(2, 1).in_chunk(replace(LLAMA, layers=8), 0, 3) == StageLayers.uniform(2)
    # MOE's layer 0 is dense, the rest have experts
    assert EDGES.in_chunk(MOE, 0, 2) == StageLayers.uniform(1)
    assert EDGES.in_chunk(MOE, 2, 2) == StageLayers.uniform(1, 1)


@pytest.mark.parametrize("tp, ub", [(1, False), (2, False), (2, True)])
def test_a_stage_of_one_precision_costs_what_that_precision_gives_it(tp, ub):
    # one layer per stage: stages 0 and 3 hold the bf16 layers, 1 and 2 FP8 ones, with their collectives (and the
    # GEMMs they hide behind, timed in the stage's own precision)
    edge, fp8, bf16 = (model_costs(LLAMA, 4, M, H100, _job(f, e, tp=tp, ub=ub))
                       for f, e in ((CURRENT, EDGES), (CURRENT, None), (None, None)))
    for s, same in ((0, bf16), (1, fp8), (2, fp8), (3, bf16)):
        assert _stage(edge, s) == _stage(same, s)
    assert _stage(edge, 0) != _stage(fp8, 0)  # the test can fail: the precisions differ
    assert edge.fp8_weight_bytes == (0, fp8.fp8_weight_bytes[1], fp8.fp8_weight_bytes[2], 0)
    # the once-per-step weight cast: the FP8 stages' alone
    assert edge.step.optimizer_seconds == (bf16.step.optimizer_seconds[0], *fp8.step.optimizer_seconds[1:3],
                                           bf16.step.optimizer_seconds[3])


def test_a_stage_holding_both_is_its_fp8_part_plus_its_bf16_layers():
    one = {name: model_costs(LLAMA, 4, M, H100, _job(f)) for name, f in (("fp8", CURRENT), ("bf16", None))}
    layer = {name: _stage(c, 1) for name, c in one.items()}  # a middle stage: one layer alone
    edge, fp8 = (model_costs(LLAMA, 2, M, H100, _job(CURRENT, e)) for e in (EDGES, None))
    for s in (0, 1):  # each stage of two layers holds one bf16 layer: the all-FP8 stage with one layer swapped
        got, full = _stage(edge, s), _stage(fp8, s)
        if s == 0:  # the first stage runs its whole backward in W: compare the backward whole
            got, full = ((x[0], 0.0, x[1] + x[2], *x[3:]) for x in (got, full))
        for k in (0, 2, 3, 4):
            swap = layer["bf16"][k] - layer["fp8"][k] + (layer["bf16"][1] - layer["fp8"][1] if k == 2 and s == 0
                                                          else 0.0)
            assert got[k] == pytest.approx(full[k] + swap, rel=1e-12)
        assert _stage(edge, 1)[1] == pytest.approx(_stage(fp8, 1)[1] - layer["fp8"][1] + layer["bf16"][1], rel=1e-12)
    assert edge.fp8_weight_bytes == tuple(n // 2 for n in fp8.fp8_weight_bytes)
    # recomputation re-runs one layer at a time: the stage's working set is its larger layer's, the bf16 one's
    full = {name: model_costs(LLAMA, 4, M, H100, replace(_job(f), recompute="full")).table.stages[1].recompute_bytes
            for name, f in (("fp8", CURRENT), ("bf16", None))}
    edge = model_costs(LLAMA, 2, M, H100, replace(_job(CURRENT, EDGES), recompute="full"))
    assert full["bf16"] > full["fp8"]
    assert [st.recompute_bytes for st in edge.table.stages] == [full["bf16"]] * 2


def test_the_mtp_module_stays_fp8_and_the_experts_follow_their_layer():
    model = replace(MOE, mtp_layers=1)
    edge, fp8, bf16 = (model_costs(model, 4, M, H100, _job(f, e)) for f, e in
                       ((CURRENT, EDGES), (CURRENT, None), (None, None)))
    assert _stage(edge, 0) == _stage(bf16, 0)  # the dense first layer
    mid_fp8, mid_bf16 = (model_costs(model, 4, M, H100, _job(f)) for f in (CURRENT, None))
    # the last stage: its MoE layer in bf16, its head and MTP module (a MoE block) as the FP8 run has them
    for k in range(4):
        assert _stage(edge, 3)[k] == pytest.approx(_stage(fp8, 3)[k] - _stage(mid_fp8, 2)[k] +
                                                   _stage(mid_bf16, 2)[k], rel=1e-12)
    assert _stage(edge, 3) != _stage(bf16, 3)


def test_bf16_parameters_are_not_gathered_in_fp8():
    edge, fp8 = (model_costs(LLAMA, 4, M, H100, replace(_job(CURRENT, e, gather=True), dims=ParallelDims(dp=2)))
                 for e in (EDGES, None))
    assert edge.fp8_param_counts == (0, *fp8.fp8_param_counts[1:3], 0)
    assert fp8.fp8_param_counts[0] > 0


@pytest.mark.parametrize("job, message", [
    (lambda: _job(None, EDGES), "--first-last-layers-bf16 keeps an FP8 run's first and last layers in bf16: it needs "
                                "--fp8-format (or --fp4-format)"),
    (lambda: _job(Fp8Options("hybrid", "delayed"), EDGES),
     "--first-last-layers-bf16 does not go with --fp8-recipe delayed, Megatron-core's default (Megatron-core: "
     "'Delayed scaling does not support first / last layer in BF16'): give another --fp8-recipe"),
    (lambda: _job(Fp8Options("hybrid", "tensorwise", "torchao"), EDGES),
     "--first-last-layers-bf16 is Megatron-core's per-layer FP8 autocast: not with --fp8-impl torchao (torchtitan's "
     "float8 converter keeps layers out of FP8 by its filter_fqns)"),
    (lambda: Bf16Layers(-1, 1), "--num-layers-at-start-in-bf16 must be a non-negative integer, got -1"),
])
def test_refusals(job, message):
    with pytest.raises(PipesimError) as err:
        job()
    assert str(err.value) == message


def test_each_count_is_at_most_the_layers_per_pipeline_rank():
    with pytest.raises(PipesimError) as err:
        model_costs(LLAMA, 4, M, H100, replace(_job(CURRENT, Bf16Layers(1, 2)), dims=ParallelDims(pp=4)))
    assert str(err.value) == ("--num-layers-at-end-in-bf16 2 is more than the 1 layers per pipeline rank (4 layers "
                              "over 4 ranks; Megatron-core's bound)")


COMMAND = ("simulate 1f1b --model-config llama3.1-8b --seq 2048 --batch 8 --microbatch-size 1 --stages 4 "
           "--hardware dgx-h100 --fp8-format hybrid --fp8-recipe tensorwise")


def test_the_cli_takes_megatrons_flags_and_reports_them(capsys):
    assert main(shlex.split(COMMAND + " --first-last-layers-bf16 --num-layers-at-end-in-bf16 2 --json")) == 0
    assert {k: v for k, v in json.loads(capsys.readouterr().out)["options"].items() if "bf16" in k} == \
        {"first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 2}
    assert main(shlex.split(COMMAND + " --num-layers-at-start-in-bf16 2")) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "pipesim: error: --num-layers-at-start-in-bf16 2 needs --first-last-layers-bf16"


def test_torchtitan_keeps_the_same_layers_out_of_float8():
    assert torchtitan_fp8("tensorwise", (0, 30, 31))[-1] == 'filter_fqns = ["output", "layers.0.", "layers.30.", ' \
                                                           '"layers.31."]'
    assert torchtitan_fp8("tensorwise")[-1] == 'filter_fqns = ["output"]'


def test_the_planner_plans_it_and_exports_it(capsys, tmp_path):
    """Every candidate keeps its edge layers in bf16; the winner's pipesim command re-simulates to its own step, and
    Megatron's arguments carry the flags. A count above a candidate's layers per rank is that candidate's refusal."""
    model = ["--model", "gpt", "--hidden", "1024", "--ffn-hidden", "2816", "--activation", "swiglu", "--layers", "4",
             "--heads", "8", "--seq", "512", "--vocab", "8000", "--batch", "16", "--dtype", "bfloat16"]
    out = tmp_path / "plan.json"
    assert main(["plan", *model, "--hardware", "dgx-h100", "--gpus", "8", "--framework", "megatron-core",
                 "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
                 "--num-layers-at-end-in-bf16", "2", "--recompute", "none", "--max-candidates", "20",
                 "--json", str(out)]) == 0
    capsys.readouterr()
    data = json.loads(out.read_text())
    flags = ["--first-last-layers-bf16", "--num-layers-at-end-in-bf16", "2"]
    argv = shlex.split(data["winner"]["simulate_command"])
    assert argv[argv.index(flags[0]):argv.index(flags[0]) + 3] == flags
    assert " ".join(flags) in " ".join(data["winner"]["megatron_args"])
    assert main(argv[1:] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == data["rows"][0]["step_time"]
    # with 4 layers, a pipeline of 4 ranks holds 1 layer each: 2 at the end is more than Megatron-core allows there,
    # which the planner's first pass refuses (1 at each end fits every pipeline size)
    assert data["counts"]["refused_by_model"] > 0 and all(row["pp"] < 4 for row in data["rows"])
    assert main(["plan", *model, "--hardware", "dgx-h100", "--gpus", "8", "--framework", "megatron-core",
                 "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
                 "--recompute", "none", "--max-candidates", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["counts"]["refused_by_model"] == 0
