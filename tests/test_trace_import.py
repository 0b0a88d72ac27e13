"""`pipesim import-trace` on profiler traces made here: torch.distributed.pipelining on 2 gloo CPU ranks.

tests/conftest.py's `profiled_traces` (one launch of tests/workers/profiled_pipeline.py, shared with
tests/test_trace_import_calibrate.py) runs torch's own Schedule1F1B (with_stack: it names no range of its
own), ScheduleGPipe, and pipesim's zb-h1 exported to CSV and run by torch's `_PipelineScheduleRuntime`
(ranges `PP:<action>`, split backward), each for the same steps under torch.profiler, one Chrome trace per
rank. The CLI runs in process (pipesim.cli.main: exit code, stdout and stderr as a shell sees them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

import schedules
from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.timeline import Timeline
from pipesim.trace_import import import_traces
from tests.conftest import ProfiledTraces

P, M, STEPS = ProfiledTraces.p, ProfiledTraces.m, ProfiledTraces.steps


@pytest.fixture
def one_f_one_b(profiled_traces) -> Path:
    return profiled_traces.one_f_one_b


@pytest.fixture
def gpipe(profiled_traces) -> Path:
    return profiled_traces.gpipe


@pytest.fixture
def zb_h1(profiled_traces) -> Path:
    return profiled_traces.zb_h1


class Ran(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys):
    """`pipesim ARGS...` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()

    def run(*args: str) -> Ran:
        code = main(list(args))
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


def _order(tl: Timeline, rank: int, step: int) -> list[str]:
    return [e.label for e in sorted(tl.events, key=lambda e: e.start)
            if e.rank == rank and e.step == step and e.stream == "compute"]


def _pipesim_order(name: str, rank: int) -> list[str]:
    return [str(a) for a in schedules.build(name, P, M).programs[rank] if a.is_compute]


def _check_times(tl: Timeline) -> None:
    """Per rank: every action ends after it starts; computes follow one another without overlap."""
    for rank in range(tl.num_ranks):
        mine = sorted((e for e in tl.events if e.rank == rank), key=lambda e: e.start)
        assert all(0 <= e.start <= e.end for e in mine)
        comp = [e for e in mine if e.stream == "compute"]
        assert all(a.end <= b.start for a, b in zip(comp, comp[1:])), rank


def test_torch_1f1b_imports_with_its_order(one_f_one_b):
    tl = import_traces([str(one_f_one_b)])
    assert (tl.source, tl.schedule, tl.num_ranks) == ("measured", "1f1b", P)  # inferred from the order
    assert {k: tl.meta[k] for k in ("stages", "microbatches", "steps", "pp", "recognized")} == {
        "stages": P, "microbatches": M, "steps": STEPS, "pp": P, "recognized": "frames"}
    torch_order = [[str(a) for a in row if a is not None and a.computation_type.value in "FBIW"]
                   for row in get_schedule_ops("1F1B", P, M)]
    for rank in range(P):
        for step in range(STEPS):
            order = _order(tl, rank, step)
            kinds = [label[1] for label in order]
            assert kinds.count("F") == kinds.count("B") == 1 * M  # one stage per rank x microbatches
            assert order == _pipesim_order("1f1b", rank)
            if rank < P - 1:  # torch 2.13 draws the last rank off by one (F1..F(m), see peers.md)
                assert order == torch_order[rank]
    _check_times(tl)


def test_torch_gpipe_imports_with_its_order(gpipe):
    tl = import_traces([str(gpipe)])
    assert (tl.schedule, tl.meta["recognized"], tl.meta["steps"]) == ("gpipe", "gpipe", STEPS)
    torch_order = [[str(a) for a in row if a is not None and a.computation_type.value in "FBIW"]
                   for row in get_schedule_ops("GPipe", P, M)]
    for rank in range(P):
        for step in range(STEPS):
            assert _order(tl, rank, step) == _pipesim_order("gpipe", rank) == torch_order[rank]
    _check_times(tl)
    _check_p2p(tl)


def test_1f1b_p2p_matched_to_their_actions(one_f_one_b):
    _check_p2p(import_traces([str(one_f_one_b)]))


def _check_p2p(tl: Timeline) -> None:
    """Each step's sends and recvs are those of 2 single-stage ranks, each beside the compute it serves."""
    for step in range(STEPS):
        comms = {(e.rank, e.label, e.peer) for e in tl.events if e.step == step and e.stream != "compute"}
        expected = {(0, f"0SEND_F{i}", 1) for i in range(M)} | {(0, f"0RECV_B{i}", 1) for i in range(M)} \
            | {(1, f"1RECV_F{i}", 0) for i in range(M)} | {(1, f"1SEND_B{i}", 0) for i in range(M)}
        assert comms == expected
    ends = {(e.rank, e.kind, e.microbatch, e.step): e for e in tl.events}
    for (rank, kind, mb, step), e in ends.items():
        recv = ends.get((rank, {"F": "RECV_F", "B": "RECV_B"}.get(kind, ""), mb, step))
        if e.stream == "compute" and recv is not None:  # a compute starts after its own input arrived
            assert e.start >= recv.end, (rank, kind, mb, step)
        send = ends.get((rank, {"F": "SEND_F", "B": "SEND_B"}.get(kind, ""), mb, step))
        if e.stream == "compute" and send is not None:  # and its output is sent after it ends
            assert send.start >= e.end, (rank, kind, mb, step)


def test_split_backward_runtime_imports(zb_h1):
    tl = import_traces([str(zb_h1 / "rank1.json"), str(zb_h1 / "rank0.json")])  # any order: ranks from the files
    assert (tl.schedule, tl.meta["recognized"], tl.meta["stages"], tl.meta["microbatches"]) == ("zb-h1", "pp", P, M)
    for rank in range(P):
        for step in range(STEPS):
            order = _order(tl, rank, step)
            assert [label[1] for label in order].count("F") == M
            assert [label[1] for label in order].count("I") == [label[1] for label in order].count("W") == M
            assert order == _pipesim_order("zb-h1", rank)
    _check_times(tl)
    peers = {(e.rank, e.kind, e.peer) for e in tl.events if e.stream != "compute"}
    assert peers == {(0, "SEND_F", 1), (0, "RECV_B", 1), (1, "RECV_F", 0), (1, "SEND_B", 0)}


def test_cli_imports_and_plots_against_a_simulation(one_f_one_b, tmp_path, cli):
    imported, sim, html = tmp_path / "imported.json", tmp_path / "sim.json", tmp_path / "compare.html"
    proc = cli("import-trace", str(one_f_one_b), "-o", str(imported))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"import-trace: 1f1b, 2 ranks, 2 stages, 4 microbatches, {STEPS} steps "
                                  f"({2 * 2 * M * STEPS} compute")  # ranks x (F, B) x microbatches x steps
    assert cli("simulate", "1f1b", "-p", str(P), "-m", str(M), "--hardware", "local-cpu",
               "--trace", str(sim)).returncode == 0
    proc = cli("plot", str(sim), str(imported), "-o", str(html))
    assert proc.returncode == 0, proc.stderr
    assert html.stat().st_size > 100_000
    other = tmp_path / "sim-m8.json"  # the compare view refuses another configuration: the metadata counts
    assert cli("simulate", "1f1b", "-p", str(P), "-m", "8", "--trace", str(other)).returncode == 0
    proc = cli("plot", str(other), str(imported), "-o", str(tmp_path / "no.html"))
    assert proc.returncode == 2 and "microbatches 8 (simulated) vs 4 (measured)" in proc.stderr


def test_schedule_flag_names_the_run(one_f_one_b, tmp_path, cli):
    out = tmp_path / "named.json"
    assert cli("import-trace", str(one_f_one_b / "rank0.json"), str(one_f_one_b / "rank1.json"),
               "--schedule", "gpipe", "-o", str(out)).returncode == 0
    assert Timeline.read(out).schedule == "gpipe"
    proc = cli("import-trace", str(one_f_one_b), "--schedule", "no-such", "-o", str(out))
    assert proc.returncode == 2 and "unknown schedule 'no-such'" in proc.stderr


def _x(name: str, start: float, dur: float, cat: str = "user_annotation") -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": start, "dur": dur, "pid": 1, "tid": 1}


def test_pp_ranges_exact_times_and_gpu_copies_ignored(tmp_path):
    """A hand-made CUDA-style trace: every PP range also on the GPU timeline, which must not count twice."""
    ranges = {0: [("PP:0F0", 10, 5), ("PP:0SEND_F0", 15, 1), ("PP:0RECV_B0", 16, 1), ("PP:0B0", 17, 20)],
              1: [("PP:1RECV_F0", 9, 1), ("PP:1F0", 10, 10), ("PP:1B0", 20, 6), ("PP:1SEND_B0", 26, 2)]}
    inner = {0: [_x("gloo:recv", 16.5, 14.5)], 1: [_x("gloo:recv", 9.5, 8.5)]}  # arrivals at 31 and 18 us
    for rank, rows in ranges.items():
        events = [_x(n, t, d) for n, t, d in rows] + [_x(n, t + 2, d, "gpu_user_annotation") for n, t, d in rows]
        (tmp_path / f"trace-{rank}.json").write_text(json.dumps({
            "traceEvents": events + inner[rank], "distributedInfo": {"rank": rank, "world_size": 2}}))
    tl = import_traces([str(tmp_path)])
    got = sorted((e.rank, e.label, round(e.start * 1e6, 6), round(e.end * 1e6, 6), e.peer) for e in tl.events)
    assert got == [(0, "0B0", 22.0, 28.0, -1),  # 0B0 waited for its gradient until 31 us: starts there
                   (0, "0F0", 1.0, 6.0, -1), (0, "0RECV_B0", 7.0, 22.0, 1), (0, "0SEND_F0", 6.0, 7.0, 1),
                   (1, "1B0", 11.0, 17.0, -1), (1, "1F0", 9.0, 11.0, -1),  # 1F0 starts at its input's arrival
                   (1, "1RECV_F0", 0.0, 9.0, 0), (1, "1SEND_B0", 17.0, 19.0, 0)]
    assert (tl.meta["stages"], tl.meta["microbatches"], tl.meta["steps"], tl.meta["warmup"]) == (2, 1, 1, 0)


def _one_line_error(proc: Ran, text: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert text in proc.stderr, proc.stderr


def test_bad_input(one_f_one_b, tmp_path, cli):
    out = str(tmp_path / "x.json")
    notjson = tmp_path / "notes.json"
    notjson.write_text("hello")
    _one_line_error(cli("import-trace", str(notjson), "-o", out), "is not a Chrome trace")
    nolist = tmp_path / "dict.json"
    nolist.write_text(json.dumps({"events": []}))
    _one_line_error(cli("import-trace", str(nolist), "-o", out), "no 'traceEvents' list")
    plain = tmp_path / "plain"
    plain.mkdir()
    for r in range(P):
        (plain / f"rank{r}.json").write_text(json.dumps({"traceEvents": [
            {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1.0, "dur": 2.0, "pid": 1, "tid": 1}]}))
    _one_line_error(cli("import-trace", str(plain), "-o", out), "no pipeline actions found")
    _one_line_error(cli("import-trace", str(one_f_one_b / "rank1.json"), "-o", out),
                    "ranks missing: no trace for rank 0 of 2")
    _one_line_error(cli("import-trace", str(tmp_path / "absent.json"), "-o", out), "trace file not found")
    _one_line_error(cli("import-trace", str(one_f_one_b), "-o", str(tmp_path / "x.txt")), "-o")
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(PipesimError, match="appears twice"):
        import_traces([str(one_f_one_b / "rank0.json"), str(one_f_one_b / "rank0.json")])
