"""Megatron-core's Muon (`--optimizer muon | dist_muon`): every stage's tensors against the parameter counts, the
Newton-Schulz GEMMs and passes by hand, LayerWiseDistributedOptimizer's ping-pong deal, the step's collectives and
state, and the refusals (pipesim.model.weight_tensors, pipesim.model.muon_options, pipesim.cost.muon_step)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from pipesim.cli import main
from pipesim.comm.comm_options import CommOptions
from pipesim.cost.device_profiles import profile_of
from pipesim.cost.model_costs import model_costs
from pipesim.cost.muon_step import (
    MUON_PASS_BYTES,
    NESTEROV_BYTES,
    deal,
    muon_stage,
    ns_matrices,
    ns_seconds,
)
from pipesim.device.gemm import gemm_time
from pipesim.device.kernels import memory_bound_time
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.hf_config import load_hf_config
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.memory import PRECISIONS
from pipesim.model.moe_layer import dense_mlp_params, moe_block_params
from pipesim.model.muon_options import MuonOptions, muon_options
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import block_params, stage_params
from pipesim.model.weight_tensors import WeightTensor, layer_tensors, stage_tensors
from pipesim.parallel_dims import ParallelDims

H100 = profile_of("H100", None)
MIXED = PRECISIONS["mixed"]
TOY = ModelConfig(kind="gpt", hidden=256, layers=4, heads=8, kv_heads=2, ffn_hidden=512, vocab=1000, seq=128, batch=8,
                  dtype="bfloat16", activation="swiglu", norm="rmsnorm", dropout=False, biases=False,
                  positions="rope")


def _total(tensors: list[WeightTensor]) -> int:
    return sum(t.numel * t.count for t in tensors)


@pytest.mark.parametrize("name,opts", [
    ("llama3-70b", LayerOptions(tp=4, sp=True)), ("gpt-oss-20b", LayerOptions(ep=4)),
    ("kimi-k2", LayerOptions(tp=2, sp=True, ep=8)), ("qwen3-30b-a3b", LayerOptions(tp=2, sp=True, ep=4)),
    ("nemotron4-15b", LayerOptions(tp=2, sp=True)), ("mixtral-8x7b", LayerOptions(tp=2, sp=True, ep=8, etp=1)),
    ("gemma3-27b", LayerOptions(tp=4, sp=True)),
])
def test_the_tensors_sum_to_the_parameter_counts(name, opts):
    model = load_hf_config(name, seq=4096)
    assert _total(layer_tensors(model, opts)) == block_params(model, opts.tp)
    if model.moe is not None:
        assert _total(layer_tensors(model, opts, moe=True)) == \
            block_params(model, opts.tp) + moe_block_params(model, opts) - dense_mlp_params(model, opts.tp)
    if not model.mtp_layers:
        for first, last in ((True, True), (True, False), (False, True), (False, False)):
            assert _total(stage_tensors(model, opts, StageLayers.uniform(3), first=first, last=last)) == \
                stage_params(model, opts.tp, layers=3, first=first, last=last)


def test_the_gpt_block_with_learned_positions_biases_and_tied_head():
    gpt = ModelConfig(kind="gpt", hidden=256, layers=2, heads=8, vocab=1000, seq=128, tied_embeddings=True)
    opts = LayerOptions(tp=2)
    for first, last in ((True, True), (True, False), (False, True)):
        assert _total(stage_tensors(gpt, opts, StageLayers.uniform(2), first=first, last=last)) == \
            stage_params(gpt, 2, layers=2, first=first, last=last)
    names = {t.name for t in stage_tensors(gpt, opts, StageLayers.uniform(2), first=True, last=True)}
    assert "position embedding" in names and "output layer" not in names  # tied on the one rank


def test_which_tensors_muon_takes_and_how_qkv_splits():
    opts = LayerOptions()
    tensors = stage_tensors(TOY, opts, StageLayers.uniform(1), first=True, last=True)
    assert {t.name for t in tensors if t.matrix} == {"QKV", "projection", "FC1", "FC2"}  # not the embedding or head
    qkv = next(t for t in tensors if t.name == "QKV")
    assert qkv.shape == (256 + 2 * 64, 256)
    assert ns_matrices(qkv, TOY, 1, MuonOptions()) == ((256, 256), (64, 256), (64, 256))  # Q, K, V apart
    assert ns_matrices(qkv, TOY, 1, MuonOptions(split_qkv=False)) == ((384, 256),)
    assert ns_matrices(next(t for t in tensors if t.name == "word embedding"), TOY, 1, MuonOptions()) == ()


def test_newton_schulz_by_hand():
    """Per step X X^T (m x m x n), A A (m x m x m) and B X (m x n x m), m the smaller side."""
    for rows, cols in ((1024, 4096), (4096, 1024)):
        m, n = 1024, 4096
        step = (gemm_time(m, m, n, "bfloat16", H100).seconds + gemm_time(m, m, m, "bfloat16", H100, c_bytes=4).seconds
                + gemm_time(m, n, m, "bfloat16", H100, c_bytes=4).seconds)
        assert ns_seconds(rows, cols, 5, H100) == pytest.approx(5 * step, rel=1e-12)


def test_the_ping_pong_deal():
    """LayerWiseDistributedOptimizer.shard_params: sorted by size, then ranks 0, 1, 1, 0, 0, 1, ..."""
    tensors = [WeightTensor(str(n), (n,)) for n in (50, 10, 40, 20, 30)] + [WeightTensor("six", (60,), count=2)]
    dealt = deal(tensors, 2)
    assert [[t.numel for t in r] for r in dealt] == [[10, 40, 50], [20, 30, 60, 60]]
    assert [[t.numel for t in r] for r in deal(tensors, 3)] == [[10, 60, 60], [20, 50], [30, 40]]


def test_one_rank_steps_everything_and_keeps_every_state():
    opts = LayerOptions()
    tensors = stage_tensors(TOY, opts, StageLayers.uniform(2), first=True, last=False)
    muon_elems = sum(t.numel * t.count for t in tensors if t.matrix)
    adam_elems = _total(tensors) - muon_elems
    for options in (MuonOptions(), MuonOptions(distributed=True)):  # dp 1: dist_muon deals it all to rank 0
        stage = muon_stage(tensors, TOY, 1, options, dp=1, edp=1, precision=MIXED, profile=H100)
        assert stage.state_bytes == muon_elems * (4 + 4) + adam_elems * 12  # master + momentum; master + moments
        ns = sum(ns_seconds(m, n, 5, H100) for t in tensors for _ in range(t.count)
                 for m, n in ns_matrices(t, TOY, 1, options))
        adam_passes = (2 + 4, 4, 28, 6, 2)  # copy to main grads, norm, Adam, copy back, zero the buffer (bytes)
        passes = memory_bound_time(muon_elems * MUON_PASS_BYTES, H100).seconds + \
            sum(memory_bound_time(adam_elems * b, H100).seconds for b in adam_passes)
        assert stage.seconds == pytest.approx(ns + passes, rel=1e-12)
        assert stage.pass_bytes == muon_elems * MUON_PASS_BYTES + adam_elems * sum(adam_passes)
    nesterov = muon_stage(tensors, TOY, 1, MuonOptions(nesterov=True), dp=1, edp=1, precision=MIXED, profile=H100)
    assert nesterov.pass_bytes - stage.pass_bytes == muon_elems * NESTEROV_BYTES


def test_dist_muon_keeps_the_largest_dealt_share():
    opts = LayerOptions()
    tensors = stage_tensors(TOY, opts, StageLayers.uniform(2), first=True, last=False)
    dist = muon_stage(tensors, TOY, 1, MuonOptions(distributed=True), dp=4, edp=1, precision=MIXED, profile=H100)

    def state(own: list[WeightTensor]) -> int:
        return sum(t.numel * (8 if t.matrix else 12) for t in own)

    assert dist.state_bytes == max(state(own) for own in deal(tensors, 4))
    alone = muon_stage(tensors, TOY, 1, MuonOptions(), dp=4, edp=1, precision=MIXED, profile=H100)
    assert dist.seconds < alone.seconds and dist.state_bytes < alone.state_bytes


def _costs(job: Job, dp: int = 2):
    hw = load_hardware("dgx-h100")
    model = replace(TOY, batch=8 * dp)
    return model_costs(model, 2, 4, hw, replace(job, dims=ParallelDims(dp=dp)))


def test_the_step_reduces_then_gathers():
    muon = _costs(Job(muon=MuonOptions())).step
    assert [(c.kind, c.phase) for c in muon.collectives[0]] == [("all_reduce", "grads")]
    dist = _costs(Job(muon=MuonOptions(distributed=True))).step
    assert [(c.kind, c.phase) for c in dist.collectives[0]] == [("all_reduce", "grads"), ("all_gather", "params")]
    assert dist.bucketed_gather and not muon.bucketed_gather
    overlapped = _costs(Job(muon=MuonOptions(distributed=True),
                            comm=CommOptions(overlap_grad_reduce=True, overlap_param_gather=True))).step
    assert [(c.kind, c.phase) for c in overlapped.collectives[0]][-1] == ("all_gather", "forward")
    costs = _costs(Job(muon=MuonOptions(distributed=True)))
    assert costs.muon_state_bytes[0] > 0 and costs.step.optimizer_seconds[0] > 0


@pytest.mark.parametrize("job,message", [
    (lambda: Job(ParallelDims(dp=2), zero=1, muon=MuonOptions()),
     "--optimizer muon with --zero 1: Megatron-core's Muon does not run under the distributed optimizer or FSDP"),
    (lambda: Job(ParallelDims(dp=2), muon=MuonOptions(), comm=CommOptions(overlap_grad_reduce=True)),
     "--optimizer muon does not overlap the gradient reduction or the parameter gather"),
    (lambda: muon_options("adam", ns_steps=3), "--muon-num-ns-steps set Muon's step: give --optimizer muon"),
    (lambda: muon_options("lion"), "--optimizer 'lion' is not modelled; choose adam, muon, dist_muon"),
    (lambda: MuonOptions(ns_steps=0), "--muon-num-ns-steps must be a positive integer, got 0"),
    (lambda: Job(muon=MuonOptions()).check(replace(TOY, dtype="float16")),
     "--optimizer muon with a float16 model: Megatron-core's Muon runs bf16 or float32"),
])
def test_refusals(job, message):
    with pytest.raises(PipesimError, match=re.escape(message)):
        job()


def test_the_command_line(capsys, tmp_path):
    base = ["simulate", "1f1b", "--stages", "2", "--microbatches", "4", "--model-config", "llama3-8b", "--seq", "1024",
            "--batch", "16", "--dp", "2", "--hardware", "dgx-h100", "--layers", "4"]
    assert main(base + ["--optimizer", "dist_muon", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["options"]["optimizer"] == "dist_muon"
    assert main(base + ["--optimizer", "muon", "--zero", "1"]) == 2
    assert capsys.readouterr().err.strip().startswith("pipesim: error: --optimizer muon with --zero 1")
    assert main(base[:-4] + ["--hardware", "local-cpu", "--layers", "4", "--optimizer", "muon"]) == 2
    assert "no GPU device family" in capsys.readouterr().err
    assert main(base + ["--optimizer", "muon", "--framework", "torchtitan", "--zero", "0"]) == 2
    assert capsys.readouterr().err.strip() == ("pipesim: error: --optimizer muon is Megatron-core's Muon "
                                               "(core_v0.16.0 on); --framework torchtitan does not run it: give "
                                               "--framework megatron-core, or none")
    assert Job(muon=MuonOptions(distributed=True, nesterov=True)).flags()[-3:] == \
        ["--optimizer", "dist_muon", "--muon-use-nesterov"]


def test_from_megatron(capsys, tmp_path):
    script = Path(tmp_path / "run.sh")
    args = ("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 1 "
            "--pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 256 --num-attention-heads 8 "
            "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 16 --bf16 "
            "--vocab-size 1000 --optimizer dist_muon --muon-momentum 0.95 --muon-use-nesterov --overlap-grad-reduce")
    script.write_text(args + "\n")
    assert main(["simulate", "--from-megatron", str(script), "--hardware", "dgx-h100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["options"]["optimizer"] == "dist_muon"
    script.write_text(args + " --muon-fp32-matmul-prec high\n")
    assert main(["simulate", "--from-megatron", str(script), "--hardware", "dgx-h100"]) == 2
    assert capsys.readouterr().err.strip().endswith("--muon-fp32-matmul-prec high: pipesim times the Newton-Schulz "
                                                    "GEMMs in bfloat16 (medium)")
