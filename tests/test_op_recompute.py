"""`--recompute op`: torchtitan's per-op selective checkpointing (pipesim.model.op_recompute) in closed form: what a
Llama block keeps, what its backward re-runs, and where it is refused."""

from __future__ import annotations

import dataclasses

import pytest

import schedules
from pipesim.cli import main
from pipesim.cost.model_costs import model_costs
from pipesim.cost.rank_memory import rank_memory
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.activations import layer_activation_bytes, recompute_working_bytes
from pipesim.model.config import ModelConfig
from pipesim.model.flops import layer_flops
from pipesim.model.fp8 import Fp8Options
from pipesim.model.fp8_kernels import fp8_layer_kernels
from pipesim.model.hf_config import load_hf_config
from pipesim.model.kernel_types import Gemm, MemoryBound
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.options import LayerOptions
from pipesim.parallel_dims import ParallelDims

LLAMA = load_hf_config("llama3.1-8b", seq=8192)
OP, NONE = LayerOptions(recompute="op", attention="flash"), LayerOptions(attention="flash")


def test_what_the_block_keeps():
    """Its input, wq's, wv's, w1's and w2's outputs, the SDPA output and its float32 logsumexp (b = 2)."""
    t, h, hkv, f = 2 * 8192, 4096, 1024, 14336
    assert layer_activation_bytes(LLAMA, 2, OP) == 2 * t * (h + h + hkv + h + f + h) + 4 * t * 32
    # the backward re-creates the rest of the block, one block at a time
    assert recompute_working_bytes(LLAMA, 2, OP) == \
        layer_activation_bytes(LLAMA, 2, NONE) - layer_activation_bytes(LLAMA, 2, OP)


def test_what_the_backward_re_runs():
    """wk, wo and w3 (every second mm) and every memory-bound op, before the backward proper."""
    t, h, hkv, f = 8192, 4096, 1024, 14336
    assert layer_flops(LLAMA, 1, OP).I - layer_flops(LLAMA, 1, NONE).I == 2 * t * (h * hkv + h * h + h * f)
    plain, op = layer_kernels(LLAMA, 1, NONE), layer_kernels(LLAMA, 1, OP)
    assert (op.F, op.W) == (plain.F, plain.W)
    reruns = [k for k in plain.F if isinstance(k, MemoryBound)]
    assert op.I == (*reruns, Gemm("K (recompute)", t, hkv, h), Gemm("projection (recompute)", t, h, h),
                    Gemm("FC1 up half (recompute)", t, f, h), *plain.I)


def test_under_float8_the_same_mms_are_saved_and_the_re_run_ones_are_float8():
    """torchao's float8 linears call torch.mm on their float8 tensors, so the policy saves the same outputs (in
    bf16) and wk, wo and w3 re-run as FP8 GEMMs after their inputs' amax and cast (tensorwise)."""
    tensorwise = Fp8Options("hybrid", "tensorwise")
    fp8 = dataclasses.replace(OP, fp8=tensorwise)
    assert layer_activation_bytes(LLAMA, 2, fp8) == layer_activation_bytes(LLAMA, 2, OP)
    assert layer_flops(LLAMA, 1, fp8) == layer_flops(LLAMA, 1, OP)
    kernels = fp8_layer_kernels(layer_kernels(LLAMA, 1, OP), tensorwise, dtype_bytes=2, tn_only=True)
    rerun = [k for k in kernels.I if "(recompute)" in k.name]
    assert [k.name for k in rerun] == [f"{n} (recompute){step}" for n in ("K", "projection", "FC1 up half")
                                       for step in (" input amax", " input cast", "")]
    assert all(k.dtype == "float8" for k in rerun if isinstance(k, Gemm))


def test_it_fits_where_megatrons_selective_recompute_does_not():
    """torchtitan's 8B on 8 H100, FSDP, local batch 2: op keeps 31 GiB of layer activations; Megatron's selective
    (the attention core alone) would keep 76 GiB and not fit 80 GiB."""
    hw = load_hardware("dgx-h100")
    model = dataclasses.replace(LLAMA, batch=16)
    sched = schedules.build("1f1b", 1, 1)
    totals = {}
    for rc in ("op", "selective"):
        job = Job(ParallelDims(dp=8), recompute=rc, attention="flash", zero=3)
        (mem,) = rank_memory(sched, model_costs(model, 1, 1, hw, job))
        totals[rc] = mem.total
    assert totals["op"] < hw.device.memory < totals["selective"]


@pytest.mark.parametrize("model,opts,why", [
    (LLAMA, LayerOptions(recompute="op", attention="flash", tp=2), "--tp 2"),
    (LLAMA, LayerOptions(recompute="op", attention="flash", cp=2), "--cp 2"),
    (LLAMA, LayerOptions(recompute="op", attention="eager"), "--attention eager"),
    (ModelConfig(kind="gpt", hidden=512, heads=8, layers=2, seq=256), LayerOptions(recompute="op", attention="flash"),
     "a gelu MLP"),
    (load_hf_config("mixtral-8x7b", seq=4096), LayerOptions(recompute="op", attention="flash"),
     "a mixture-of-experts layer"),
])
def test_refused_where_the_policy_does_more(model, opts, why):
    with pytest.raises(PipesimError, match=f"^--recompute op \\(torchtitan's per-op checkpointing\\) is not modelled "
                                           f"with {why}"):
        opts.check(model)


def test_simulated_and_planned_for_torchtitan_only(capsys):
    with pytest.raises(SystemExit) as exit_:  # the executor checkpoints full and selective only
        main(["run", "1f1b", "--nproc", "2", "--recompute", "op"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "'op'" in err[0]
    # the planner searches it for torchtitan (tests/test_plan_frameworks.py), not for pipesim's own executor
    assert main(["plan", "--model", "gpt", "--gpus", "8", "--hardware", "dgx-h100", "--recompute", "op"]) == 2
    assert capsys.readouterr().err.strip() == ("pipesim: error: --recompute op is torchtitan's per-op checkpointing: "
                                               "plan it with --framework torchtitan")
