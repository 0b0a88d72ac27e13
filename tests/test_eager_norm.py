"""`--eager-rmsnorm` (pipesim.model.eager_norm): an RMSNorm as eager PyTorch's ops, in closed form."""

from __future__ import annotations

import pytest

from pipesim.cli import build_parser
from pipesim.commands.setup_args import sim_job
from pipesim.cost.kernel_costs import head_seconds, layer_seconds
from pipesim.errors import PipesimError
from pipesim.job import Job
from pipesim.kernel_switches import KernelSwitches
from pipesim.model.config import ModelConfig
from pipesim.model.eager_norm import eager_rmsnorm_kernels, with_eager_rmsnorm
from pipesim.model.hf_config import load_hf_config
from pipesim.model.kernel_types import Gemm, MemoryBound
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.options import LayerOptions

LLAMA = load_hf_config("llama3.1-8b", seq=4096)


def test_one_fused_norm_becomes_its_ops():
    """n elements at bf16: forward 36 n bytes in 6 kernels (a fused one: 4 n), backward 64 n in 9 (fused: 6 n)."""
    n = 4096 * 4096
    fwd = eager_rmsnorm_kernels(MemoryBound("attention RMSNorm", 2 * 2 * n), 2)
    bwd = eager_rmsnorm_kernels(MemoryBound("attention RMSNorm backward", 3 * 2 * n), 2)
    assert (len(fwd), sum(k.nbytes for k in fwd)) == (6, 36 * n)
    assert (len(bwd), sum(k.nbytes for k in bwd)) == (9, 64 * n)
    assert fwd[0] == MemoryBound("attention RMSNorm: cast to float32", 6 * n)
    other = [MemoryBound("SwiGLU", 10), Gemm("FC1", 8, 8, 8)]  # anything else stays as it is
    assert [x for k in other for x in eager_rmsnorm_kernels(k, 2)] == other


def test_a_layer_and_the_head_run_their_norms_eagerly():
    plain, eager = LayerOptions(attention="flash"), LayerOptions(attention="flash", eager_rmsnorm=True)
    kernels = layer_kernels(LLAMA, 1, plain)
    assert with_eager_rmsnorm(kernels, 2).F.count(MemoryBound("MLP RMSNorm: pow", 8 * 4096 * 4096)) == 1
    base, slow = layer_seconds(LLAMA, 1, plain, True, "H100"), layer_seconds(LLAMA, 1, eager, True, "H100")
    assert slow.F > base.F and slow.I > base.I and slow.W == base.W and dict(slow.gemms) == dict(base.gemms)
    assert head_seconds(LLAMA, 1, eager, "H100").F > head_seconds(LLAMA, 1, plain, "H100").F  # the final norm


def test_refused_without_an_rmsnorm_and_exported():
    job = Job(attention="flash", kernels=KernelSwitches(eager_rmsnorm=True))
    assert job.kernels.flags()[-1] == "--eager-rmsnorm"
    with pytest.raises(PipesimError, match="^--eager-rmsnorm needs a model with RMSNorm, got layernorm$"):
        job.check(ModelConfig(kind="gpt", hidden=256, heads=4, layers=2, seq=128, batch=8))


def test_refused_with_compile():
    args = build_parser().parse_args(["simulate", "1f1b", "--compile", "--eager-rmsnorm"])
    with pytest.raises(PipesimError, match="^--eager-rmsnorm with --compile: torch.compile fuses the norm"):
        sim_job(args, None, None)
