"""`pipesim plan`: the search space's arithmetic, pruning by memory before any simulation, the
estimate's order under a cap, ranking, the exports (the simulate command reproduces the step time;
the torchtitan section parses as TOML), and one-line refusals."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import replace

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport (a dependency there)
    import tomli as tomllib

from pipesim.cli import build_parser, main
from pipesim.comm.comm_options import CommOptions
from pipesim.commands.common import model_config
from pipesim.commands.run_args import config_from_args
from pipesim.cost.model_costs import precision_of
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.plan.estimate import estimate, optimizer_tail
from pipesim.plan.evaluate import Evaluator
from pipesim.plan.exports import megatron_args
from pipesim.plan.ranking import why_lost
from pipesim.plan.search import plan
from pipesim.plan.space import NoLayout, PlanRequest, enumerate_candidates, layouts
from pipesim.plan.torchtitan_export import torchtitan_toml

SMALL = ["--model", "gpt", "--hidden", "512", "--layers", "8", "--heads", "8", "--seq", "512", "--vocab", "8000",
         "--batch", "16", "--dtype", "bfloat16"]
# 13B-ish: some layouts of 8 H100s are over 80 GiB, others fit
BIG = ModelConfig(kind="gpt", hidden=8192, layers=16, heads=64, seq=2048, vocab=32000, batch=16, dtype="bfloat16")
SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1")


def big_request(**kw) -> PlanRequest:
    return PlanRequest(BIG, load_hardware("dgx-h100"), 8, SCHEDULES, None, ("none", "full"), (0, 1), **kw)


class CountingEvaluator(Evaluator):
    """The real Evaluator, recording what it is asked to simulate."""

    def __init__(self, req):
        super().__init__(req)
        self.calls = []

    def simulate(self, costed):
        self.calls.append(costed)
        return super().simulate(costed)


def test_space_divides_model_batch_and_cluster():
    cands = enumerate_candidates(big_request())
    assert cands
    for c in cands:
        assert c.tp * c.p * c.dp == 8 and 8 % c.tp == 0
        assert BIG.heads % c.tp == 0 and c.p * c.v <= BIG.layers  # uneven splits by default
        assert BIG.batch == c.dp * c.mbs * c.m
        assert c.dp > 1 or c.zero == 0
        assert c.p > 1 or c.schedule == "1f1b"
        assert (c.v > 1) == (c.schedule == "interleaved-1f1b")
    assert {(c.tp, c.p, c.dp) for c in cands} == {(t, p, 8 // (t * p)) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8)
                                                if 8 % (t * p) == 0}
    assert {c.sp for c in cands if c.tp > 1} == {True} and not any(c.sp for c in cands if c.tp == 1)
    even = enumerate_candidates(PlanRequest(BIG, load_hardware("dgx-h100"), 8, SCHEDULES, uneven=False))
    assert even and all(BIG.layers % (c.p * c.v) == 0 for c in even)
    assert set(even) < set(enumerate_candidates(PlanRequest(BIG, load_hardware("dgx-h100"), 8, SCHEDULES)))


def test_no_candidate_over_memory_is_simulated():
    req = big_request()
    ev = CountingEvaluator(req)
    result = plan(req, max_candidates=10_000, max_work=10**9, progress=False, evaluator=ev)
    cap = req.hardware.device.memory
    assert result.counts["over_memory_bound"] > 0
    assert all(c.peak_memory <= cap for c in ev.calls)
    # exactly the candidates that fit are simulated (no cap): computed independently, candidate by candidate
    fresh = Evaluator(req)
    fitting = set()
    for c in enumerate_candidates(req):
        try:
            costed = fresh.cost(c)
        except Exception:  # refused by its schedule (counted separately)
            continue
        if costed.peak_memory <= cap:
            fitting.add(c)
    assert {c.candidate for c in ev.calls} == fitting
    assert len(ev.calls) == result.counts["simulated"] == len(result.rows)


def test_rows_ranked_by_simulated_step_time_and_cap_keeps_estimate_order():
    req = big_request()
    full = plan(req, max_candidates=10_000, max_work=10**9, progress=False)
    times = [r.step_time for r in full.rows]
    assert times == sorted(times)
    best = full.best
    for r in full.rows:
        assert sum(r.parts.values()) == pytest.approx(r.step_time, rel=1e-12)
        if r is not best:
            assert why_lost(r, best).startswith(f"+{(r.step_time - best.step_time) * 1e3:.2f} ms: ")
    ev = CountingEvaluator(req)
    capped = plan(req, max_candidates=7, progress=False, evaluator=ev)
    k = capped.counts
    assert len(ev.calls) == 7
    assert k["not_simulated_cap"] == k["fits_memory_bound"] - 7 - k["over_memory"] - k["refused_by_schedule"]
    estimates = [_estimate(ev, c.candidate) for c in ev.calls]
    assert estimates == sorted(estimates)
    # every candidate left out is estimated no faster than the last one simulated
    simulated = {c.candidate for c in ev.calls}
    rest = [r for r in full.rows if r.candidate not in simulated]
    assert all(_estimate(ev, r.candidate) >= estimates[-1] for r in rest)


def _estimate(ev, c):
    """The search's ordering key for `c` (estimate with the optimizer tail)."""
    req = ev.req
    tail = optimizer_tail(c, ev.bounds.params(c.p * c.v, c.tp), precision_of(req.model), req.hardware,
                          loss_scaling=req.model.dtype == "float16")
    return estimate(c, ev.chunk_seconds(c), tail)


def test_schedule_objects_are_shared_across_configurations():
    req = big_request()
    ev = Evaluator(req)
    result = plan(req, max_candidates=10_000, max_work=10**9, progress=False, evaluator=ev)
    walked = [r.candidate for r in result.rows] + [c for c, _ in result.over]
    keys = {c.schedule_key for c in walked}
    assert ev.schedules_built == len(keys) < len(walked)


def test_exported_command_reproduces_step_time(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", *SMALL, "--hardware", "dgx-h100", "--gpus", "4", "--schedules", "1f1b,interleaved-1f1b",
                 "--top", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["schema"] == "pipesim.plan/1" and len(data["rows"]) == 3
    assert data["rows"][0]["why"] == "fastest" and all(r["why"] for r in data["rows"])
    assert "winner as a pipesim command" in text and data["winner"]["simulate_command"] in text
    argv = shlex.split(data["winner"]["simulate_command"])
    assert argv[:2] == ["pipesim", "simulate"]
    assert main(argv[1:] + ["--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["step_time"] == data["rows"][0]["step_time"]
    best = data["rows"][0]
    assert (sim["mfu"], sim["tflops_per_gpu"]) == (best["mfu"], best["tflops_per_gpu"])  # one definition of both
    assert sim["hfu"] > sim["mfu"]  # flash's diagonal tiles (and any recomputation) executed, not counted by MFU
    assert best["tokens_per_s"] == 16 * 512 / best["step_time"]
    assert 0 < best["mfu"] < 1 and best["peak_memory"] <= data["device_memory"]
    run_argv = shlex.split(data["winner"]["run_command"])  # the run export: pipesim run's own parser takes it
    assert run_argv[:3] == ["pipesim", "run", argv[2]] and data["winner"]["run_command"] in text
    ns = build_parser().parse_args(run_argv[1:])
    assert (ns.stages, ns.tp, ns.dp, ns.backend, ns.nproc) == (best["pp"], best["tp"], best["dp"], "nccl", 4)
    assert ns.microbatches * best["microbatch_size"] * best["dp"] == 16 and ns.recompute == best["recompute"]


@pytest.mark.parametrize("framework", ["nemo", "torchtitan"])
def test_a_plan_for_a_framework_exports_a_command_that_reproduces_it(capsys, tmp_path, framework):
    """--framework's switches reach every candidate and the winner's simulate command (NeMo's overlapped parameter
    gather only where the candidate has the distributed optimizer; torchtitan's kernel switches)."""
    out = tmp_path / "plan.json"
    assert main(["plan", *SMALL, "--hardware", "dgx-h100", "--gpus", "4", "--schedules", "1f1b,interleaved-1f1b",
                 "--framework", framework, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    argv = shlex.split(data["winner"]["simulate_command"])
    assert "--framework" not in argv  # typed out, so the command says what it times
    if framework == "torchtitan":
        assert {"--no-kernel-fusion", "--no-gradient-accumulation-fusion"} <= set(argv)
    else:
        assert "--blocking-p2p" in argv and "--overlap-grad-reduce" in argv
    capsys.readouterr()
    assert main(argv[1:] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == data["rows"][0]["step_time"]


def test_a_cpu_host_plan_under_a_gpu_profile_exports_a_command_simulate_takes(capsys, tmp_path):
    """nemo's kernel switches (its fused cross-entropy, Transformer Engine's linears) act on GPU kernels only, and its
    float32 gradient reduction on a 16-bit model only: on local-cpu with a float32 model the winner's command leaves
    them out (simulate refuses them typed there) and reproduces the plan's step."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "gpt", "--hidden", "128", "--layers", "4", "--heads", "4", "--seq", "64",
                 "--batch", "16", "--hardware", "local-cpu", "--framework", "nemo", "--max-candidates", "3", "--top",
                 "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    argv = shlex.split(data["winner"]["simulate_command"])
    for flag in ("--cross-entropy-loss-fusion", "--transformer-impl", "--accumulate-allreduce-grads-in-fp32"):
        assert flag not in argv
    assert "--overlap-grad-reduce" in argv or data["rows"][0]["dp"] == 1
    capsys.readouterr()
    assert main(argv[1:] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == data["rows"][0]["step_time"]


def test_the_exports_kernel_path_switches_are_the_ones_a_cpu_host_refuses():
    """KernelSwitches.flags(gpu=False) drops exactly the flags model_switches.KERNEL_PATH_ONLY refuses typed: with every
    kernel-path switch on, the GPU spelling has each of them (or its negation) and the CPU one none."""
    from pipesim.commands.model_switches import KERNEL_PATH_ONLY
    from pipesim.kernel_switches import KernelSwitches
    from pipesim.model.cuda_graphs import CudaGraphs

    every = KernelSwitches(fusion=False, grad_accum_fusion=False, ce_fusion=True, eager_rmsnorm=True, te_linear=True,
                           cuda_graphs=CudaGraphs("local"))
    gpu, cpu = every.flags(), every.flags(gpu=False)
    assert {f for f in gpu if f.startswith("--")} & set(KERNEL_PATH_ONLY) == set(KERNEL_PATH_ONLY) - {
        "--compile", "--no-cross-entropy-loss-fusion"}  # the two spellings of a default the export never types
    assert not set(cpu) & set(KERNEL_PATH_ONLY)


def test_bf16_main_gradients_are_planned_and_exported(capsys, tmp_path):
    """--grad-reduce-in-bf16: 2-byte gradients in the plan's memory and times, and in every export."""
    base = [*SMALL, "--hardware", "dgx-h100", "--gpus", "4", "--schedules", "1f1b", "--zero", "0",
            "--recompute", "none", "--max-tp", "1", "--top", "20"]
    rows = {}
    for name, extra in (("fp32", []), ("bf16", ["--grad-reduce-in-bf16"])):
        out = tmp_path / f"{name}.json"
        assert main(["plan", *base, *extra, "--json", str(out)]) == 0
        capsys.readouterr()
        rows[name] = json.loads(out.read_text())
    data = rows["bf16"]
    argv = shlex.split(data["winner"]["simulate_command"])
    assert "--grad-reduce-in-bf16" in argv and "--grad-reduce-in-bf16" not in rows["fp32"]["winner"]["simulate_command"]
    assert main(argv[1:] + ["--json"]) == 0  # the export reproduces the planned step, bit for bit
    sim = json.loads(capsys.readouterr().out)
    assert sim["step_time"] == data["rows"][0]["step_time"]
    assert "--grad-reduce-in-bf16" in data["winner"]["megatron_args"]
    assert tomllib.loads(data["winner"]["torchtitan_toml"])["training"]["mixed_precision_reduce"] == "bfloat16"
    # the same layouts: each needs 2 bytes less per parameter of its gradients (zero 0: all of them on a rank)
    key = ("pp", "dp", "microbatch_size")
    fp32 = {tuple(r[k] for k in key): r["peak_memory"] for r in rows["fp32"]["rows"]}
    bf16 = {tuple(r[k] for k in key): r["peak_memory"] for r in data["rows"]}
    assert set(fp32) == set(bf16) and all(bf16[k] < fp32[k] for k in fp32)


def test_tokens_per_step_and_memory_headroom(capsys, tmp_path):
    """--tokens-per-step T is --batch T / seq; --memory-headroom f plans on (1 - f) of each GPU's memory."""
    base = [a for a in SMALL if a not in ("--batch", "16")]
    runs = {}
    for name, extra in (("batch", ["--batch", "16"]), ("tokens", ["--tokens-per-step", str(16 * 512)]),
                        ("headroom", ["--batch", "16", "--memory-headroom", "0.25"])):
        out = tmp_path / f"{name}.json"
        assert main(["plan", *base, *extra, "--hardware", "dgx-h100", "--gpus", "4", "--schedules", "1f1b",
                     "--json", str(out)]) == 0
        runs[name] = json.loads(out.read_text())
    assert runs["tokens"]["rows"] == runs["batch"]["rows"]
    assert runs["headroom"]["device_memory"] == int(load_hardware("dgx-h100").device.memory * 0.75)
    assert main(["plan", *base, "--batch", "16", "--tokens-per-step", "8192", "--hardware", "dgx-h100"]) == 2
    assert main(["plan", *base, "--tokens-per-step", "1000", "--hardware", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert "give the global batch once" in err and "--tokens-per-step 1000 is not a multiple of --seq 512" in err


def test_torchtitan_and_megatron_exports():
    req = big_request()
    best = plan(req, progress=False).best.candidate
    toml = tomllib.loads(torchtitan_toml(best, req))
    par = toml["parallelism"]
    assert par["pipeline_parallel_degree"] == best.p and par["tensor_parallel_degree"] == best.tp
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == best.dp
    assert par["pipeline_parallel_microbatch_size"] == best.mbs
    assert "pipeline_parallel_schedule" in par or "pipeline_parallel_schedule_csv" in par
    local = best.mbs if best.p == 1 else 16 // best.dp  # torchtitan accumulates forwards of local_batch_size
    assert toml["training"] == {"local_batch_size": local, "global_batch_size": 16, "seq_len": 2048}
    steps = 16 // (local * best.dp)  # torchtitan/train.py's gradient_accumulation_steps
    assert steps * (local // best.mbs if best.p > 1 else 1) == best.m
    assert toml["activation_checkpoint"]["mode"] == best.recompute
    args = megatron_args(best, req)
    flag = {a: b for a, b in zip(args, args[1:], strict=False) if a.startswith("--")}
    assert flag["--tensor-model-parallel-size"] == str(best.tp)
    assert flag["--pipeline-model-parallel-size"] == str(best.p)
    assert flag["--micro-batch-size"] == str(best.mbs) and flag["--global-batch-size"] == "16"
    assert ("--use-distributed-optimizer" in args) == (best.zero == 1)
    assert ("--sequence-parallel" in args) == best.sp == (best.tp > 1)
    if best.v > 1:
        assert flag["--num-layers-per-virtual-pipeline-stage"] == str(16 // (best.p * best.v))


def test_interleaved_exports_layers_per_virtual_stage():
    req = big_request()
    c = next(c for c in enumerate_candidates(req) if c.v == 2 and c.p == 2)
    args = megatron_args(c, req)
    assert args[args.index("--num-layers-per-virtual-pipeline-stage") + 1] == "4"
    assert "--overlap-grad-reduce" not in args
    bucketed_comm = CommOptions(overlap_grad_reduce=True, ddp_bucket_size=10**6)
    bucketed = megatron_args(c, replace(req, job=Job(comm=bucketed_comm)))
    i = bucketed.index("--overlap-grad-reduce")  # Megatron-LM's names; its bucket size counts parameters too
    assert bucketed[i + 1:i + 3] == ["--ddp-bucket-size", "1000000"] and bucketed[:i] == args[:i]
    toml = tomllib.loads(torchtitan_toml(c, req))
    assert toml["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert [len([n for n in part if n.startswith("layers.")]) for part in
            toml["parallelism"]["module_fqns_per_model_part"]] == [4, 4, 4, 4]  # the stages pipesim simulated


def test_megatron_pipeline_sends_match_what_the_plan_timed():
    """Megatron-core overlaps its interleaved schedule's sends by default and waits on all others: an interleaved
    winner timed with held sends exports --no-overlap-p2p-communication, and a 1F1B one timed with free sends
    says Megatron cannot do that."""
    req = big_request()
    cands = list(enumerate_candidates(req))
    inter = next(c for c in cands if c.v == 2 and c.p == 2)
    plain = next(c for c in cands if c.v == 1 and c.p == 2)
    single = next(c for c in cands if c.p == 1)
    held = replace(req, job=Job(comm=CommOptions(blocking_p2p=True)))
    core = replace(req, job=Job(comm=CommOptions(blocking_p2p=True, overlap_p2p_comm=True)))  # megatron-core's
    assert "--no-overlap-p2p-communication" not in megatron_args(inter, req) + megatron_args(inter, core)
    assert "--no-overlap-p2p-communication" in megatron_args(inter, held)
    assert megatron_args(plain, core) == megatron_args(plain, held)
    note = [a for a in megatron_args(plain, req) if a.startswith("# pipesim timed the pipeline sends")]
    assert len(note) == 1 and "--blocking-p2p" in note[0]
    assert megatron_args(plain, held) == [a for a in megatron_args(plain, req) if a not in note]
    assert megatron_args(single, req) == megatron_args(single, held)  # no pipeline, no sends
    assert not any("p2p" in a for a in megatron_args(single, req))


@pytest.mark.parametrize("argv, words", [
    (["--model", "gpt", "--hidden", "64", "--layers", "8", "--heads", "1", "--batch", "3", "--seq", "64",
      "--gpus", "16"], "--batch 3 splits over none of the data-parallel sizes [2, 4, 8, 16]"),
    (["--model", "gpt", "--hidden", "64", "--layers", "3", "--heads", "1", "--batch", "1", "--seq", "64",
      "--gpus", "8"], "--batch 1 splits over none of the data-parallel sizes [4, 8] left by 8 GPUs and --layers 3"),
    (["--model", "gpt", "--hidden", "8192", "--layers", "8", "--heads", "64", "--batch", "1", "--seq", "2048",
      "--gpus", "1", "--dtype", "bfloat16"], "no configuration fits 80.00 GiB per GPU: the closest"),
    (["--model", "gpt", "--hidden", "64", "--layers", "2", "--heads", "1", "--batch", "2", "--seq", "64",
      "--gpus", "2", "--cp", "2", "--attention", "eager"], "--cp 2 needs --attention flash"),
    (["--model", "gpt", "--hidden", "64", "--layers", "2", "--heads", "1", "--batch", "2", "--seq", "66",
      "--gpus", "2", "--cp", "2", "--dtype", "bfloat16"], "--seq 66 is not divisible by 2 x cp(2)"),
    (["--model", "gpt", "--hidden", "64", "--layers", "2", "--heads", "1", "--batch", "2", "--seq", "64",
      "--gpus", "2", "--dtype", "float16", "--grad-reduce-in-bf16"], "--grad-reduce-in-bf16 needs a bfloat16 model"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, words):
    assert main(["plan", *argv, "--hardware", "dgx-h100", "--schedules", "1f1b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and err.startswith("pipesim: error:")


def test_tensor_parallel_sizes_divide_heads_and_stay_in_a_node():
    model = ModelConfig(kind="gpt", hidden=96, layers=4, heads=6, seq=64, batch=8)
    req = PlanRequest(model, load_hardware("dgx-h100").with_nodes(2), 16, ("1f1b",))
    assert sorted({t for t, _, _, _ in layouts(req)}) == [1, 2]  # 6 heads: not 4 or 8; 16 GPUs: never 16
    assert sorted({t for t, _, _, _ in layouts(PlanRequest(BIG, req.hardware, 16, max_tp=4))}) == [1, 2, 4]
    with pytest.raises(NoLayout, match="--batch 3 splits over none"):
        enumerate_candidates(PlanRequest(ModelConfig(kind="gpt", hidden=96, layers=4, heads=6, seq=64, batch=3),
                                         req.hardware, 16, ("1f1b",)))


def test_the_run_export_of_a_llama_plan_builds_the_planned_model_in_the_executor(capsys, tmp_path):
    """The run export types the simulate export's model flags: `pipesim run` reads them into the same ModelConfig
    (grouped-query attention, SwiGLU, RMSNorm, RoPE, no biases: executor/transformer.py builds them), so no note."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--model-config", "llama3-8b", "--seq", "1024", "--batch", "16", "--hardware", "dgx-h100",
                 "--gpus", "8", "--schedules", "1f1b", "--top", "1", "--json", str(out)]) == 0
    winner = json.loads(out.read_text())["winner"]
    run = config_from_args(build_parser().parse_args(shlex.split(winner["run_command"])[1:]))
    simulated = model_config(build_parser().parse_args(shlex.split(winner["simulate_command"])[1:]))
    assert run.model == simulated and run.model.kv_heads == 8 and run.model.activation == "swiglu"
    assert "run_note" not in winner
