"""pipesim/frameworks.py: software profiles as named sets of the command line's switches; Megatron-core's
--overlap-p2p-communication and --overlap-param-gather, which the profiles set."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import tomllib

import schedules
from pipesim.cli import build_parser, main
from pipesim.comm.comm_options import CommOptions
from pipesim.commands.setup_args import sim_job
from pipesim.cost.model_costs import uniform_costs
from pipesim.cost.step_costs import stage_step_collectives
from pipesim.errors import PipesimError
from pipesim.frameworks import DEFAULTS, PROFILES, FrameworkProfile, Setting, profile, resolve
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.kernel_switches import KernelSwitches
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.simulator import simulate

MS = 1e-3  # seconds per millisecond
ROOT = Path(__file__).resolve().parent.parent
H100X2 = load_hardware("2x-dgx-h100")
GPT = ["--model", "gpt", "--dtype", "bfloat16", "--hidden", "1024", "--layers", "8", "--heads", "16", "--seq", "1024",
       "--batch", "16", "--hardware", "dgx-h100", "--nodes", "2"]


def _sim(tmp_path, name: str, *argv: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["simulate", *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_profile_names_known_switches_each_with_a_source():
    assert set(PROFILES) == {"megatron-lm-2021", "megatron-lm-2022", "megatron-core", "nemo", "torchtitan", "deepspeed"}
    for p in PROFILES.values():
        assert p.settings and all(s.dest in DEFAULTS and len(s.source) > 20 for s in p.settings)
        assert len({s.dest for s in p.settings}) == len(p.settings)  # each switch once
    with pytest.raises(PipesimError, match="unknown switches bogus"):
        FrameworkProfile("x", "y", (Setting("bogus", 1, "z"),))
    with pytest.raises(PipesimError, match="choose one of megatron-lm-2021, megatron-lm-2022, megatron-core"):
        profile("megatron")


def test_a_typed_flag_wins_over_the_profile_which_wins_over_the_default():
    nemo = resolve({}, "nemo")
    assert (nemo["zero"], nemo["overlap_grad_reduce"], nemo["overlap_param_gather"], nemo["grad_fp32"]) == \
        (1, True, True, True)
    assert (nemo["blocking_p2p"], nemo["overlap_p2p_comm"], nemo["scatter_gather"]) == (True, True, False)
    assert resolve({"zero": 2, "blocking_p2p": False}, "nemo")["zero"] == 2
    assert resolve({"blocking_p2p": False}, "nemo")["blocking_p2p"] is False
    assert resolve({}, None) == DEFAULTS
    assert resolve({"zero": None}, "torchtitan")["zero"] == 3
    assert (nemo["ce_fusion"], DEFAULTS["ce_fusion"]) == (True, False)  # NeMo 2's GPTConfig; Megatron-core's default
    assert resolve({"ce_fusion": False}, "nemo")["ce_fusion"] is False  # --no-cross-entropy-loss-fusion
    off = sim_job(build_parser().parse_args(["simulate", "1f1b", "--framework", "nemo",
                                             "--no-cross-entropy-loss-fusion"]), None, None)
    assert off.kernels.ce_fusion is False and "--cross-entropy-loss-fusion" not in off.kernels.flags()
    assert KernelSwitches(ce_fusion=True).flags() == ["--cross-entropy-loss-fusion"]
    te = KernelSwitches(ce_fusion=True, ce_impl="te")
    assert te.flags() == te.ce_flags() == ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    assert te.cross_entropy == "te" and KernelSwitches(ce_impl="native").cross_entropy == "unfused"


def test_the_2021_profile_is_exactly_the_flags_nar21s_rows_type(tmp_path):
    layout = ["--tp", "2", "--stages", "2", "--dp", "2", "--microbatch-size", "2"]
    typed = _sim(tmp_path, "typed", "1f1b", *GPT, *layout, "--scatter-gather", "--blocking-p2p", "--attention",
                 "eager", "--no-async-tensor-model-parallel-allreduce", "--no-gradient-accumulation-fusion")
    named = _sim(tmp_path, "named", "1f1b", *GPT, *layout, "--framework", "megatron-lm-2021")
    plain = _sim(tmp_path, "plain", "1f1b", *GPT, *layout)
    assert named["step_time"] == typed["step_time"] != plain["step_time"]
    # and a flag beside the profile wins: the sends no longer block
    freed = _sim(tmp_path, "freed", "1f1b", *GPT, *layout, "--framework", "megatron-lm-2021", "--blocking-p2p")
    assert freed["step_time"] == typed["step_time"]


def test_overlap_p2p_lifts_the_block_on_an_interleaved_schedule_only():
    def run(name: str, v: int, comm: CommOptions) -> float:
        sched = schedules.build(name, 2, 4, virtual=v)
        c = uniform_costs(2 * v, {"F": MS, "I": MS, "W": MS}, boundary_bytes=2**24)
        return simulate(sched, replace(c, job=replace(c.job, comm=comm)), H100X2).makespan
    both = CommOptions(blocking_p2p=True, overlap_p2p_comm=True)
    assert run("interleaved-1f1b", 2, both) == run("interleaved-1f1b", 2, CommOptions())
    assert run("interleaved-1f1b", 2, both) < run("interleaved-1f1b", 2, CommOptions(blocking_p2p=True))
    assert run("1f1b", 1, both) == run("1f1b", 1, CommOptions(blocking_p2p=True)) > run("1f1b", 1, CommOptions())
    assert both.flags() == ["--blocking-p2p", "--overlap-p2p-communication"]
    assert [CommOptions().blocks_sends(i) for i in (False, True)] == [False, False]  # the default never blocks
    assert [both.blocks_sends(i) for i in (False, True)] == [True, False]


def test_overlap_param_gather_moves_the_all_gather_before_the_first_forward():
    plain = stage_step_collectives(1000, dp=4, zero=1)
    moved = stage_step_collectives(1000, dp=4, zero=1, overlap_param_gather=True)
    assert [(c.kind, c.phase) for c in plain] == [("reduce_scatter", "grads"), ("all_gather", "params")]
    assert [(c.kind, c.phase) for c in moved] == [("reduce_scatter", "grads"), ("all_gather", "forward")]
    assert [c.nbytes for c in plain] == [c.nbytes for c in moved]
    with pytest.raises(PipesimError, match="needs --overlap-grad-reduce"):
        CommOptions(overlap_param_gather=True)
    comm = CommOptions(overlap_grad_reduce=True, overlap_param_gather=True)
    for zero in (0, 3):
        with pytest.raises(PipesimError, match=f"needs the distributed optimizer's .* got --zero {zero}"):
            Job(ParallelDims(dp=2), zero=zero, comm=comm)
    assert Job(ParallelDims(dp=2), zero=2, comm=comm).comm.overlap_param_gather


def test_overlap_param_gather_gates_the_first_forward_on_its_buckets_closed_form(tmp_path):
    # p = 1, dp 4 in one node: the chunk's gather runs in Megatron's buckets (max(40M, 1M dp) parameters) from the
    # step's start; the first forward starts at max_k (end_k - F c_{k-1}), F its seconds alone, c_{k-1} the
    # fraction of the parameters in the buckets before k (each layer's bucket is in before the layer runs)
    one = ["--stages", "1", "-m", "4", "--dp", "4", "--zero", "1", "--overlap-grad-reduce"]
    d = _sim(tmp_path, "before", "1f1b", *GPT, *one, "--overlap-param-gather")
    gathers = [c for c in d["collectives"] if c["kind"] == "all_gather"]
    assert [c["phase"] for c in gathers] == ["forward"] * 3 and gathers[0]["start"] == 0.0
    assert [c["bytes"] for c in gathers][:2] == [40_000_000 * 2] * 2  # bf16 parameters
    span = {c["name"]: (c["start"], c["end"]) for c in d["critical_path"] if c["kind"] == "compute"}
    forward = span["0F1"][1] - span["0F1"][0]  # a forward beside no collective
    total, before, ready = sum(c["bytes"] for c in gathers), 0, 0.0
    for c in gathers:
        ready = max(ready, c["end"] - forward * before / total)
        before += c["bytes"]
    assert span["0F0"][0] == pytest.approx(ready, rel=1e-12)
    after = _sim(tmp_path, "after", "1f1b", *GPT, *one)
    assert [c["phase"] for c in after["collectives"] if c["kind"] == "all_gather"] == ["params"]
    assert d["step_time"] < after["step_time"]


def test_a_profile_switch_is_refused_like_the_typed_flag(capsys):
    # nemo's overlapped parameter gather with a typed --zero 0: the same one-line refusal as typing both flags
    code = main(["simulate", "1f1b", *GPT, "--stages", "2", "--dp", "2", "--framework", "nemo", "--zero", "0"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overlap-param-gather needs the distributed optimizer's" in err[0]


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_a_profile_is_its_flags_typed_out_and_docs_list_them(name):
    model = ["1f1b", "--model", "gpt", "--dtype", "bfloat16", "--dp", "2", "--tp", "2"]
    hw = load_hardware("dgx-h100")
    named = sim_job(build_parser().parse_args(["simulate", *model, "--framework", name]), None, hw)
    flags = " ".join(PROFILES[name].flags()).split()
    typed = sim_job(build_parser().parse_args(["simulate", *model, *flags]), None, hw)
    assert named == typed
    doc = (ROOT / "docs" / "frameworks.md").read_text()
    assert f"`--framework {name}` = `{' '.join(PROFILES[name].flags())}`" in doc


def test_the_2022_profile_is_exactly_the_flags_kor22s_rows_type():
    """KOR22's rows (bench/published_rows.toml) type Megatron-LM of 2022's switches; the profile is the same Job."""
    rows = tomllib.loads((ROOT / "bench" / "published_rows.toml").read_text())["rows"]
    command = next(r["command"] for r in rows if r["id"] == "kor22-22b-selective-sp").split()[1:]
    switches = ("--scatter-gather", "--blocking-p2p", "--no-gradient-accumulation-fusion")
    words = [w for w in command if w not in switches]
    i = words.index("--attention")
    assert words[i + 1] == "eager" and len(words) == len(command) - 3
    del words[i:i + 2]
    hw = load_hardware("dgx-a100")
    typed = sim_job(build_parser().parse_args(command), None, hw)
    named = sim_job(build_parser().parse_args(words + ["--framework", "megatron-lm-2022"]), None, hw)
    assert typed == named


def test_compile_turns_torchtitans_eager_kernels_into_the_fused_ones(tmp_path, capsys):
    """--compile: torch.compile's fused elementwise kernels where the torchtitan profile runs eager PyTorch; the
    step is the one pipesim times with Megatron's fused kernels, bit for bit."""
    def job(*flags: str) -> Job:
        return sim_job(build_parser().parse_args(["simulate", "1f1b", "--framework", "torchtitan", *flags]), None,
                       None)

    assert job().kernels.fusion is False and job("--compile").kernels.fusion is True
    base = [*GPT, "--stages", "1", "--dp", "16", "--zero", "3", "--microbatches", "1"]
    compiled = _sim(tmp_path, "c", "1f1b", *base, "--framework", "torchtitan", "--compile")
    eager = _sim(tmp_path, "e", "1f1b", *base, "--framework", "torchtitan")
    fused = _sim(tmp_path, "f", "1f1b", *base, "--no-async-tensor-model-parallel-allreduce",
                 "--no-gradient-accumulation-fusion", "--accumulate-allreduce-grads-in-fp32")
    assert compiled["step_time"] == fused["step_time"] < eager["step_time"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "1f1b", *base, "--compile", "--no-kernel-fusion"])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        "pipesim simulate: error: argument --no-kernel-fusion: not allowed with argument --compile"]
