"""`pipesim run`: config errors exit 2 before launching; `--then` chains; progress. (Launches: test_executor_pp.py.)"""

from __future__ import annotations

import argparse
import fcntl
import io
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from dataclasses import fields

import pytest

from executor.launch import torchrun_command
from executor.progress_bar import Progress
from executor.run_config import RunConfig, configs_from_json, configs_to_json
from pipesim.cli import main
from pipesim.comm.comm_options import CommOptions
from pipesim.commands.run_args import add_run_args, config_from_args, configs_from_args
from pipesim.errors import PipesimError
from pipesim.job import Job
from pipesim.kernel_switches import KernelSwitches
from pipesim.model.config import ModelConfig
from pipesim.model.latent_attention import LatentAttention
from pipesim.model.moe import MoeConfig
from pipesim.parallel_dims import ParallelDims


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_run_args(parser)
    return parser


@pytest.mark.parametrize(("argv", "message"), [
    (["interleaved-1f1b", "--nproc", "2", "--microbatches", "3", "--batch", "6"], "interleaved"),
    (["1f1b", "--nproc", "3", "--dp", "2"], "WORLD_SIZE(3) is not divisible by dp(2) * tp(1)"),
    (["1f1b", "--nproc", "4", "--stages", "4", "--dp", "2"], "dp(2) * pp(4) * tp(1) != WORLD_SIZE(4)"),
    (["1f1b", "--nproc", "4", "--layers", "3"], "--layers 3 is fewer than the 4 stages"),
    (["1f1b", "--nproc", "2", "--batch", "6", "--microbatches", "4"], "--batch 6 does not split into"),
    (["1f1b", "--nproc", "4", "--tp", "2", "--layers", "6"], "layers per stage [3, 3] must all be even"),
    (["1f1b", "--nproc", "2", "--layer-split", "3,3", "--layers", "8"], "layer split [3, 3] must have 2"),
    (["1f1b", "--nproc", "2", "--batch", "8", "--microbatch-size", "3"],
     "--batch 8 does not split into dp(1) x microbatches of --microbatch-size 3\n"),
    (["1f1b", "--nproc", "2", "--microbatch-size", "3"],  # an untyped batch: the line says it was the default
     "--batch 64 does not split into dp(1) x microbatches of --microbatch-size 3 (--batch 64 is the default: give "
     "--batch)\n"),
    (["1f1b", "--nproc", "2", "--batch", "8", "--microbatch-size", "2", "--microbatches", "2"],
     "--microbatches 2 and --microbatch-size 2 disagree: dp(1) x 2 x 2 = 4, not --batch 8"),
])
def test_config_errors_exit_2_without_launching(argv, message, capsys):
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipesim: error: ")
    assert message in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--fail-rank", "5"], "--fail-rank 5: the run has ranks 0 to 1"),
    (["--fail-rank", "-1"], "--fail-rank -1: the run has ranks 0 to 1"),
    (["--pg-timeout", "-1"], "--pg-timeout must be between 0 and"),
    (["--pg-timeout", "nan"], "--pg-timeout must be between 0 and"),
    (["--lr", "nan"], "--lr must be a positive finite number, got nan"),
    (["--lr", "-0.1"], "--lr must be a positive finite number, got -0.1"),
    (["--recompute", "selective"], "--recompute selective re-runs the attention core, which --model mlp does not"),
])
def test_out_of_range_numbers_are_refused_before_launching(argv, message, capsys):
    assert main(["run", "1f1b", "--nproc", "2", "--microbatches", "4", "--batch", "8", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize(("argv", "microbatches"), [
    (["--batch", "16", "--dp", "2", "--microbatch-size", "2"], 4),  # m = batch / (dp x N), as simulate resolves it
    (["--batch", "16"], 8),  # neither: 8
    (["--batch", "16", "--microbatches", "2"], 2)])
def test_run_takes_the_microbatch_size_as_simulate_does(argv, microbatches):
    config = config_from_args(_parser().parse_args(["1f1b", *argv]))
    assert config.microbatches == microbatches


def test_launch_command_carries_the_config_as_one_json_argument():
    args = _parser().parse_args(["zb-h1", "--microbatches", "8", "--dp", "2", "--model", "gpt", "--layers", "6",
                                 "--layer-split", "4,2", "--steps", "5", "--lr", "0.1", "--json", "r.json"])
    cfg = config_from_args(args)
    assert cfg == RunConfig(names=("zb-h1",), microbatches=8, job=Job(dims=ParallelDims(dp=2)),
                            model=ModelConfig(kind="gpt", layers=6), layer_split=(4, 2), steps=5, lr=0.1,
                            json="r.json")
    assert config_from_args(_parser().parse_args(["1f1b", "--recompute", "full"])).job.recompute == "full"
    built = config_from_args(_parser().parse_args(["1f1b", "--stages", "2", "--tp", "2", "--sequence-parallel"]))
    assert built.job == Job(dims=ParallelDims(pp=2, tp=2), sp=True) and built.stages == 2
    cmd = torchrun_command(cfg, 4)
    assert cmd[:10] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "-m",
                        "executor", "--config", cmd[9]] and len(cmd) == 10
    assert configs_from_json(cmd[9]) == [cfg]
    sent = json.loads(cmd[9])[0]
    assert list(sent) == [f.name for f in fields(RunConfig)]  # every field once, by its dataclass name
    assert list(sent["model"]) == [f.name for f in fields(ModelConfig)] and sent["layer_split"] == [4, 2]
    assert sent["job"]["dims"] == {"pp": 1, "dp": 2, "tp": 1, "cp": 1, "ep": 1, "etp": None}


def test_the_job_crosses_to_the_workers_exactly():
    """Every Job field, nested ParallelDims, CommOptions and KernelSwitches included, round-trips through the JSON
    the workers read (to_dict/from_dict), to an equal (and equally hashed) Job."""
    job = Job(dims=ParallelDims(pp=2, dp=3, tp=2, cp=2), recompute="selective", sp=True, attention="flash", zero=3,
              comm=CommOptions(scatter_gather=True, overlap_grad_reduce=True, ddp_bucket_size=123, blocking_p2p=True),
              kernels=KernelSwitches(fusion=False, tp_comm_overlap=False, grad_accum_fusion=False, grad_fp32=False))
    cfg = RunConfig(names=("1f1b",), stages=2, job=job, model=ModelConfig(kind="gpt", dtype="bfloat16"))
    back = configs_from_json(configs_to_json([cfg, RunConfig(names=("gpipe",))]))
    assert back == [cfg, RunConfig(names=("gpipe",))] and back[0].job == job and hash(back[0].job) == hash(job)
    assert isinstance(back[0].job.dims, ParallelDims) and isinstance(back[0].job.kernels, KernelSwitches)
    with pytest.raises(PipesimError, match=r"^unknown run configuration job dims field\(s\): xp$"):
        configs_from_json('{"job": {"dims": {"xp": 2}}}')
    with pytest.raises(PipesimError, match=r"^the job's pp\(4\) is not stages\(2\): give the pipeline ranks as "):
        RunConfig(stages=2, job=Job(dims=ParallelDims(pp=4)))


@pytest.mark.parametrize(("job", "flags"), [
    (Job(zero=1), "--zero 1"),
    (Job(dims=ParallelDims(cp=2)), "--cp 2"),
    (Job(attention="flash"), "--attention flash"),
    (Job(attention="eager"), "--attention eager"),
    (Job(comm=CommOptions(scatter_gather=True)), "--scatter-gather"),
    (Job(comm=CommOptions(overlap_grad_reduce=True, ddp_bucket_size=8)), "--overlap-grad-reduce --ddp-bucket-size 8"),
    (Job(comm=CommOptions(blocking_p2p=True)), "--blocking-p2p"),
    (Job(kernels=KernelSwitches(fusion=False)), "--no-kernel-fusion"),
    (Job(kernels=KernelSwitches(grad_fp32=True)), "--accumulate-allreduce-grads-in-fp32"),
    (Job(recompute="full", sp=True, zero=2, kernels=KernelSwitches(tp_comm_overlap=False)),
     "--zero 2 --no-async-tensor-model-parallel-allreduce"),
])
def test_job_options_the_executor_cannot_run_are_refused_by_flag(job, flags):
    cfg = RunConfig(names=("1f1b",), microbatches=4, job=job, model=ModelConfig(batch=8))
    with pytest.raises(PipesimError, match="^the executor does not implement ") as err:
        cfg.check(2)
    assert f"does not implement {flags}: it trains with plain DDP" in str(err.value) and "\n" not in str(err.value)
    RunConfig(names=("1f1b",), microbatches=4, job=Job(recompute="full", sp=True, dims=ParallelDims(tp=2)),
              model=ModelConfig(batch=8, layers=4)).check(4)  # what it does run


def test_the_executor_refuses_latent_attention_mtp_and_experts_without_a_moe_model_in_one_line():
    moe = ModelConfig(kind="gpt", hidden=64, heads=4, layers=2, batch=8, moe=MoeConfig(experts=4, top_k=2,
                                                                                      expert_ffn=128))
    for job, flags in ((Job(dims=ParallelDims(dp=2, ep=2)), "--ep 2"),
                       (Job(dims=ParallelDims(tp=2, etp=1)), "--etp 1")):
        with pytest.raises(PipesimError) as err:
            RunConfig(names=("1f1b",), microbatches=4, job=job, model=ModelConfig(batch=8)).check(2)
        assert str(err.value) == (f"{flags} shards a mixture-of-experts model's experts; this model has none "
                                  "(--model moe)")
    mla = ModelConfig(kind="gpt", hidden=64, heads=4, layers=2, batch=8, norm="rmsnorm", dropout=False, biases=False,
                      positions="rope", mla=LatentAttention(None, 32, 16, 8, 16))
    for model, what in ((mla, "multi-head latent attention"),
                        (ModelConfig(kind="gpt", hidden=64, heads=4, layers=2, batch=8, positions="rope", mtp_layers=1),
                         "multi-token prediction modules")):
        with pytest.raises(PipesimError) as err:
            RunConfig(names=("1f1b",), microbatches=4, model=model).check(2)
        assert str(err.value) == (f"the executor does not build {what}, which this model has (pipesim simulate "
                                  "takes it)")
    ep = RunConfig(names=("1f1b",), microbatches=4, job=Job(dims=ParallelDims(dp=2, ep=2)), model=moe)
    ep.check(2)  # the executor trains it (tests/test_moe_executor.py)
    assert configs_from_json(configs_to_json([ep])) == [ep]  # the experts' layout crosses to the workers as it is


def test_multi_node_launch_uses_the_c10d_rendezvous():
    cmd = torchrun_command(RunConfig(names=("1f1b",)), 8, nnodes=2, rdzv_endpoint="head:29500")
    assert cmd[3:13] == ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29500",
                         "--nproc-per-node", "8", "-m", "executor"]


def test_config_json_rejects_unknown_fields_and_bad_values():
    with pytest.raises(PipesimError, match=r"^unknown run configuration field\(s\): stage$"):
        configs_from_json('[{"names": ["1f1b"], "stage": 2}]')
    with pytest.raises(PipesimError, match=r"^unknown run configuration model field\(s\): width$"):
        configs_from_json('{"model": {"width": 8}}')
    with pytest.raises(PipesimError, match=r"^--hidden must be a positive integer, got 0$"):
        configs_from_json('{"model": {"hidden": 0}}')
    with pytest.raises(PipesimError, match=r"^cannot read the run configuration: "):
        configs_from_json("[{")


def test_print_config_writes_what_the_worker_reads(capsys):
    assert main(["run", "1f1b", "--nproc", "4", "--nnodes", "2", "--rdzv-endpoint", "h:1", "--dp", "2",
                 "--print-config", "--then", "gpipe", "--tp", "2", "--model", "gpt"]) == 0
    cfgs = configs_from_json(capsys.readouterr().out)
    assert [(c.names, c.job.dp, c.job.tp, c.model.kind, c.job_for(8).pp) for c in cfgs] == [
        (("1f1b",), 2, 1, "mlp", 4), (("gpipe",), 1, 2, "gpt", 4)]
    assert main(["run", "1f1b", "--nproc", "2", "--nnodes", "2"]) == 2
    assert "--nnodes 2 needs --rdzv-endpoint HOST:PORT" in capsys.readouterr().err


def test_then_chains_configurations_into_one_launch():
    parser = _parser()
    args = parser.parse_args(["1f1b", "--dp", "2", "--pg-timeout", "7", "--then", "gpipe", "--tp", "2", "--model",
                              "gpt", "--then", "zb-h1", "--steps", "5"])
    cfgs = configs_from_args(args)
    assert [(c.names, c.job.dp, c.job.tp, c.model.kind, c.steps, c.pg_timeout) for c in cfgs] == [
        (("1f1b",), 2, 1, "mlp", 3, 7.0), (("gpipe",), 1, 2, "gpt", 3, 7.0), (("zb-h1",), 1, 1, "mlp", 5, 7.0)]
    assert configs_from_json(torchrun_command(cfgs, 4)[-1]) == cfgs == configs_from_json(configs_to_json(cfgs))


@pytest.mark.parametrize(("argv", "message"), [
    (["1f1b", "--nproc", "2", "--then", "gpipe", "--pg-timeout", "5"], "give them before --then"),
    (["1f1b", "--nproc", "2", "--then", "gpipe", "--nproc", "2"], "after --then: unrecognized arguments: --nproc 2"),
    (["1f1b", "--nproc", "4", "--then", "1f1b", "--dp", "3"], "WORLD_SIZE(4) is not divisible by dp(3) * tp(1)"),
])
def test_then_errors_exit_2_without_launching(argv, message, capsys):
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_progress_is_a_bar_on_a_terminal_and_lines_elsewhere():
    plain = io.StringIO()
    progress = Progress("1f1b", 2, plain)
    progress(0, 0.5)
    progress(1, 0.25)
    progress.close()
    assert plain.getvalue() == ("executor: 1f1b step 1/2  0.5000 s (rank 0)\n"
                                "executor: 1f1b step 2/2  0.2500 s (rank 0)\n")
    leader, follower = pty.openpty()  # a real terminal, 120 columns wide
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    with os.fdopen(follower, "w") as tty:
        progress = Progress("zb-h1", 2, tty)
        progress(0, 0.5)
        progress(1, 0.25)
        progress.close()
    chunks = []
    while True:  # everything written, up to the EIO that follows the follower's close (Linux)
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    screen = b"".join(chunks).decode()
    assert "executor: zb-h1: 100%" in screen and "2/2" in screen and "0.2500 s/step" in screen
    assert "step 1/2" not in screen  # no plain lines on a terminal


def test_nccl_refuses_receives_out_of_send_order():
    from executor.run_config import check_transport_order
    from pipesim.errors import PipesimError
    from pipesim.ir import torch_csv

    swapped = torch_csv.loads(
        "0F0,0F1,0SEND_F0,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
        "1RECV_F1,1RECV_F0,1F0,1F1,1B0,1SEND_B0,1B1,1SEND_B1\n", "swapped.csv")
    check_transport_order(swapped, nccl=False)  # gloo matches by tag
    with pytest.raises(PipesimError, match=r"swapped.csv: ranks 0->1 receive in a different order than they send"):
        check_transport_order(swapped, nccl=True)
    in_order = torch_csv.loads(
        "0F0,0F1,0SEND_F0,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
        "1RECV_F0,1RECV_F1,1F0,1F1,1B0,1SEND_B0,1B1,1SEND_B1\n", "ok.csv")
    check_transport_order(in_order, nccl=True)


def test_rank_environment_fills_defaults_and_keeps_what_is_set():
    from executor.launch import rank_environment

    env = rank_environment({"OMP_NUM_THREADS": "4", "MALLOC_TRIM_THRESHOLD_": "0", "X": "1"})
    assert env == {"OMP_NUM_THREADS": "4", "MALLOC_TRIM_THRESHOLD_": "0", "X": "1", "PYTHONUNBUFFERED": "1",
                   "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}
    assert rank_environment({})["MALLOC_TRIM_THRESHOLD_"] == str(2**30)


@pytest.mark.dist
def test_rendezvous_endpoint_launch_trains(tmp_path):
    """`--rdzv-endpoint` (torchrun's c10d rendezvous, the multi-node path) on one node of 2 ranks, for real."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "pipesim", "run", "1f1b", "--nproc", "2", "--nnodes", "1",
                           "--rdzv-endpoint", f"127.0.0.1:{port}", "--microbatches", "2", "--model", "mlp",
                           "--hidden", "16", "--layers", "2", "--batch", "4", "--steps", "2",
                           "--pg-timeout", "20", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["schedule"], result["world_size"], result["pp"], len(result["losses"])) == ("1f1b", 2, 2, 2)
    assert "1f1b step 2/2" in proc.stderr  # rank 0's progress, relayed through the launcher (plain lines: no tty)


def test_the_executor_takes_a_llama_style_block_and_a_tied_head():
    """executor/transformer.py builds a Llama-style block and ties the head to the embedding (their training:
    tests/test_executor_structure.py); what it does not build is refused by name (the test above)."""
    llama = ModelConfig(kind="gpt", hidden=64, heads=4, layers=2, batch=8, kv_heads=2, ffn_hidden=96,
                        activation="swiglu", norm="rmsnorm", dropout=False, biases=False, positions="rope",
                        tied_embeddings=True)
    assert RunConfig(names=("1f1b",), microbatches=4, model=llama).check(2)[0].name == "1f1b"
