"""CUDA graphs (Megatron-core's --cuda-graph-impl / --cuda-graph-scope): a graphed part of a MoE layer costs the host
its replay instead of its launches; its refusals; its flags."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipesim.cli import main
from pipesim.comm.comm_options import CommOptions
from pipesim.cost.host_issue import LAUNCH_SECONDS, SYNC_ROUND_TRIP, stage_host_issue
from pipesim.errors import PipesimError
from pipesim.job import Job
from pipesim.kernel_switches import KernelSwitches
from pipesim.model.cuda_graphs import CudaGraphs
from pipesim.model.hf_config import load_hf_config
from pipesim.model.host_ops import HostOps, moe_layer_host_ops
from pipesim.parallel_dims import ParallelDims

QWEN3 = load_hf_config("qwen3-235b-a22b", seq=4096, batch=2048)
SCOPES = ("attn", "moe_router", "moe_preprocess")


def _job(graphs: CudaGraphs | None, dispatcher: str = "hybridep", **kw) -> Job:
    return Job(ParallelDims(dp=8, tp=4, ep=8), sp=True, comm=CommOptions(moe_dispatcher=dispatcher),
               kernels=KernelSwitches(cuda_graphs=graphs), **kw)


def test_graphed_attention_and_router_cost_their_replays_by_hand():
    """16 local experts, Hybrid-EP. Eager: forward 20 attention + 22 router + 8 dispatcher + 2 x 16 grouped GEMMs + 1
    activation = 83; backward 20 attention (its 4 weight gradients among them) + 15 router (its 1) + 25 dispatcher +
    1 activation + 4 x 16 = 125, of which W 2 x 16 + 5 = 37. A graph's forward is 2 launches (the input copied into the
    static buffer, the replay), its backward 2 + 1 (the output gradient copied in, the replay, the weight-gradient
    graph). Attention and router graphed are one graph: forward 2 + 8 + 32 + 1 = 43, backward 3 + 25 + 1 + 64 = 93,
    W 32 + 1 = 33. Attention alone: forward 83 - 20 + 2, backward 125 - 20 + 3, W 37 - 4 + 1. The router alone:
    forward 83 - 22 + 2, backward 125 - 15 + 3, W 37 - 1 + 1."""
    eager = moe_layer_host_ops(QWEN3, _job(None).layer_options(QWEN3))
    assert eager == HostOps(83, 125 - 37, 37, 1, 0)
    graphed = moe_layer_host_ops(QWEN3, _job(CudaGraphs("transformer_engine", SCOPES)).layer_options(QWEN3))
    assert graphed == HostOps(43, 93 - 33, 33, 1, 0)  # the dispatch's wait stays: it is outside every graph
    attn_only = moe_layer_host_ops(QWEN3, _job(CudaGraphs("local", ("attn",))).layer_options(QWEN3))
    assert attn_only == HostOps(83 - 20 + 2, (125 - 20 + 3) - (37 - 4 + 1), 37 - 4 + 1, 1, 0)
    router_only = moe_layer_host_ops(QWEN3, _job(CudaGraphs("local", ("moe_router",))).layer_options(QWEN3))
    assert router_only == HostOps(83 - 22 + 2, (125 - 15 + 3) - 37, 37, 1, 0)
    issue = stage_host_issue(QWEN3, _job(CudaGraphs("transformer_engine", SCOPES)).layer_options(QWEN3), 2)
    assert issue.issue == pytest.approx((2 * (43 * LAUNCH_SECONDS + SYNC_ROUND_TRIP), 2 * 60 * LAUNCH_SECONDS,
                                         2 * 33 * LAUNCH_SECONDS), rel=1e-12)


def test_scopes_are_megatrons_in_its_order_and_flags_round_trip():
    graphs = CudaGraphs("transformer_engine", ("moe_preprocess", "attn", "moe_router"))
    assert graphs.scope == SCOPES and graphs == CudaGraphs("transformer_engine", SCOPES)
    assert KernelSwitches(cuda_graphs=graphs).flags()[-6:] == ["--cuda-graph-impl", "transformer_engine",
                                                               "--cuda-graph-scope", *SCOPES]
    assert CudaGraphs("full_iteration").flags() == ["--cuda-graph-impl", "full_iteration"]
    assert not CudaGraphs("full_iteration").captures("attn")


@pytest.mark.parametrize("graphs,dispatcher,message", [
    (CudaGraphs("transformer_engine"), "hybridep", "CUDA graphs over the whole layer need static token counts"),
    (CudaGraphs("local", ("attn", "moe")), "deepep", "CUDA graphs over a whole MoE layer need static token counts"),
    (CudaGraphs("full_iteration"), "hybridep", "CUDA graphs over the whole iteration need static token counts"),
    (CudaGraphs("local", SCOPES), "alltoall", "moe_preprocess with the alltoall dispatcher moves its device-to-host"),
])
def test_a_dropless_moe_refuses_graphs_its_host_model_cannot_hold(graphs, dispatcher, message):
    with pytest.raises(PipesimError, match=message):
        _job(graphs, dispatcher).check(QWEN3, 64)


@pytest.mark.parametrize("args,message", [
    (("local", ("moe_preprocess",)), "moe_preprocess must be used together with moe_router"),
    (("full_iteration", ("attn",)), "full_iteration graphs the whole iteration: it takes no --cuda-graph-scope"),
    (("cudagraph", ()), "unknown --cuda-graph-impl 'cudagraph'"),
])
def test_graphs_megatron_or_pipesim_refuses(args, message):
    with pytest.raises(PipesimError, match=message):
        CudaGraphs(*args)


def test_on_the_command_line_graphs_shorten_a_host_bound_moe_step_and_leave_a_dense_one(tmp_path, capsys):
    base = ["simulate", "1f1b", "--model-config", "qwen3-30b-a3b", "--seq", "1024", "--batch", "64",
            "--microbatch-size", "1", "--stages", "1", "--dp", "8", "--ep", "8", "--etp", "1", "--hardware",
            "gb200-nvl72", "--nvlink-domain", "8", "--attention", "flash", "--framework", "megatron-core", "--zero",
            "1", "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep"]
    graphs = ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", *SCOPES]
    steps = []
    for i, extra in enumerate(([], graphs)):
        out = tmp_path / f"moe{i}.json"
        assert main(base + extra + ["--json", str(out)]) == 0
        steps.append(json.loads(out.read_text())["step_time"])
    assert steps[1] < steps[0]  # this step is host-bound (1,024 tokens a microbatch): fewer launches, a shorter step
    options = json.loads((tmp_path / "moe1.json").read_text())["options"]
    assert (options["cuda_graph_impl"], options["cuda_graph_scope"]) == ("transformer_engine", list(SCOPES))
    dense = ["simulate", "1f1b", "-p", "2", "-m", "4", "--model-config", "llama3-8b", "--seq", "1024", "--batch", "8",
             "--hardware", "dgx-h100"]
    times = []
    for i, extra in enumerate(([], ["--cuda-graph-impl", "local"])):
        out = tmp_path / f"dense{i}.json"
        assert main(dense + extra + ["--json", str(out)]) == 0
        times.append(json.loads(out.read_text())["step_time"])
    assert times[0] == times[1]  # a dense layer's host runs ahead: pipesim charges it no launches to save
    assert main(base + ["--cuda-graph-scope", "attn"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "pipesim: error: --cuda-graph-scope attn needs --cuda-graph-impl local or transformer_engine"


PADDED = replace(QWEN3, moe=replace(QWEN3.moe, capacity_factor=1.25))  # drop-and-pad: static token counts


@pytest.mark.parametrize("dispatcher", ["alltoall", "hybridep"])
def test_drop_and_pad_routing_waits_for_nothing(dispatcher):
    """Megatron-core's alltoall dispatcher returns padded counts without a device-to-host copy, and Hybrid-EP's dispatch
    is told its token count: the same launches as dropless, no waits (alltoall's forward: 96, hybridep's 83)."""
    dropless = moe_layer_host_ops(QWEN3, _job(None, dispatcher).layer_options(QWEN3))
    padded = moe_layer_host_ops(PADDED, _job(None, dispatcher).layer_options(PADDED))
    assert dropless.syncs_f == 1 and padded == replace(dropless, syncs_f=0, syncs_i=0)


def test_padded_routing_takes_graphs_over_the_moe_block_the_layer_and_the_iteration():
    """Eager: forward 83, backward 125 (W 37). The whole layer one graph: 2 forward, 2 + 1 backward (W 1). The whole
    iteration: nothing per layer. attn and moe graphed: two graphs, 2 + 2 forward, 3 + 3 backward (W 2). moe alone:
    20 + 2 forward, 20 + 3 backward (W 4 + 1)."""
    def ops(graphs):
        return moe_layer_host_ops(PADDED, _job(graphs).layer_options(PADDED))
    assert ops(CudaGraphs("local")) == HostOps(2, 2, 1, 0, 0)
    assert ops(CudaGraphs("full_iteration")) == HostOps(0, 0, 0, 0, 0)
    assert ops(CudaGraphs("transformer_engine", ("attn", "moe"))) == HostOps(4, 4, 2, 0, 0)
    assert ops(CudaGraphs("transformer_engine", ("moe",))) == HostOps(22, 18, 5, 0, 0)
    # a recomputed MoE block inside its graph is replayed with it: no launches added
    recomputed = _job(CudaGraphs("transformer_engine", ("moe",)), recompute="selective", recompute_modules=("moe",))
    assert moe_layer_host_ops(PADDED, recomputed.layer_options(PADDED)) == HostOps(22, 18, 5, 0, 0)


@pytest.mark.parametrize("graphs,dispatcher,recompute,message", [
    (CudaGraphs("local", ("moe", "moe_router")), "hybridep", "none", "moe and moe_router cannot go together"),
    (None, "deepep", "none", "with DeepEP: Megatron-core's flex dispatcher with the deepep backend does not support"),
])
def test_what_megatron_refuses_pipesim_refuses(graphs, dispatcher, recompute, message):
    with pytest.raises(PipesimError, match=message):
        _job(graphs, dispatcher, recompute=recompute).check(PADDED, 64)


def test_full_recomputation_needs_the_full_iteration_graph_dense_or_not():
    with pytest.raises(PipesimError, match="Megatron-core supports full recomputation only with"):
        Job(recompute="full", kernels=KernelSwitches(cuda_graphs=CudaGraphs("local", ("attn",))))
    assert Job(recompute="full", kernels=KernelSwitches(cuda_graphs=CudaGraphs("full_iteration"))).recompute == "full"
    with pytest.raises(PipesimError, match="does not support recomputing a graphed router"):
        Job(recompute="selective", recompute_modules=("moe",),
            kernels=KernelSwitches(cuda_graphs=CudaGraphs("transformer_engine", ("moe_router",))))


def test_the_planner_leaves_full_recomputation_out_under_per_layer_graphs(tmp_path, capsys):
    base = ["plan", "--model-config", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8", "--seq", "4096",
            "--batch", "64", "--cuda-graph-impl", "local"]
    out = tmp_path / "plan.json"
    assert main(base + ["--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows and {r["recompute"] for r in rows} <= {"none", "selective"}  # full only under full_iteration
    capsys.readouterr()
    assert main(base + ["--recompute", "full"]) == 2  # typed: refused as simulate refuses it
    assert "supports full recomputation only with --cuda-graph-impl full_iteration" in capsys.readouterr().err
