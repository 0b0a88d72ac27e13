"""Mixtral 8x7B with expert parallelism through the cost model, the simulator and the CLI: memory per rank against a
hand count, the all-to-alls as their own bars, and what DualPipeV's overlapped pairs buy for MoE against dense."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import schedules
from pipesim.cli import main
from pipesim.comm.comm_options import CommOptions
from pipesim.comm.expert_exchange import ExpertExchange, exchange_seconds
from pipesim.cost.host_issue import SYNC_GAP
from pipesim.cost.model_costs import model_costs, uniform_costs
from pipesim.cost.rank_memory import rank_memory
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.lowering import add_p2p
from pipesim.job import Job
from pipesim.model.hf_config import load_hf_config
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.plugins import plugins_for
from pipesim.sim.program import compile_programs
from pipesim.sim.simulator import simulate

HW = load_hardware("dgx-h100").with_nodes(8)  # 64 H100s, 8 per node
MIXTRAL = load_hf_config("mixtral-8x7b", seq=4096, batch=256)  # 16 microbatches of 2 sequences on each of dp 8
DENSE = replace(MIXTRAL, moe=None)  # the same layers with one dense SwiGLU MLP of 14336 each
H, F, KV, V = 4096, 14336, 1024, 32000  # hidden, expert width, K/V width (8 heads of 128), vocabulary
JOB = Job(ParallelDims(dp=8, tp=2, ep=8), sp=True, zero=1, attention="flash")  # etp = tp = 2: edp = 1


def _costs(model, stages: int):
    job = JOB if model.moe is not None else replace(JOB, dims=replace(JOB.dims, ep=1))
    return model_costs(model, stages, 16, HW, job)


def test_memory_per_rank_is_a_hand_count():
    """Rank 0 of 1F1B p = 4: the embedding and 8 MoE layers at tp 2, ep 8, etp 2; 4 microbatches in flight."""
    costs = _costs(MIXTRAL, 4)
    mem = rank_memory(schedules.build("1f1b", 4, 16), costs)[0]
    layer_dense = (H * (H + 2 * KV) + H * H) // 2 + 2 * H + H * 8  # attention / tp, two RMSNorms, the router (whole)
    layer_experts = 1 * 3 * H * F // 2  # 8 experts / ep 8 = 1 expert, SwiGLU's 3 matrices split over etp 2
    dense = V // 2 * H + 8 * layer_dense  # + the vocab-parallel embedding
    experts = 8 * layer_experts
    assert costs.param_counts[0] == dense + experts and costs.expert_param_counts[0] == experts
    # bf16 with float32 main gradients (Megatron's default): 2 + 4 bytes, Adam's master + moments 12, ZeRO 1 shards
    # them over dp 8 for the dense parameters and over edp = tp dp / (ep etp) = 1 for the experts'
    assert mem.parameters == 2 * (dense + experts)
    assert mem.gradients == 4 * (dense + experts)
    assert mem.optimizer_states == 12 * (-(-dense // 8) + experts)
    t = 2 * 4096  # tokens of a microbatch; each rank holds t / 2 under sp
    d = 2
    attention = (d * t * H // 2 * 2  # norm input and QKV input, sharded by sp
                 + d * t * H // 2 + 2 * d * t * KV // 2  # Q, K, V on this rank's heads
                 + 4 * t * 32 // 2  # flash attention's float32 logsumexp per token and head
                 + d * t * H // 2  # projection input
                 + d * t * H // 2 * 2)  # MLP norm input and the router's input, sharded by sp
    routed = t * 2  # t / 2 tokens here x k 2 x etp 2: the etp pair computes all its experts' tokens
    moe = (4 * t // 2 * 8  # float32 router probabilities
           + d * routed * H + d * routed * 2 * F // 2 + d * routed * F // 2  # FC1 input, gate and up, FC2 input
           + 4 * routed)  # one float32 probability per routed token, kept by the weighted activation
    assert mem.activations == 4 * 8 * (attention + moe) and mem.inflight == 4
    assert mem.comm_buffers == 2 * (d * t * H // 2) + d * t * H  # P2P send and receive, sp's gathered input


def test_the_all_to_alls_are_their_own_bars_and_block_the_compute():
    costs = _costs(MIXTRAL, 4)
    result = simulate(schedules.build("1f1b", 4, 16), costs, HW)
    dims = replace(JOB.dims, pp=4)
    group = dims.group("ep", dims.rank(pp=1))
    assert group == [dims.rank(pp=1, dp=i) for i in range(8)]  # etp = tp, edp 1: the ep group is the dp group
    forward = sum(exchange_seconds(HW, group, x) for x in costs.ep_exchanges[(1, "F")])
    assert [(x.what, x.count) for x in costs.ep_exchanges[(1, "F")]] == [("MoE dispatch", 8), ("MoE combine", 8)]
    bars = [e for e in result.timeline().events if e.stream == "collective" and e.kind == "ep" and e.rank == 1]
    computes = [e for e in result.timeline().events if e.stream == "compute" and e.rank == 1]
    assert len(bars) == len(computes) == 32  # 16 F and 16 B on stage 1
    # the backward moves the same bytes the other way (the combine's gradient, then the dispatch's): every bar alike
    assert forward > 0 and all(e.end - e.start == pytest.approx(forward, rel=1e-12) for e in bars)
    after = {(e.stage, e.microbatch, e.end) for e in computes}
    assert all((e.stage, e.microbatch, e.start) in after for e in bars)  # each right after its compute
    ranks = result.to_dict()["ranks"]
    assert ranks[1]["ep_all_to_all"] == pytest.approx(sum(e.end - e.start for e in bars), rel=1e-12)
    assert "ep_all_to_all" not in simulate(schedules.build("1f1b", 4, 16), _costs(DENSE, 4), HW).to_dict()["ranks"][1]


def test_dualpipev_hides_the_all_to_alls_of_a_moe_model():
    """DualPipeV's overlapped F&B pairs hide each pair's all-to-alls under its computation (exposed: what is
    longer); so it gains more over 1F1B on the MoE model than on the dense one, whose pairs have nothing to hide."""
    steps = {}
    for name, model in (("moe", MIXTRAL), ("dense", DENSE)):
        one = simulate(schedules.build("1f1b", 4, 16), _costs(model, 4), HW).step_time
        dual = simulate(schedules.build("dualpipev", 4, 16), _costs(model, 8), HW)
        steps[name] = (one, dual.step_time)
        if name == "moe":
            pairs = [(i, a) for r in range(4) for i, a in enumerate(dual.schedule.programs[r])
                     if any(a == b for _, b in dual.schedule.overlaps)]
            assert pairs  # the schedule has overlapped pairs, and the runs outside them keep their all-to-alls
    gain = {k: one / dual for k, (one, dual) in steps.items()}
    assert gain["moe"] > gain["dense"] > 1.0


def test_simulate_command_runs_mixtral_with_expert_parallelism(tmp_path, capsys):
    out = tmp_path / "moe.json"
    trace = tmp_path / "moe-trace.json"
    assert main(["simulate", "dualpipev", "-p", "4", "-m", "16", "--model-config", "mixtral-8x7b", "--seq", "4096",
                 "--batch", "256", "--dp", "8", "--tp", "2", "--sequence-parallel", "--ep", "8", "--zero", "1",
                 "--hardware", "dgx-h100", "--nodes", "8", "--json", str(out), "--trace", str(trace)]) == 0
    data = json.loads(out.read_text())
    assert {k: data["parallel"][k] for k in ("dp", "tp", "ep", "etp", "edp")} == {"dp": 8, "tp": 2, "ep": 8, "etp": 2,
                                                                                "edp": 1}
    assert all(r["ep_all_to_all"] > 0 for r in data["ranks"])
    assert len(data["memory"]["ranks"]) == 4 and data["model_config"]["source"] == "mixtral-8x7b"
    names = {e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]}
    assert any("ep" in n for n in names)
    assert main(["simulate", "1f1b", "-p", "4", "-m", "16", "--model-config", "mixtral-8x7b", "--seq", "4096",
                 "--batch", "256", "--dp", "8", "--tp", "2", "--ep", "8", "--hardware", "dgx-h100",
                 "--nodes", "8"]) == 2
    assert capsys.readouterr().err.strip().endswith("needs --sequence-parallel (as Megatron-LM)")


@pytest.mark.parametrize("dispatcher,sms", [("alltoall", 24), ("deepep", 20), ("deepep", 32)])
def test_an_overlapped_pair_hides_the_all_to_alls_at_the_price_of_their_sms(dispatcher, sms):
    """Hand-given costs: F 1 ms, B 2 ms (I = W = 1 ms) and one dispatch + combine per action of e seconds each way:
    a plain F or B blocks for them; in a DualPipeV pair they run under the pair's G = 3 ms of compute, which runs on
    the SMs the all-to-all kernels leave (s: NCCL's 24 channels of the H100's 132 SMs, or DeepEP's num_sms), so the
    pair adds 2e s while 2e < G / (1 - s) and 2e - G beyond, on its backward half."""
    ms = 1e-3
    hw = load_hardware("dgx-h100")
    sched = add_p2p(schedules.build("dualpipev", 2, 4))
    base = uniform_costs(sched.num_stages, {"F": ms, "I": ms, "W": ms})
    comm = CommOptions(moe_dispatcher=dispatcher, deepep_sms=sms if dispatcher == "deepep" else 20)
    job = Job(ParallelDims(pp=2, dp=4, ep=4), comm=comm)
    kernel = "deepep" if dispatcher == "deepep" else "nccl"
    share = sms / 132
    for tokens, hidden in ((4096, True), (4096 * 64, False)):  # a short exchange (hidden) and a long one (exposed)
        x = (ExpertExchange("MoE dispatch", tokens, H, 2, 8, 2), ExpertExchange("MoE combine", tokens, H, 2, 8, 2))
        ep = {(s, k): x for s in range(sched.num_stages) for k in ("F", "B", "I", "W")}
        costs = replace(base, job=job, ep_exchanges=ep)
        ops = compile_programs(sched, plugins_for(costs.table, hw, True).compute, hw, True, job, costs)
        e = sum(exchange_seconds(hw, job.dims.group("ep", job.dims.rank(pp=0)), y, kernel=kernel) for y in x)
        prog = sched.programs[0]
        pair = next(i for i in range(len(prog) - 1) if (prog[i], prog[i + 1]) in sched.overlaps)
        fwd, bwd = ops[0][pair], ops[0][pair + 1]
        g = fwd.seconds + bwd.seconds
        assert (2 * e < g / (1 - share)) is hidden
        assert fwd.ep_seconds == 0.0
        assert bwd.ep_seconds == pytest.approx(2 * e * share if hidden else 2 * e - g, rel=1e-12)
        alone = next(op for i, op in enumerate(ops[0]) if prog[i].kind.value == "F" and i not in (pair, pair + 1))
        assert alone.ep_seconds == e


def test_the_deepep_dispatcher_is_chosen_by_megatrons_flags(tmp_path, capsys):
    """--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep (or the older --moe-enable-deepep) times
    the all-to-alls with DeepEP's kernels: one copy per destination rank instead of k, so Mixtral's top-2 over 8 ranks
    moves fewer bytes and the step is shorter; the choice is reported and refused where it means nothing."""
    base = ["simulate", "1f1b", "-p", "4", "-m", "16", "--model-config", "mixtral-8x7b", "--seq", "4096", "--batch",
            "256", "--dp", "8", "--tp", "2", "--sequence-parallel", "--ep", "8", "--hardware", "dgx-h100",
            "--nodes", "8"]
    runs = {}
    for name, extra in (("alltoall", []), ("deepep", ["--moe-token-dispatcher-type", "flex",
                                                      "--moe-flex-dispatcher-backend", "deepep"]),
                        ("old", ["--moe-token-dispatcher-type", "flex", "--moe-enable-deepep"])):
        out = tmp_path / f"{name}.json"
        assert main([*base, *extra, "--json", str(out)]) == 0
        runs[name] = json.loads(out.read_text())
    a2a = {k: sum(r["ep_all_to_all"] for r in v["ranks"]) for k, v in runs.items()}
    assert a2a["deepep"] == a2a["old"] < a2a["alltoall"]
    assert runs["deepep"]["options"]["moe_dispatcher"] == "deepep"
    capsys.readouterr()
    for extra, message in ((["--moe-enable-deepep"], "need --moe-token-dispatcher-type flex"),
                           (["--moe-deepep-num-sms", "32"], "--moe-deepep-num-sms needs the DeepEP dispatcher")):
        assert main([*base, *extra]) == 2
        assert message in capsys.readouterr().err
    assert main(["simulate", "1f1b", "-p", "2", "-m", "4", "--model", "gpt", "--moe-token-dispatcher-type", "flex",
                 "--hardware", "dgx-h100"]) == 2
    assert capsys.readouterr().err.strip().endswith("--moe-token-dispatcher-type flex needs a mixture-of-experts model")


def test_routing_flags_set_the_load_on_the_slowest_rank(tmp_path, capsys):
    """--moe-load-imbalance scales the slowest rank's expert tokens and all-to-alls; a capacity factor of 1 pads every
    expert to the mean: the balanced run's expert work, without its device-to-host waits (drop-and-pad counts are
    static: pipesim.model.host_ops), so a little faster. Both refused on a dense model."""
    base = ["simulate", "1f1b", "-p", "4", "-m", "16", "--model-config", "mixtral-8x7b", "--seq", "4096", "--batch",
            "256", "--dp", "8", "--tp", "2", "--sequence-parallel", "--ep", "8", "--hardware", "dgx-h100",
            "--nodes", "8"]
    steps = {}
    for name, extra in (("balanced", []), ("skewed", ["--moe-load-imbalance", "1.25"]),
                        ("capacity", ["--moe-expert-capacity-factor", "1.0"])):
        out = tmp_path / f"{name}.json"
        assert main([*base, *extra, "--json", str(out)]) == 0
        steps[name] = json.loads(out.read_text())["step_time"]
    assert steps["capacity"] < steps["balanced"] < steps["skewed"]
    # stage by stage: the same GPU work, less alltoall's one forward wait per MoE layer (8 layers a stage)
    job = Job(ParallelDims(dp=8, tp=2, ep=8), sp=True)
    padded = replace(MIXTRAL, moe=replace(MIXTRAL.moe, capacity_factor=1.0))
    balanced, capacity = (model_costs(m, 4, 16, HW, job).table.stages for m in (MIXTRAL, padded))
    for b, c in zip(balanced, capacity, strict=True):
        assert b.forward - c.forward == pytest.approx(8 * SYNC_GAP, rel=1e-9)
        assert (b.backward_input, b.backward_weight) == (c.backward_input, c.backward_weight)
    assert main(["simulate", "1f1b", "-p", "2", "-m", "4", "--model", "gpt", "--moe-load-imbalance", "1.2",
                 "--hardware", "dgx-h100"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--moe-load-imbalance needs a mixture-of-experts model (--model-config mixtral-8x7b, ...)")
