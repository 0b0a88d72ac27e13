"""--async-tp: torchtitan's async tensor parallelism (torch's micro-pipelined matmuls) as ring exchanges over the copy
engines, on pipesim.comm.ub_overlap's model."""

from __future__ import annotations

import pytest

from pipesim.cli import build_parser
from pipesim.comm.ub_overlap import DEFAULT_METHOD, UbConfig, UbMethod
from pipesim.commands.setup_args import sim_job
from pipesim.cost.model_costs import model_costs
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.hf_config import load_hf_config


def _job(*flags: str):
    return sim_job(build_parser().parse_args(["simulate", "1f1b", "--framework", "torchtitan", "--tp", "8",
                                              "--sequence-parallel", *flags]), None, None)


def test_every_collective_is_a_ring_exchange_over_the_copy_engines():
    cfg = UbConfig.torch_async_tp()
    ring = UbMethod("ring_exchange", num_sm=0, set_sm_margin=False, num_splits=0, use_ce=True, copies_in=True)
    assert dict(cfg.methods) == dict.fromkeys(DEFAULT_METHOD, ring)  # each gather copies its shard in first
    assert (ring.held_sms(), ring.chunks(8), cfg.flags()) == (0, 8, ["--async-tp"])


def test_the_flag_lifts_the_blocking_backward_and_needs_compile():
    job = _job("--compile", "--async-tp")
    assert job.kernels.ub == UbConfig.torch_async_tp() and job.kernels.tp_comm_overlap  # the profile's was False
    assert not _job("--compile").kernels.tp_comm_overlap
    with pytest.raises(PipesimError, match="^--async-tp needs torch.compile"):
        _job("--async-tp")
    with pytest.raises(PipesimError, match="^--async-tp is torch's overlap, --tp-comm-overlap Transformer Engine's"):
        _job("--compile", "--async-tp", "--tp-comm-overlap")
    with pytest.raises(PipesimError, match="^--async-tp runs the backward collectives inside their matmuls"):
        _job("--compile", "--async-tp", "--no-async-tensor-model-parallel-allreduce")


def test_the_collectives_ride_on_their_matmuls():
    """Each dense linear's sequence-parallel collective (4 per layer forward) carries its GEMM and the ring method;
    the embedding's reduce-scatter and the head's all-gather keep NCCL's model (pipesim.comm.ub_overlap: the dense
    linears' collectives only)."""
    model = load_hf_config("llama3.1-8b", seq=4096, batch=8)
    job = _job("--compile", "--async-tp", "--attention", "flash")
    costs = model_costs(model, 1, 1, load_hardware("dgx-h100"), job)
    forward = costs.tp_collectives[(0, "F")]
    ring = UbConfig.torch_async_tp().method("qkv_fprop")
    riding = [c for c in forward if c.ub is not None]
    assert len(riding) == 4 * model.layers and all(c.ub == ring and c.beside is not None for c in riding)
    assert [c.kind for c in forward if c.ub is None] == ["reduce_scatter", "all_gather"]
