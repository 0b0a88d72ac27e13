"""The Job (pipesim.job): each range and divisibility check once, with the one-line message users get; a frozen,
hashable value (the planner's cache key); with_pp, the attention default, and its flags read back by the CLI."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesim.cli import build_parser
from pipesim.comm.comm_options import CommOptions
from pipesim.commands.setup_args import sim_job
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job, KernelSwitches
from pipesim.model.config import ModelConfig
from pipesim.parallel_dims import ParallelDims

GPT = ModelConfig(kind="gpt", hidden=256, layers=4, heads=8, kv_heads=4, ffn_hidden=768, seq=64, vocab=512, batch=16,
                  dtype="bfloat16")
MLP = ModelConfig(kind="mlp", hidden=96, layers=4, batch=16)
NOT_MLP = "needs a transformer (--model gpt or --model-config), not --model mlp"


@pytest.mark.parametrize("make,message", [
    (lambda: Job(recompute="some"), "unknown --recompute 'some'; choose none, selective, full"),
    (lambda: Job(attention="sdpa"), "unknown --attention 'sdpa'; choose eager, flash"),
    (lambda: Job(sp=1), "sequence parallelism must be true or false, got 1"),
    (lambda: Job(zero=4), "--zero must be one of 0, 1, 2, 3, got 4"),
    (lambda: Job(zero=True), "--zero must be one of 0, 1, 2, 3, got True"),
    (lambda: Job(ParallelDims(dp=0)), "dp must be a positive integer, got 0"),
    (lambda: Job(dims=(1, 2)), "a job's dims must be ParallelDims, got tuple"),
    (lambda: Job(comm=None), "a job's comm must be CommOptions and its kernels KernelSwitches"),
])
def test_each_range_check_is_one_line(make, message):
    with pytest.raises(PipesimError) as err:
        make()
    assert str(err.value) == message


@pytest.mark.parametrize("job,model,m,message", [
    (Job(ParallelDims(dp=3)), GPT, 4, "--batch 16 does not split into dp(3) x 4 microbatches evenly"),
    (Job(), GPT, 0, "microbatches must be a positive integer, got 0"),
    (Job(ParallelDims(tp=5)), MLP, None, "--hidden 96 is not divisible by tp(5)"),
    (Job(ParallelDims(tp=3)), GPT, None, "--hidden 256 is not divisible by tp(3)"),
    (Job(ParallelDims(tp=16)), GPT, None, "--heads 8 is not divisible by tp(16)"),
    (Job(ParallelDims(tp=8)), GPT, None, "--kv-heads 4 is not divisible by tp(8)"),
    (Job(ParallelDims(tp=2)), ModelConfig(kind="gpt", hidden=256, heads=8, ffn_hidden=771), None,
     "--ffn-hidden 771 is not divisible by tp(2)"),
    (Job(ParallelDims(cp=2)), GPT, None, "--cp 2 needs --attention flash (ring attention runs the fused kernel)"),
    (Job(ParallelDims(cp=3), attention="flash"), GPT, None,
     "--seq 64 is not divisible by 2 x cp(3) (ring attention's load-balanced causal split)"),
    (Job(ParallelDims(tp=4, cp=2), sp=True, attention="flash"), replace(GPT, seq=20), None,
     "--seq 20 / cp(2) is not divisible by tp(4) (sequence parallelism splits the sequence over tp)"),
    (Job(sp=True), MLP, None, f"--sequence-parallel {NOT_MLP}"),
    (Job(ParallelDims(cp=2)), MLP, None, f"--cp {NOT_MLP}"),
    (Job(recompute="full"), MLP, None, f"--recompute {NOT_MLP}"),
    (Job(kernels=KernelSwitches(grad_fp32=False)), MLP, None,
     "--grad-reduce-in-bf16 needs a bfloat16 model (--dtype bfloat16), got float32"),
])
def test_each_divisibility_check_is_one_line(job, model, m, message):
    with pytest.raises(PipesimError) as err:
        job.check(model, m)
    assert str(err.value) == message


def test_a_job_that_fits_passes_and_gives_its_microbatch_size():
    job = Job(ParallelDims(dp=2, tp=4, cp=2), sp=True, attention="flash", recompute="selective", zero=1)
    job.check(GPT, 4)
    assert job.microbatch_size(GPT, 4) == 2
    assert job.layer_options(GPT).tp == 4 and job.layer_options(MLP) is None


def test_hand_given_costs_refuse_bf16_gradients_without_a_model():
    with pytest.raises(PipesimError, match=r"^--grad-reduce-in-bf16 needs a bfloat16 model \(--dtype bfloat16\), "
                                           r"got no model$"):
        Job(kernels=KernelSwitches(grad_fp32=False)).check_gradients(None)
    Job(kernels=KernelSwitches(grad_fp32=False)).check_gradients(GPT)


def test_equal_jobs_are_one_key():
    a = Job(ParallelDims(dp=2, tp=2), recompute="full", comm=CommOptions(overlap_grad_reduce=True))
    b = Job(ParallelDims(dp=2, tp=2), recompute="full", comm=CommOptions(overlap_grad_reduce=True))
    assert a == b and a is not b and hash(a) == hash(b)
    assert len({a: 1, b: 2}) == 1
    assert a != Job(ParallelDims(dp=2, tp=2), recompute="full")


def test_with_pp_changes_only_the_pipeline():
    job = Job(ParallelDims(dp=2, tp=4), sp=True)
    assert job.with_pp(1) is job
    eight = job.with_pp(8)
    assert eight.dims == ParallelDims(pp=8, dp=2, tp=4) and eight.sp and eight.with_pp(1) == job
    whole = Job(ParallelDims(pp=4, dp=2, tp=2, cp=2), zero=1, sp=True)
    assert whole.per_stage() == Job(ParallelDims(tp=2, cp=2), sp=True)  # what a stage's seconds depend on


def test_resolve_attention_is_flash_on_gpus_at_16_bits_only():
    assert Job().resolve_attention(True, GPT).attention == "flash"
    assert Job().resolve_attention(False, GPT).attention == "eager"  # a CPU host
    assert Job().resolve_attention(True, MLP).attention == "eager"  # float32
    assert Job().resolve_attention(True, None).attention == "eager"  # hand-given costs
    assert Job(attention="eager").resolve_attention(True, GPT).attention == "eager"  # a given kernel stays
    assert Job().attention_kernel == "eager"


def test_flags_read_back_through_the_cli_to_the_same_job():
    job = Job(ParallelDims(dp=2, tp=2), recompute="selective", sp=True, attention="flash", zero=1,
              comm=CommOptions(scatter_gather=True, overlap_grad_reduce=True, ddp_bucket_size=10**6, blocking_p2p=True),
              kernels=KernelSwitches(fusion=False, tp_comm_overlap=False, grad_accum_fusion=False, grad_fp32=False))
    argv = ["simulate", "1f1b", "--model", "gpt", "--dtype", "bfloat16", "--dp", "2", "--tp", "2", *job.flags()]
    args = build_parser().parse_args(argv)
    assert sim_job(args, GPT, load_hardware("dgx-h100")) == job
    plain = build_parser().parse_args(["simulate", "1f1b", *Job().flags()])
    assert sim_job(plain, GPT, load_hardware("dgx-h100")) == Job(attention="flash")
