"""The executor's mixture-of-experts model (`--model moe`, `--ep`): what the simulator counts, the layouts refused, and
every registered schedule trained to the single-process reference on 2 and 4 gloo ranks with ep 2 (the router on one
process: tests/test_moe_routing.py).

The distributed runs are one `--then` chain per world size in the session's shared launches (tests/launch_shared.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import schedules
from executor.experts import MoeMLP, expert_parameters, shard_experts
from executor.models import build_full, build_piece
from executor.run_config import RunConfig
from executor.stage import backward_input, backward_weight
from executor.transformer import Block
from executor.user_model import call_factory, train_single, workload_from_parts
from pipesim.cli import build_parser, main
from pipesim.commands.setup_args import setup_from_args
from pipesim.cost.executor_ops import executor_moe_block_ops
from pipesim.cost.stage_work import gpt_stage_work
from pipesim.errors import PipesimError
from pipesim.ir.schedule import Action
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.flops import moe_mlp_delta
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.moe import MoeConfig
from pipesim.model.moe_layer import expert_params_here, moe_block_params
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import model_params
from pipesim.parallel_dims import ParallelDims
from pipesim.timeline import Timeline
from tests.executor_helpers import OpCount, assert_matches_reference, chain, load_run
from tests.launch_shared import register_run
from tests.moe_helpers import MOE, STEPS, moe_model


def _admitted(p: int, m: int) -> list[str]:
    out = []
    for name in schedules.names():
        try:
            schedules.build(name, p, m)
        except PipesimError:
            continue
        out.append(name)
    return out


TWO = _admitted(1, 2)  # pp 1 x dp 2, ep 2: every schedule that runs one pipeline rank
FOUR = _admitted(2, 4)  # pp 2 x dp 2, ep 2


# -- the same model the simulator counts -----------------------------------------------------------------------

@pytest.mark.parametrize("ep", [1, 2, 4])
@pytest.mark.parametrize("shared", [None, 24, "gated"])
def test_an_ep_ranks_moe_mlp_holds_the_parameters_the_simulator_counts(ep, shared):
    model = _gated(moe_model(shared=24)) if shared == "gated" else moe_model(shared=shared)
    layer = MoeMLP(model.hidden, model.moe)
    shard_experts(layer, ep - 1, ep, group=object())  # the last ep rank's experts (no exchange runs here)
    opts = LayerOptions(ep=ep)
    assert sum(p.numel() for p in layer.parameters()) == moe_block_params(model, opts)
    assert sum(p.numel() for p in expert_parameters([layer])) == expert_params_here(model, opts)
    assert [n for n, _ in layer.experts.named_children()] == [str(e) for e in range(4 - 4 // ep, 4)]


@pytest.mark.parametrize("ep", [2, 4])
def test_an_ep_rank_draws_only_its_experts_and_they_are_the_whole_layers(ep):
    """Each expert from its own seed: a block built for ep coordinate r holds experts r E / ep .. (r + 1) E / ep - 1
    alone (never drawing the others: a Qwen3-235B layer's 128 experts are 9.7 GB in float32), every value the
    whole block's, bit for bit."""
    whole = build_piece(moe_model(), 1).state_dict()
    for r in range(ep):
        part = build_piece(moe_model(), 1, ep=(r, ep))
        assert sorted(part.moe.experts, key=int) == [str(e) for e in range(r * 4 // ep, (r + 1) * 4 // ep)]
        got = part.state_dict()
        assert set(got) <= set(whole) and all(torch.equal(whole[k], v) for k, v in got.items())
        assert len(whole) - len(got) == (4 - 4 // ep) * 4  # the other experts' fc1/fc2 weights and biases


@pytest.mark.parametrize("gated", [False, True])
def test_the_full_moe_model_holds_the_simulators_parameter_count(gated):
    model = _gated(moe_model(shared=24)) if gated else moe_model(shared=24)
    assert sum(p.numel() for p in build_full(model).parameters()) == model_params(model)


def _gated(model: ModelConfig) -> ModelConfig:
    """`model` with its shared expert's output behind Qwen2-MoE's sigmoid gate (MoeConfig.shared_gate)."""
    return replace(model, moe=replace(model.moe, shared_gate=True))


def _written_out(layer: MoeMLP, x: torch.Tensor) -> torch.Tensor:
    """Qwen2MoeSparseMoeBlock written out in float64 on `layer`'s weights (GeLU experts with biases, a softmax top-k
    router without renormalising), a token at a time: sum over its k experts of p_e expert_e(x), plus
    sigmoid(x . w) shared(x)."""
    w = {name: p.detach().double() for name, p in layer.named_parameters()}

    def mlp(prefix: str, t: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(t @ w[f"{prefix}.fc1.weight"].T + w[f"{prefix}.fc1.bias"])
        return hidden @ w[f"{prefix}.fc2.weight"].T + w[f"{prefix}.fc2.bias"]

    rows = []
    for t in x.double().reshape(-1, x.shape[-1]):
        probs = torch.softmax(t @ w["router.weight"].T + w["router.bias"], dim=-1)
        top = probs.topk(layer.top_k)
        routed = sum(p * mlp(f"experts.{int(e)}", t) for p, e in zip(top.values, top.indices, strict=True))
        rows.append(routed + torch.sigmoid(t @ w["shared_gate.weight"][0]) * mlp("shared", t))
    return torch.stack(rows).view(x.shape)


def test_the_shared_gate_scales_the_shared_experts_output_by_the_sigmoid_of_the_token():
    """MoeConfig.shared_gate: the layer's output is its routed experts' plus sigmoid(x . w) times the shared
    expert's (transformers' Qwen2MoeSparseMoeBlock), w a Linear(h, 1) without bias; the gate is drawn after every other
    parameter, so those are the ungated layer's bit for bit, and an ungated layer builds none."""
    moe = replace(moe_model(shared=24).moe, router_bias=True)
    torch.manual_seed(3)
    plain = MoeMLP(16, moe)
    torch.manual_seed(3)
    layer = MoeMLP(16, replace(moe, shared_gate=True))
    assert plain.shared_gate is None and not any("gate" in name for name, _ in plain.named_parameters())
    gated = dict(layer.named_parameters())
    assert gated.keys() - dict(plain.named_parameters()).keys() == {"shared_gate.weight"}
    assert gated["shared_gate.weight"].shape == (1, 16)
    assert all(torch.equal(gated[name], p) for name, p in plain.named_parameters())
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(layer(x).double(), _written_out(layer, x), rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # a gate of sigmoid(0) = 1/2 halves the shared output, nothing else changes
        layer.shared_gate.weight.zero_()
    torch.testing.assert_close(layer(x), plain(x) - plain.shared(x.reshape(-1, 16)).view(x.shape) / 2, rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("gated", [False, True])
def test_an_moe_mlps_gemm_flops_are_the_simulators(gated):
    """Dropless: the router, each token's k experts and the shared expert (and its gate), 2 FLOPs per weight per
    token (the simulator's MoE MLP: the dense MLP's plus `moe_mlp_delta`)."""
    model = _gated(moe_model(shared=24)) if gated else moe_model(shared=24)
    layer = MoeMLP(model.hidden, model.moe)
    x = torch.randn(2, model.seq, model.hidden)
    with FlopCounterMode(display=False) as counter:
        layer(x)
    tokens = 2 * model.seq
    dense_mlp = 2 * tokens * 2 * model.hidden * model.ffn_size
    assert counter.get_total_flops() == dense_mlp + moe_mlp_delta(model, tokens)


@pytest.mark.parametrize(("experts", "shared", "balance", "z", "sequences", "gated"),
                         [(2, None, "none", 0, 2, False), (4, None, "none", 0, 2, False), (4, 16, "none", 0, 2, False),
                          (8, 16, "none", 0, 2, False), (4, None, "aux_loss", 0, 2, False),
                          (4, None, "seq_aux_loss", 0, 1, False), (4, 16, "seq_aux_loss", 0, 3, False),
                          (4, None, "none", 0.1, 2, False), (4, 16, "aux_loss", 0.1, 3, False),
                          (4, 16, "none", 0, 2, True), (8, 16, "aux_loss", 0.1, 3, True)])
def test_the_simulators_op_count_of_an_moe_block_is_the_executors(experts, shared, balance, z, sequences, gated):
    """The router's losses' ops are the same for one balance group or several (`sequences` in a microbatch); `gated`:
    the shared expert's sigmoid gate (Qwen2-MoE's, SHARED_GATE_OPS)."""
    model = ModelConfig(kind="gpt", hidden=16, heads=2, seq=8, vocab=32, layers=1, batch=8,
                        moe=MoeConfig(experts=experts, top_k=2, expert_ffn=32, shared_experts=1 if shared else 0,
                                      shared_ffn=shared, balance=balance, aux_loss_coeff=0.5, z_loss_coeff=z,
                                      shared_gate=gated))
    block = Block(model, 0)
    x = torch.randn(sequences, 8, 16, requires_grad=True)
    with OpCount() as f:
        out = block(x)
    grad = torch.randn_like(out)
    with OpCount() as i:
        _, state = backward_input(out, grad, x, list(block.parameters()))
    with OpCount() as w:
        backward_weight(state, list(block.parameters()))
    counts = (f.ops, i.ops, w.ops)
    assert counts == executor_moe_block_ops(model, LayerOptions())
    dense = Block(ModelConfig(kind="gpt", hidden=16, heads=2, seq=8, vocab=32, layers=1, batch=8), 0)
    with OpCount() as f:
        dense(x)
    assert f.ops == 10  # GPT_BLOCK_OPS's F: the same way of counting


def test_on_a_cpu_host_whose_cores_all_compute_the_overlapped_pair_hides_no_all_to_all():
    """local-cpu (2 cores) with 2 ranks: gloo's exchange needs the cores the pair computes on (share 1), so
    DualPipeV's step is the same with its pairs overlapped or run one half after the other; with spare cores (a
    host of 8) the pairs hide their all-to-alls and the step is shorter."""
    args = build_parser().parse_args(["simulate", "dualpipev", "-p", "1", "-m", "4", *MOE, "--dp", "2", "--ep", "2",
                                      "--hardware", "local-cpu"])
    setup = setup_from_args(args)
    sched = schedules.build("dualpipev", 1, 4)
    plain = replace(sched, overlaps=frozenset())

    def step(s, schedule):
        return s.evaluate(schedule)[0].to_dict()["makespan"]

    assert step(setup, sched) == pytest.approx(step(setup, plain), rel=1e-12)
    roomy = replace(setup, hardware=replace(setup.hardware, host=replace(setup.hardware.host, cores=8)))
    assert step(roomy, sched) < step(roomy, plain)


# -- refused before anything starts -----------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "message"), [
    (["--ep", "3", "--dp", "3", "--nproc", "3"], "--ep 3 does not divide the 4 experts (--num-experts)"),
    (["--ep", "4", "--dp", "2", "--nproc", "4"], "dp(2) * tp(1) is not divisible by ep(4) * etp(1)"),
    (["--ep", "2", "--dp", "2", "--nproc", "2", "--moe-router-topk", "5"], "moe top_k 5 is more than its 4 experts"),
    (["--ep", "2", "--dp", "2", "--nproc", "3"], "WORLD_SIZE(3) is not divisible by dp(2) * tp(1)"),
    (["--ep", "2", "--dp", "2", "--nproc", "4", "--tp", "2", "--etp", "1"],
     "--model moe with --tp 2 needs --sequence-parallel (each tp rank routes its own tokens"),
    (["--ep", "2", "--dp", "2", "--nproc", "4", "--tp", "2", "--sequence-parallel"],
     "and --etp 1 (whole experts on each rank"),
])
def test_a_bad_expert_layout_exits_2_in_one_line_before_launching(argv, message, capsys):
    assert main(["run", "1f1b", "--microbatches", "2", *MOE, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pipesim: error: ") and message in err


def test_a_balance_loss_needs_experts_and_a_coefficient_it_can_use(capsys):
    assert main(["simulate", "1f1b", "--model-config", "llama3-8b", "--moe-aux-loss-coeff", "0.01"]) == 2
    assert capsys.readouterr().err == ("pipesim: error: --moe-aux-loss-coeff needs a mixture-of-experts model "
                                       "(--model-config mixtral-8x7b, ...)\n")
    assert main(["run", "1f1b", "--nproc", "2", "--microbatches", "2", *MOE, "--moe-aux-loss-coeff", "-1"]) == 2
    assert capsys.readouterr().err == "pipesim: error: moe aux_loss_coeff must be a finite number >= 0, got -1.0\n"
    with pytest.raises(SystemExit) as exit_:  # argparse's one line: a kind the executor does not train
        main(["run", "1f1b", "--nproc", "2", "--microbatches", "2", *MOE, "--moe-router-load-balancing-type",
              "sinkhorn"])
    assert exit_.value.code == 2 and "invalid choice: 'sinkhorn'" in capsys.readouterr().err


def test_ep_needs_experts_and_experts_need_moe():
    with pytest.raises(PipesimError, match="--ep 2 shards a mixture-of-experts model's experts; this model has none"):
        RunConfig(names=("1f1b",), microbatches=2, job=Job(dims=ParallelDims(dp=2, ep=2)),
                  model=ModelConfig(kind="gpt", heads=2, hidden=16, batch=8)).check(2)
    assert main(["run", "1f1b", "--nproc", "2", "--num-experts", "4"]) == 2


# -- trained like the reference --------------------------------------------------------------------------------

def _two_rank_flags(d):
    common = ["--dp", "2", "--ep", "2", "--microbatches", "2", "--steps", str(STEPS), "--quiet"]
    return chain([",".join(TWO), *MOE, *common, "--save-dir", str(d / "dropless")],
                 ["1f1b,dualpipev", *MOE, *common, "--moe-expert-capacity-factor", "1.0", "--save-dir", str(d / "cf")],
                 ["1f1b", *MOE, *common, "--moe-expert-capacity-factor", "1.0", "--moe-token-drop-policy", "position",
                  "--save-dir", str(d / "cf_position")],
                 ["1f1b,dualpipev", "--model", USER_MOE, "--batch", "8", *common, "--save-dir", str(d / "user")],
                 ["1f1b,dualpipev", *MOE, *TP, "--microbatches", "2", "--steps", str(STEPS), "--quiet", "--save-dir",
                  str(d / "tp")],
                 ["1f1b,dualpipev", *MOE, *common, *AUX, "--save-dir", str(d / "aux")],
                 ["1f1b,dualpipev", *MOE, *TP, "--microbatches", "2", "--steps", str(STEPS), "--quiet",
                  "--moe-expert-capacity-factor", "1.0", "--save-dir", str(d / "tp_cf")],
                 ["1f1b,dualpipev", *MOE, *TP, "--microbatches", "2", "--steps", str(STEPS), "--quiet", *AUX, *Z,
                  "--moe-router-load-balancing-type", "seq_aux_loss", "--save-dir", str(d / "tp_seq_aux")])


def _four_rank_flags(d):
    common = ["--dp", "2", "--ep", "2", "--microbatches", "4", "--steps", str(STEPS), "--quiet"]
    return chain([",".join(FOUR), *MOE, *common, "--save-dir", str(d / "dropless")],
                 ["dualpipev", *MOE, *common, "--moe-shared-expert-intermediate-size", "24", "--save-dir",
                  str(d / "shared"), "--trace", str(d / "dualpipev.json")],
                 ["dualpipev", *MOE, *common, "--no-a2a-overlap", "--save-dir", str(d / "plain"), "--trace",
                  str(d / "plain.json")],
                 ["1f1b,dualpipev", *MOE, "--dp", "4", "--ep", "2", "--microbatches", "2", "--steps", str(STEPS),
                  "--quiet", "--bucket-bytes", "4096", "--save-dir", str(d / "edp")],
                 ["1f1b,dualpipev", *MOE, *TP, "--dp", "2", "--microbatches", "2", "--steps", str(STEPS), "--quiet",
                  "--save-dir", str(d / "tp_dp")],
                 ["1f1b,dualpipev", *MOE, *TP, "--microbatches", "4", "--steps", str(STEPS), "--quiet",
                  "--save-dir", str(d / "tp_pp")],
                 ["1f1b,zb-h1,dualpipev", *MOE, *TP, "--microbatches", "4", "--steps", str(STEPS), "--quiet", *AUX,
                  *Z, "--save-dir", str(d / "tp_pp_aux")],
                 ["1f1b,zb-h1,dualpipev", *MOE, *TP, "--microbatches", "4", "--steps", str(STEPS), "--quiet", *AUX,
                  *Z, "--moe-expert-capacity-factor", "1.0", "--recompute", "full", "--save-dir", str(d / "recompute")])


TP = ["--tp", "2", "--ep", "2", "--etp", "1", "--sequence-parallel"]  # attention over tp, whole experts over ep
AUX = ["--moe-aux-loss-coeff", "0.5"]  # Megatron-core's load-balancing loss (aux_loss: over each microbatch)
Z = ["--moe-z-loss-coeff", "0.1"]  # and its router z-loss
USER_MOE = "examples/moe_layers.py:make"  # a factory's own layers holding executor.experts.MoeMLP
TWO_RANKS = register_run("moe_executor_2", 2, _two_rank_flags)
FOUR_RANKS = register_run("moe_executor_4", 4, _four_rank_flags)


@pytest.mark.dist
def test_every_schedule_trains_the_moe_model_like_the_reference_on_two_ranks_ep2(shared_launches):
    d = shared_launches.case(TWO_RANKS).check()
    assert "dualpipev" in TWO and "combined-1f1b" in TWO
    assert_matches_reference(d / "cf_position", "1f1b", moe_model(capacity_factor=1.0, drop_policy="position"), STEPS)
    for name in TWO:
        assert_matches_reference(d / "dropless", name, moe_model(), STEPS)
    for name in ("1f1b", "dualpipev"):  # capacity 1.0 drops pairs (test_routing_is_the_same_however_the_batch_is_cut)
        assert_matches_reference(d / "cf", name, moe_model(capacity_factor=1.0), STEPS)  # the probs policy
        assert_matches_reference(d / "tp", name, moe_model(), STEPS)  # tp 2 x ep 2 on the same two ranks
        # the balance loss over each microbatch of 8 / (dp 2 x 2) = 2 sequences; per sequence, split over tp 2 (with
        # the z-loss, its mean over a microbatch split over tp 2)
        assert_matches_reference(d / "aux", name, moe_model(aux=0.5), STEPS, balance_sequences=2)
        # capacity at tp 2 with SP: each rank counts its half of a sequence (Megatron-core's per-rank capacity)
        assert_matches_reference(d / "tp_cf", name, moe_model(capacity_factor=1.0), STEPS, capacity_parts=2)
        assert_matches_reference(d / "tp_seq_aux", name, moe_model(balance="seq_aux_loss", aux=0.5, z=0.1), STEPS)


@pytest.mark.dist
def test_a_factorys_own_moe_layers_train_with_ep_like_the_reference(shared_launches):
    d = shared_launches.case(TWO_RANKS).check()
    ref_losses, ref_params = train_single(workload_from_parts(call_factory(USER_MOE, 0), batch=8, seed=0, split=None),
                                          STEPS)
    for name in ("1f1b", "dualpipev"):
        losses, params = load_run(d / "user", name)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
        assert params.keys() == ref_params.keys() and "pieces.3.moe.experts.3.fc2.bias" in params
        for key, value in ref_params.items():
            torch.testing.assert_close(params[key], value, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, k=key, n=name: f"{n} {k}: {m}")


def test_ep_on_a_factory_without_moe_layers_is_refused_before_launching(capsys):
    assert main(["run", "1f1b", "--nproc", "2", "--dp", "2", "--ep", "2", "--microbatches", "2", "--batch", "8",
                 "--model", "examples/widths.py:make"]) == 2
    err = capsys.readouterr().err
    assert err == ("pipesim: error: --ep 2 shards MoE layers (executor.experts.MoeMLP); --model "
                   "examples/widths.py:make has none\n")


@pytest.mark.dist
def test_every_schedule_trains_the_moe_model_like_the_reference_on_four_ranks_ep2(shared_launches):
    d = shared_launches.case(FOUR_RANKS).check()
    assert {"dualpipev", "dualpipe", "zb-v"} <= set(FOUR)
    for name in FOUR:
        assert_matches_reference(d / "dropless", name, moe_model(), STEPS)
    # SGD: Adam turns the key bias's gradient, zero but for rounding (softmax ignores it), into whole steps
    assert_matches_reference(d / "shared", "dualpipev", moe_model(shared=24), STEPS)
    for name in ("1f1b", "dualpipev"):  # dp 4 x ep 2: expert gradients averaged over edp groups of 2 ([0, 2], [1, 3])
        assert_matches_reference(d / "edp", name, moe_model(), STEPS)
        assert_matches_reference(d / "tp_dp", name, moe_model(), STEPS)  # dp 2 x tp 2, ep 2 (edp 2)
        assert_matches_reference(d / "tp_pp", name, moe_model(), STEPS)  # pp 2 x tp 2, ep 2
    for name in ("1f1b", "zb-h1", "dualpipev"):  # microbatches of 2 sequences, each split over tp 2 (counts summed)
        assert_matches_reference(d / "tp_pp_aux", name, moe_model(aux=0.5, z=0.1), STEPS, balance_sequences=2)
        # full recomputation: each block re-run in its backward, all-to-alls, capacity and losses included
        assert_matches_reference(d / "recompute", name, moe_model(aux=0.5, z=0.1, capacity_factor=1.0), STEPS,
                                 balance_sequences=2, capacity_parts=2)


def _exchanges_per_pair(tl: Timeline) -> list[tuple[int, int]]:
    """For each overlapped pair on each rank (step 2): (exchanges in the forward's bar issued before the backward
    starts, exchanges in the backward's bar labelled with the backward)."""
    pairs = [(Action.parse(f), Action.parse(b)) for f, b in tl.meta["overlaps"]]
    out = []
    for rank in range(4):
        ev = [e for e in tl.events if e.rank == rank and e.step == 1]
        computes = {(e.kind, e.stage, e.microbatch): e for e in ev if e.stream == "compute"}
        exchanges = [e for e in ev if e.kind == "all_to_all"]
        for f, b in pairs:
            if ("F", f.stage, f.microbatch) not in computes:
                continue  # another rank's pair
            fwd, bwd = computes[("F", f.stage, f.microbatch)], computes[("B", b.stage, b.microbatch)]
            in_fwd = [e for e in exchanges if (e.stage, e.microbatch) == (f.stage, f.microbatch)
                      and fwd.start <= e.start < bwd.start]
            in_bwd = [e for e in exchanges if (e.stage, e.microbatch) == (b.stage, b.microbatch)
                      and bwd.start <= e.start <= bwd.end]
            out.append((len(in_fwd), len(in_bwd)))
    assert len(out) == 2 * len(pairs)  # each pair on both data-parallel replicas of its pipeline rank
    return out


@pytest.mark.dist
def test_dualpipev_waits_for_the_forwards_all_to_all_after_the_paired_backward(shared_launches):
    """Each overlapped pair (one MoE layer per chunk here): the forward issues its dispatch and stops (one exchange
    in its bar, issued before the backward starts); the backward's two exchanges and then the forward's combine
    run in the backward's bar (the pair's op records the forward's tail there). With --no-a2a-overlap the same
    order runs back to back: the forward's bar holds both its exchanges, the backward's its own two, and it
    trains the same."""
    d = shared_launches.case(FOUR_RANKS).check()
    assert set(_exchanges_per_pair(Timeline.read(d / "dualpipev.json"))) == {(1, 3)}
    assert set(_exchanges_per_pair(Timeline.read(d / "plain.json"))) == {(2, 2)}
    assert_matches_reference(d / "plain", "dualpipev", moe_model(), STEPS)


def test_full_recomputation_of_an_moe_block_charges_its_own_forward_again():
    """On a calibrated CPU host the I phase of a fully recomputed block re-runs that block's forward: an MoE block's
    (executor_moe_block_ops' F, 38 here; the executor's checkpoint measures 36 more ops in I), not the dense block's
    (10), which gpt_stage_work charged before 2026-12-07."""
    model = ModelConfig(kind="gpt", hidden=16, heads=2, seq=8, vocab=32, layers=1, batch=8,
                        moe=MoeConfig(experts=4, top_k=2, expert_ffn=32))
    plain, full = LayerOptions(), LayerOptions(recompute="full")
    f, i, w = executor_moe_block_ops(model, plain)
    work = gpt_stage_work(model, 2, StageLayers.uniform(1, 1), first=False, last=False, opts=full, executor_ops=True)
    assert f == 38
    assert work.ops == {"F": f, "I": i + f, "W": w}
