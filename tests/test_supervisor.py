"""The launcher's parts without a launch: rank status files, the failure line's choice of rank, the
stderr relay's filter, torchrun's exit codes. (Real launches, signals and faults: test_executor_faults.py.)"""

from __future__ import annotations

import io
import os
import signal

import pytest

from executor import rank_status
from executor.failure_report import LaunchOutcome, failure_line, first_failure
from executor.rank_status import BUSY, DONE, WAITING, RankReport, RankStatus, read_reports
from executor.stderr_relay import LineFilter, Relay
from executor.supervisor import torchrun_exit_codes

RESET = "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1: Connection reset by peer. GLHF"
TIMEOUT = "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete"


def _err(message: str, t: float, where: str, kind: str = "RuntimeError") -> dict:
    return {"time": t, "where": where, "type": kind, "message": message}


def test_status_file_round_trip(tmp_path):
    st = RankStatus(tmp_path, 3)
    assert read_reports(tmp_path)[3].doing == "start-up"
    st.set_label("zb-h1")
    st.doing(4, RankStatus.encode("RECV_B(stage 0, mb 3)"), WAITING)
    st.fail("RECV_B(stage 0, mb 3)", RuntimeError("Timed out\nsecond line"))
    rep = read_reports(tmp_path)[3]
    assert (rep.seq, rep.step, rep.state, rep.label, rep.doing) == (2, 4, WAITING, "zb-h1", "RECV_B(stage 0, mb 3)")
    assert (rep.error["type"], rep.error["message"], rep.error["where"]) == ("RuntimeError", "Timed out",
                                                                            "RECV_B(stage 0, mb 3)")


def test_status_is_published_only_under_the_launcher(tmp_path, monkeypatch):
    monkeypatch.setattr(rank_status, "_current", None)
    monkeypatch.delenv(rank_status.ENV, raising=False)
    assert rank_status.open_from_env(0) is None and not list(tmp_path.iterdir())
    monkeypatch.setenv(rank_status.ENV, str(tmp_path))
    assert rank_status.open_from_env(1) is rank_status.current() is not None
    assert [p.name for p in tmp_path.iterdir()] == ["rank1.status"]


def test_the_raising_rank_comes_first_and_its_peer_after():
    reps = {0: RankReport(0, step=0, state=WAITING, label="1f1b", doing="RECV_B(stage 0, mb 2)",
                          error=_err(RESET, 2.0, "RECV_B(stage 0, mb 2)")),
            1: RankReport(1, step=0, state=BUSY, label="1f1b", doing="F(stage 1, mb 2)",
                          error=_err("injected fault at 1F2", 1.0, "F(stage 1, mb 2)"))}
    line = failure_line(LaunchOutcome(reps, died_at={0: 5.0, 1: 5.0}, exit_codes={0: 1}), "/x/torchrun.log")
    assert line == ("rank 1 raised RuntimeError (injected fault at 1F2) during F(stage 1, mb 2) of step 1 of 1f1b; "
                    "rank 0 stopped waiting on RECV_B(stage 0, mb 2); torchrun's output: /x/torchrun.log")


def test_a_killed_rank_beats_the_peer_that_lost_it_even_seen_dying_later():
    reps = {0: RankReport(0, step=3, state=WAITING, label="gpipe", doing="RECV_B(stage 0, mb 3)",
                          error=_err(RESET, 1.0, "RECV_B(stage 0, mb 3)")),
            1: RankReport(1, step=3, state=BUSY, label="gpipe", doing="F(stage 1, mb 3)")}
    outcome = LaunchOutcome(reps, died_at={0: 1.0, 1: 1.2}, exit_codes={1: -9})
    assert failure_line(outcome, None) == ("rank 1 was killed (SIGKILL) during F(stage 1, mb 3) of step 4 of gpipe; "
                                           "rank 0 stopped waiting on RECV_B(stage 0, mb 3)")


def test_of_silent_deaths_the_first_seen_is_the_cause_and_torchruns_cleanup_comes_after():
    reps = {r: RankReport(r, step=0, state=BUSY, label="1f1b", doing=f"F(stage {r}, mb 0)") for r in range(3)}
    outcome = LaunchOutcome(reps, died_at={0: 2.0, 1: 2.0, 2: 1.0},
                            exit_codes={0: -int(signal.SIGTERM), 1: -int(signal.SIGTERM), 2: -int(signal.SIGSEGV)})
    assert first_failure(outcome) == (2, False)
    assert failure_line(outcome, None).startswith("rank 2 was killed (SIGSEGV) during F(stage 2, mb 0)")
    same_moment = LaunchOutcome(reps, died_at={0: 1.0, 1: 1.0, 2: 1.0}, exit_codes={0: -15, 1: -9, 2: -15})
    assert first_failure(same_moment) == (1, False)  # torchrun stops the others with SIGTERM


def test_a_timeout_names_the_rank_that_was_not_waiting_as_hung():
    reps = {0: RankReport(0, step=1, state=WAITING, label="1f1b", doing="RECV_B(stage 0, mb 0)",
                          error=_err(TIMEOUT, 9.0, "RECV_B(stage 0, mb 0)")),
            1: RankReport(1, step=1, state=BUSY, label="1f1b", doing="F(stage 1, mb 0)")}
    outcome = LaunchOutcome(reps, died_at={0: 9.0, 1: 9.5}, exit_codes={0: 1}, pg_timeout=3.0)
    assert failure_line(outcome, None) == ("rank 1 hung (no progress in --pg-timeout 3 s) during F(stage 1, mb 0) "
                                           "of step 2 of 1f1b; rank 0 timed out waiting on RECV_B(stage 0, mb 0)")


def test_finished_ranks_are_not_named_and_a_traceless_failure_says_so():
    reps = {0: RankReport(0, state=DONE, doing="finished"),
            1: RankReport(1, step=-1, state=WAITING, doing="the rendezvous (process-group start-up)")}
    assert failure_line(LaunchOutcome(reps, exit_codes={1: 1}), None) == (
        "rank 1 exited with code 1 during the rendezvous (process-group start-up)")
    assert failure_line(LaunchOutcome({}, torchrun_code=3), "/l") == (
        "the ranks failed (torchrun exited with code 3); torchrun's output: /l")


def test_torchrun_exit_codes_are_read_from_its_summary():
    log = ("Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-03_13:40:01\n  host      : h\n"
           "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 1234)\n  error_file: <N/A>\n"
           "Failures:\n[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 1233)\n")
    assert torchrun_exit_codes(log) == {1: -9, 0: 1}


CHUNKS = [b"W1203 torchrun banner\n", b"executor: 1f1b step 1/2\n", b"Traceback (most recent call last):\n  F",
          b"ile x\n", b"\rexec", b"utor: bar 50%", b"\rexecutor: bar 100%", b"\n", b"pipesim: error: x\n",
          b"torch.distributed.elastic...ChildFailedError\n"]


def test_line_filter_passes_the_ranks_lines_and_progress_redraws_only():
    filt = LineFilter()
    shown = b"".join(filt.feed(chunk) for chunk in CHUNKS)
    # a bare CR after a hidden line is dropped: at the start of a line it moves nothing
    assert shown == b"executor: 1f1b step 1/2\nexecutor: bar 50%\rexecutor: bar 100%\npipesim: error: x\n"


@pytest.mark.parametrize("verbose", [False, True])
def test_relay_logs_everything_and_shows_what_the_filter_passes(verbose):
    read, write = os.pipe()
    os.write(write, b"".join(CHUNKS))
    os.close(write)
    log, screen = io.BytesIO(), io.BytesIO()
    relay = Relay(os.fdopen(read, "rb"), log, echo=True, verbose=verbose)
    relay.out = screen
    relay.run()
    assert log.getvalue() == b"".join(CHUNKS)
    assert screen.getvalue() == (b"".join(CHUNKS) if verbose else LineFilter().feed(b"".join(CHUNKS)))
