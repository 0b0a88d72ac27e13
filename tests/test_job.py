"""The Job (pipesim.job): each range and divisibility check once, with the one-line message users get; a frozen,
hashable value (the planner's cache key); with_pp, the attention default, and its flags read back by the CLI."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesim.cli import build_parser, main
from pipesim.comm.comm_options import CommOptions
from pipesim.commands.setup_args import sim_job
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.kernel_switches import KernelSwitches
from pipesim.model.config import ModelConfig
from pipesim.model.fp8 import Fp8Options
from pipesim.model.moe import MoeConfig
from pipesim.model.options import LayerOptions
from pipesim.parallel_dims import ParallelDims

GPT = ModelConfig(kind="gpt", hidden=256, layers=4, heads=8, kv_heads=4, ffn_hidden=768, seq=64, vocab=512, batch=16,
                  dtype="bfloat16")
MLP = ModelConfig(kind="mlp", hidden=96, layers=4, batch=16)
MOE = replace(GPT, moe=MoeConfig(experts=8, top_k=2, expert_ffn=512))
NOT_MLP = "needs a transformer (--model gpt or --model-config), not --model mlp"


@pytest.mark.parametrize("make,message", [
    (lambda: Job(recompute="some"), "unknown --recompute 'some'; choose none, selective, full, op"),
    (lambda: Job(attention="sdpa"), "unknown --attention 'sdpa'; choose eager, flash, flash2"),
    (lambda: Job(sp=1), "sequence parallelism must be true or false, got 1"),
    (lambda: Job(zero=4), "--zero must be one of 0, 1, 2, 3, got 4"),
    (lambda: Job(zero=True), "--zero must be one of 0, 1, 2, 3, got True"),
    (lambda: Job(ParallelDims(dp=0)), "dp must be a positive integer, got 0"),
    (lambda: Job(dims=(1, 2)), "a job's dims must be ParallelDims, got tuple"),
    (lambda: Job(comm=None), "a job's comm must be CommOptions and its kernels KernelSwitches"),
    (lambda: Job(ParallelDims(dp=2, ep=4)),
     "dp(2) * tp(1) is not divisible by ep(4) * etp(1): a stage's ranks are etp x ep x edp to its experts"),
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
    (Job(ParallelDims(dp=2, ep=2)), GPT, None, "--ep 2 needs a mixture-of-experts model"),
    (Job(ParallelDims(dp=2, ep=2)), MLP, None, "--ep 2 needs a mixture-of-experts model"),
    (Job(ParallelDims(tp=2, etp=2)), GPT, None, "--etp 2 needs a mixture-of-experts model"),  # given, even = tp
    (Job(ParallelDims(dp=3, ep=3)), MOE, None, "--ep 3 does not divide the 8 experts"),
    (Job(ParallelDims(dp=3, etp=3)), MOE, None, "--etp 3 does not divide the expert width 512"),
    (Job(ParallelDims(tp=2)), replace(MOE, moe=MoeConfig(experts=8, top_k=2, expert_ffn=511)), None,
     "--tp 2 (--etp's default) does not divide the expert width 511"),
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


def test_a_moe_job_that_fits_passes_and_gives_the_layers_its_experts_layout():
    job = Job(ParallelDims(dp=4, tp=2, ep=4, etp=1), sp=True, attention="flash")
    job.check(MOE, 2)
    assert job.ep == 4 and job.dims.edp == 2
    opts = job.layer_options(MOE)
    assert (opts.tp, opts.ep, opts.etp) == (2, 4, 1)
    default = Job(ParallelDims(dp=2, tp=2, ep=2), sp=True).layer_options(MOE)
    assert (default.ep, default.etp) == (2, 2)  # etp: tp's
    assert Job(ParallelDims(tp=2)).layer_options(GPT) == LayerOptions(tp=2)  # a dense model's as before


def test_per_stage_keeps_the_expert_layout():
    job = Job(ParallelDims(pp=4, dp=4, tp=2, ep=4, etp=1), zero=1, sp=True)
    assert job.per_stage() == Job(ParallelDims(dp=4, tp=2, ep=4, etp=1), sp=True)  # the experts' edp needs dp
    assert Job(ParallelDims(pp=4, dp=4, tp=2, etp=2)).per_stage().dims == ParallelDims(dp=4, tp=2, etp=2)


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
              comm=CommOptions(scatter_gather=True, overlap_grad_reduce=True, ddp_bucket_size=10**6, blocking_p2p=True,
                               overlap_p2p_comm=True, overlap_param_gather=True),
              kernels=KernelSwitches(fusion=False, tp_comm_overlap=False, grad_accum_fusion=False, grad_fp32=False))
    argv = ["simulate", "1f1b", "--model", "gpt", "--dtype", "bfloat16", "--dp", "2", "--tp", "2", *job.flags()]
    args = build_parser().parse_args(argv)
    assert sim_job(args, GPT, load_hardware("dgx-h100")) == job
    sharded = Job(ParallelDims(dp=2), zero=3, attention="flash", fsdp_reshard="always",
                  kernels=KernelSwitches(dtensor_tp=True))
    fp8 = Job(ParallelDims(dp=2), zero=1, attention="flash", fp8=Fp8Options("hybrid", "tensorwise"),
              fp8_param_gather=True)
    for job in (sharded, fp8):
        argv = ["simulate", "1f1b", "--model", "gpt", "--dtype", "bfloat16", "--dp", "2", *job.flags()]
        assert sim_job(build_parser().parse_args(argv), GPT, load_hardware("dgx-h100")) == job
    plain = build_parser().parse_args(["simulate", "1f1b", *Job().flags()])
    assert sim_job(plain, GPT, load_hardware("dgx-h100")) == Job(attention="flash")


def test_expert_flags_read_back_through_the_cli_to_the_same_job():
    job = Job(ParallelDims(dp=4, tp=2, ep=4, etp=1), sp=True, attention="flash")
    assert job.flags() == ["--ep", "4", "--etp", "1", "--sequence-parallel", "--attention", "flash"]
    argv = ["simulate", "1f1b", "--dp", "4", "--tp", "2", *job.flags()]
    assert sim_job(build_parser().parse_args(argv), MOE, load_hardware("dgx-h100")) == job
    default = build_parser().parse_args(["simulate", "1f1b", "--dp", "2", "--ep", "2"])
    assert sim_job(default, MOE, None).dims == ParallelDims(dp=2, ep=2)  # etp None: tp's
    assert Job(ParallelDims(dp=2, ep=2)).flags() == ["--ep", "2"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--dp", "2", "--ep", "2"], "--ep 2 needs a mixture-of-experts model"),
    (["--tp", "2", "--etp", "1"], "--etp 1 needs a mixture-of-experts model"),
    (["--dp", "2", "--ep", "4"],
     "dp(2) * tp(1) is not divisible by ep(4) * etp(1): a stage's ranks are etp x ep x edp to its experts"),
])
def test_simulate_refuses_a_bad_expert_layout_in_one_line(flags, message, capsys):
    argv = ["simulate", "1f1b", "-p", "2", "-m", "4", "--model", "gpt", "--layers", "2", "--batch", "8", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"pipesim: error: {message}\n"


def test_simulate_help_documents_ep_and_etp(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines, and inside hyphenated words
    for text in ("--ep N expert-parallel ranks: experts sharded over N ranks (Megatron-core's "
                 "--expert-model-parallel-size)",
                 "--etp N tensor parallelism inside each expert (--expert-tensor-parallel-size; default --tp)"):
        assert "".join(text.split()) in out
    for bad in ("0", "x"):
        with pytest.raises(SystemExit):
            main(["simulate", "1f1b", "--ep", bad])
        assert "--ep" in capsys.readouterr().err
