"""Megatron-core's --moe-shared-expert-overlap (pipesim.cost.shared_overlap): the shared experts' kernels beside the
alltoall dispatcher's exchanges, and only what they leave of each exposed (ExpertExchange.beside / carries)."""

from __future__ import annotations

import json

import pytest

from pipesim.cli import build_parser, main
from pipesim.comm.expert_exchange import ExpertExchange, exposed_exchange_seconds
from pipesim.commands.megatron_import import expand
from pipesim.commands.setup_args import setup_from_args
from pipesim.cost.device_profiles import profile_of
from pipesim.cost.kernel_costs import fp8_layer, kernel_seconds
from pipesim.cost.shared_overlap import beside_exchanges, shared_seconds

MOE = ["--model", "moe", "--layers", "4", "--hidden", "2048", "--heads", "16", "--seq", "2048", "--vocab", "32000",
       "--batch", "64", "--dtype", "bfloat16", "--num-experts", "16", "--moe-router-topk", "2",
       "--moe-shared-expert-intermediate-size", "4096", "--dp", "8", "--ep", "8", "--hardware", "dgx-h100",
       "--nodes", "2"]


def _x(what: str, count: int = 1, beside: float = 0.0, carries: bool = False) -> ExpertExchange:
    return ExpertExchange(what, 1024, 1024, 2, 8, 2, count=count, beside=beside, carries=carries)


def test_each_exchange_exposes_what_the_side_stream_leaves_layer_by_layer():
    """Forward: dispatch 3 beside 1, combine 2 beside 5 (per layer, 2 layers): (2 + 0) x 2. Backward: the combine's
    1 beside 4 leaves 3 for the dispatch's 2 (carried): nothing exposed; beside 1.5, the 0.5 left hides a quarter of
    the dispatch's. Nothing beside: the plain sum, bit for bit."""
    forward = (_x("MoE dispatch", 2, 1.0), _x("MoE combine", 2, 5.0))
    assert exposed_exchange_seconds(forward, [6.0, 4.0]) == 4.0
    backward = (_x("MoE combine backward", 1, 4.0), _x("MoE dispatch backward", 1, 0.0, carries=True))
    assert exposed_exchange_seconds(backward, [1.0, 2.0]) == 0.0
    backward = (_x("MoE combine backward", 1, 1.5), _x("MoE dispatch backward", 1, 0.0, carries=True))
    assert exposed_exchange_seconds(backward, [1.0, 2.0]) == 1.5
    plain = (_x("MoE dispatch", 3), _x("MoE combine", 3))
    assert exposed_exchange_seconds(plain, [0.1, 0.2]) == 0.1 + 0.2


def test_the_shared_experts_seconds_go_beside_the_exchanges_they_run_beside():
    """FC1 and its activation beside a dispatch (a recomputation's too), FC2 beside a combine, the input-gradient
    kernels beside the combine's backward exchange (with the weight gradients in a fused B), carried to the
    dispatch's; each part the sum of those kernels' own seconds."""
    setup = setup_from_args(build_parser().parse_args(["simulate", "1f1b", *MOE]))
    model, family = setup.model, setup.hardware.device.family
    opts = setup.job.layer_options(model)
    profile = profile_of(family, setup.hardware.device.kernels)
    pk = fp8_layer(model, 1, opts, True, family, moe=True)

    def named(ks, *names):
        return sum(kernel_seconds(k, model.dtype, profile) for k in ks if k.name in names)

    fc1, fc2, inp, wgt = shared_seconds(model, 1, opts, True, family, setup.hardware.device.kernels)
    assert fc1 == named(pk.F, "shared FC1", "shared GeLU") > 0 and fc2 == named(pk.F, "shared FC2") > 0
    assert inp == named(pk.I, "shared FC2 dgrad", "shared GeLU backward", "shared FC1 dgrad")
    assert wgt == named(pk.W, "shared FC1 wgrad", "shared FC2 wgrad")
    names = ("MoE dispatch", "MoE combine", "recompute: MoE dispatch", "MoE combine backward", "MoE dispatch backward")
    out = beside_exchanges(tuple(_x(n) for n in names), (fc1, fc2, inp, wgt), "B")
    assert [(x.beside, x.carries) for x in out] == [(fc1, False), (fc2, False), (fc1, False), (inp + wgt, False),
                                                    (0.0, True)]
    assert beside_exchanges(out, (fc1, fc2, inp, wgt), "I")[3].beside == inp


def test_the_overlap_shortens_the_step_and_is_refused_where_it_cannot_act(capsys):
    def step(*extra: str) -> float:
        capsys.readouterr()
        assert main(["simulate", "1f1b", "--stages", "2", *MOE, *extra, "--json"]) == 0
        return json.loads(capsys.readouterr().out)["step_time"]

    assert step("--moe-shared-expert-overlap") < step()
    dense = [a for a in MOE if a not in ("--moe-shared-expert-intermediate-size", "4096")]
    for argv, line in (
            ([*MOE, "--moe-token-dispatcher-type", "flex"], "--moe-shared-expert-overlap only works with the alltoall "
                                                            "token dispatcher (as Megatron-core raises)"),
            (dense, "--moe-shared-expert-overlap overlaps the shared experts with the all-to-alls: this model has none "
                    "(--moe-shared-expert-intermediate-size)"),
            ([*MOE, "--recompute", "selective", "--recompute-modules", "shared_experts"],
             "--recompute-modules shared_experts cannot work with --moe-shared-expert-overlap (as Megatron-core "
             "raises)"),
            ([*MOE[:-8], "--dp", "2", "--ep", "2", "--hardware", "local-cpu"],
             "--moe-shared-expert-overlap hides the exchanges behind the shared experts' kernels, timed kernel by "
             "kernel: local-cpu has no GPU device family (use a GPU preset)")):
        capsys.readouterr()
        assert main(["simulate", "1f1b", "--stages", "2", *argv, "--moe-shared-expert-overlap"]) == 2
        assert capsys.readouterr().err == f"pipesim: error: {line}\n"
    assert main(["simulate", "combined-1f1b", "--stages", "2", "--virtual", "2", *MOE,
                 "--moe-shared-expert-overlap"]) == 2  # transformer_config.py asserts it away from the A2A overlap
    assert capsys.readouterr().err == ("pipesim: error: --moe-shared-expert-overlap with combined-1f1b, whose "
                                       "overlapped forward and backward pairs hide the all-to-alls: Megatron-core "
                                       "refuses it beside --overlap-moe-expert-parallel-comm\n")


@pytest.mark.parametrize("where", ["simulate", "megatron"])
def test_the_flag_travels_through_megatrons_launch_and_the_plans_exports(tmp_path, where):
    if where == "megatron":
        path = tmp_path / "run.sh"
        path.write_text("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
                        "--max-position-embeddings 128 --micro-batch-size 1 --vocab-size 1024 --bf16 --num-experts 4 "
                        "--moe-grouped-gemm --moe-token-dispatcher-type alltoall "
                        "--moe-shared-expert-intermediate-size 512 --moe-shared-expert-overlap\n")
        assert "--moe-shared-expert-overlap" in expand(["simulate", "--from-megatron", str(path)])
    else:
        setup = setup_from_args(build_parser().parse_args(["simulate", "1f1b", *MOE, "--moe-shared-expert-overlap"]))
        assert "--moe-shared-expert-overlap" in setup.job.comm.flags()
