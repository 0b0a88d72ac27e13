"""A measured step replayed through the simulator (pipesim.sim.replay): exact on consistent timelines, what-ifs that
follow the dependencies, and `pipesim whatif`'s refusals."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import schedules
from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig
from pipesim.sim import replay
from pipesim.sim.sim_setup import SimSetup
from pipesim.timeline import Timeline

DATA = Path(__file__).parent / "data"


def _as_measured(name: str, p: int, m: int, slow: tuple = ()) -> Timeline:
    """A simulated step on local-cpu (core sharing, gloo's posting and late RECVs) relabelled as measured."""
    from pipesim.sim.perturb import Perturbation

    setup = SimSetup(load_hardware("local-cpu"), ModelConfig(kind="mlp", hidden=512, layers=8, batch=32),
                     check_memory=False, perturb=Perturbation(slow=slow) if slow else None)
    res = setup.run(schedules.build(name, p, m))
    tl = res.timeline()
    return Timeline("measured", tl.schedule, tl.num_ranks, tl.events, {**tl.meta, "stages": res.schedule.num_stages})


@pytest.mark.parametrize(("name", "p", "m"), [("1f1b", 4, 8), ("zb-h1", 4, 8), ("interleaved-1f1b", 2, 4),
                                              ("zb-v", 2, 4)])
def test_replay_reproduces_a_consistent_step_exactly(name, p, m):
    tl = _as_measured(name, p, m)
    rec = replay.record(tl)
    out = replay.what_ifs(rec)
    assert out["replayed_step"] == pytest.approx(out["measured_step"], rel=1e-12)
    assert [x["share"] for x in out["ranks"] if x["rank"] == out["median_rank"]] == [0.0]


def test_replay_of_a_recorded_executor_run_is_exact_to_its_clock():
    """pipesim run's send spans last to the send's completion: where one outlasts its consumer's start the
    posting is cut there; what remains is below 0.01 % on this run."""
    tl = Timeline.read(DATA / "measured_1f1b_gpt_p2.json")
    out = replay.what_ifs(replay.record(tl))
    assert abs(out["replay_error"]) < 1e-4


def test_the_slow_rank_is_the_one_whose_removal_saves_most():
    tl = _as_measured("1f1b", 4, 8, slow=((2, 1.6),))
    out = replay.what_ifs(replay.record(tl))
    best = max(out["ranks"], key=lambda x: x["share"])
    assert best["rank"] == 2 and best["share"] > 0
    assert all(x["share"] < best["share"] for x in out["ranks"] if x["rank"] != 2)


def test_a_missing_recv_counts_as_ending_when_its_compute_began():
    tl = _as_measured("1f1b", 2, 4)
    kept = [e for e in tl.events if e.stream != "recv"]
    rec = replay.record(replace(tl, events=kept))
    assert replay.what_ifs(rec)["replay_error"] == pytest.approx(0.0, abs=1e-12)


def test_refusals():
    tl = _as_measured("1f1b", 2, 4)
    with pytest.raises(PipesimError, match="not a registered one"):
        replay.record(replace(tl, schedule="unknown"))
    with pytest.raises(PipesimError, match="no 1F3 on rank 1"):
        replay.record(replace(tl, events=[e for e in tl.events if not (e.rank == 1 and e.kind == "F"
                                                                      and e.microbatch == 3)]))
    with pytest.raises(PipesimError, match="not step 7"):
        replay.pick_step(tl, 7)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_whatif_cli(tmp_path, capsys):
    path = tmp_path / "run.json"
    _as_measured("1f1b", 2, 4).write(path)
    code, out, _ = _cli(capsys, "whatif", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["replay_error"] == pytest.approx(0.0, abs=1e-12) and len(data["ranks"]) == 2
    code, out, _ = _cli(capsys, "whatif", str(path), "--slow", "1=1.5")
    assert code == 0 and "what if rank 1 x1.5" in out
    code, _, err = _cli(capsys, "whatif", str(path), "--slow", "2=1.5")
    assert code == 2 and err.count("\n") == 1 and "pipeline rank 2 does not exist" in err
    sim = tmp_path / "sim.json"
    tl = Timeline.read(path)
    Timeline("simulated", tl.schedule, tl.num_ranks, tl.events, tl.meta).write(sim)
    code, _, err = _cli(capsys, "whatif", str(sim))
    assert code == 2 and "is a simulated timeline" in err


@pytest.mark.parametrize(("name", "rel"), [("1f1b", 1e-9), ("zb-h1", 1e-9), ("interleaved-1f1b", 3e-3)])
def test_the_replays_straggler_is_the_simulators_on_its_own_timeline(name, rel):
    """Replaying a simulated step (gloo's SEND posting and late RECVs included) with rank 1 stretched gives the loss
    the simulator predicts for the same straggler, exactly, when ranks do not slow each other (co-run 0: with it the
    simulator also slows rank 0 while the stretched rank runs, which a replay of fixed durations does not).
    Interleaved to 0.3 %: there transfers queue on the shared loopback bus, and a simulated timeline's send spans are
    the link's occupancy, which then begins after the posting the replay reads from them."""
    from pipesim.sim.perturb import Perturbation

    hw = load_hardware("local-cpu")
    setup = SimSetup(hw.with_host(node_corun_slowdown=0.0), ModelConfig(kind="mlp", hidden=1024, layers=8, batch=64),
                     check_memory=False)
    sched = schedules.build(name, 2, 8)
    slow = Perturbation(slow=((1, 1.5),))
    base, stretched = setup.run(sched), replace(setup, perturb=slow).run(sched)
    tl = base.timeline()
    rec = replay.record(Timeline("measured", tl.schedule, tl.num_ranks, tl.events,
                                 {**tl.meta, "stages": base.schedule.num_stages}))
    assert replay.run(rec, slow).makespan / replay.run(rec).makespan == pytest.approx(
        stretched.makespan / base.makespan, rel=rel)


def test_whatif_steps_are_numbered_from_one(tmp_path, capsys):
    path = tmp_path / "run.json"
    tl = _as_measured("1f1b", 2, 4)
    tl.write(path)
    code, out, _ = _cli(capsys, "whatif", str(path), "--step", "1", "--json")
    assert code == 0 and json.loads(out)["step"] == 1
    code, _, err = _cli(capsys, "whatif", str(path), "--step", "2")
    assert code == 2 and "the timeline has steps 1-1" in err


def test_whatif_trace_draws_the_replayed_steps_blame(tmp_path, capsys):
    path, out = tmp_path / "run.json", tmp_path / "slow.json"
    _as_measured("1f1b", 4, 8).write(path)
    code, _, _ = _cli(capsys, "whatif", str(path), "--slow", "1=1.5", "--trace", str(out))
    assert code == 0
    drawn = Timeline.read(out)
    assert drawn.meta["what_if"] == "rank 1 x1.5" and drawn.meta["blame"]
    culprits = {row[3] for row in drawn.meta["blame"]}
    assert "rank 1" in culprits
    slices = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("cat") == "blame"]
    assert len(slices) == len(drawn.meta["blame"])
