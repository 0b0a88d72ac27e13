"""Input files pipesim cannot use: each is refused in one line (exit code 2), never with a traceback.

Binary / non-UTF-8 files given as a model config, a --tp-comm-overlap-cfg YAML, a measurements CSV or a
timeline; malformed timelines (ranks, times) read by `pipesim whatif` and `pipesim plot` alike; profiler
events whose `dur` is NaN or negative; a Hugging Face config whose torch_dtype pipesim does not model.
The CLI runs in process (pipesim.cli.main), in a fresh folder holding only the files each case writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor.config_json import config_argument
from pipesim.calibration.campaign import CAMPAIGN_FILE, provenance
from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.model.hf_config import model_from_hf
from pipesim.timeline import Timeline

MEASURED = json.loads((Path(__file__).parent / "data" / "measured_1f1b_gpt_p2.json").read_text())  # 2 ranks, 3 steps
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 500, "max_position_embeddings": 128, "model_type": "llama", "hidden_act": "silu"}
SIM = ["simulate", "1f1b", "-p", "2", "-m", "4"]


@pytest.fixture
def refused(capsys, tmp_path, monkeypatch):
    """`pipesim ARGS...` in tmp_path, which must exit 2 with one line: that line, without `pipesim: error: `."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> str:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        assert (code, out) == (2, ""), err
        assert err.startswith("pipesim: error: ") and err.count("\n") == 1, err
        return err.removeprefix("pipesim: error: ").rstrip("\n")

    return run


# -- 1. files that are not UTF-8 text


def test_model_config_not_utf8(refused, tmp_path):
    Path("config.json").write_bytes(b'{"model_type": "\xff\xfe"}')
    assert refused(*SIM, "--seq", "64", "--model-config", "config.json") == \
        "config.json: not UTF-8 (byte 16: invalid start byte)"


def test_tp_comm_overlap_cfg_not_utf8(refused, tmp_path):
    Path("ub.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00")
    assert refused(*SIM, "--model", "gpt", "--tp", "2", "--sequence-parallel", "--hardware", "dgx-h100",
                   "--tp-comm-overlap", "--tp-comm-overlap-cfg", "ub.yaml") == \
        "--tp-comm-overlap-cfg ub.yaml: not UTF-8 (byte 0: invalid start byte)"


def test_measurements_csv_not_utf8(refused, tmp_path):
    Path("m.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00")
    assert refused("calibrate", "-o", "hw.toml", "--from-measurements", "m.csv") == \
        "cannot read measurements m.csv: 'utf-8' codec can't decode byte 0x89 in position 0: invalid start byte"
    assert not Path("hw.toml").exists()


@pytest.mark.parametrize("command", [["whatif", "t.json"], ["plot", "t.json", "-o", "t.html"]])
def test_timeline_not_utf8_refused_alike(refused, tmp_path, command):
    Path("t.json").write_bytes(b"\xff\xfe{}")
    assert refused(*command) == \
        "cannot read t.json: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"
    assert not Path("t.html").exists()


# -- 2. malformed timelines: whatif and plot read them through the same checks


def _event(**change) -> dict:
    """MEASURED with its first event of step 1 (measured step 2) changed."""
    data = json.loads(json.dumps(MEASURED))
    i = next(i for i, e in enumerate(data["events"]) if e["step"] == 1)
    data["events"][i].update(change)
    return data


FIRST_OF_STEP_2 = next(i for i, e in enumerate(MEASURED["events"]) if e["step"] == 1)
BAD = f"t.json is a malformed timeline: event {FIRST_OF_STEP_2}"
MALFORMED = [
    ({**MEASURED, "num_ranks": 0}, "t.json is a malformed timeline: num_ranks must be a positive integer, got 0"),
    ({**MEASURED, "num_ranks": "2"}, "t.json is a malformed timeline: num_ranks must be a positive integer, got '2'"),
    ({**MEASURED, "num_ranks": True},
     "t.json is a malformed timeline: num_ranks must be a positive integer, got True"),
    (_event(rank=9), f"{BAD} has rank 9; expected an integer in [0, 2)"),
    (_event(rank=-1), f"{BAD} has rank -1; expected an integer in [0, 2)"),
    (_event(rank="1"), f"{BAD} has rank '1'; expected an integer in [0, 2)"),
    (_event(start="abc"), f"{BAD} has start 'abc'; expected a finite number of seconds"),
    (_event(start=None), f"{BAD} has start None; expected a finite number of seconds"),
    (_event(start=float("nan")), f"{BAD} has start nan; expected a finite number of seconds"),
    (_event(end=float("inf")), f"{BAD} has end inf; expected a finite number of seconds"),
    (_event(end=True), f"{BAD} has end True; expected a finite number of seconds"),
    (_event(start=0.5, end=0.25), f"{BAD} ends before it starts (start 0.5, end 0.25)"),
]


@pytest.mark.parametrize("data, message", MALFORMED)
@pytest.mark.parametrize("command", [["whatif", "t.json", "--step", "2"], ["whatif", "t.json"],
                                     ["plot", "t.json", "-o", "t.html"]])
def test_malformed_timeline(refused, tmp_path, data, message, command):
    Path("t.json").write_text(json.dumps(data))  # NaN / Infinity as Python's json writes them, as it reads them
    assert refused(*command) == message
    assert not Path("t.html").exists()


def test_malformed_timeline_refused_by_the_loader():
    with pytest.raises(PipesimError) as err:
        Timeline.from_dict(_event(rank=2), "run.json")
    assert str(err.value) == f"run.json is a malformed timeline: event {FIRST_OF_STEP_2} has rank 2; " \
                             "expected an integer in [0, 2)"


def test_whatif_timeline_without_events(refused, tmp_path):
    Path("t.json").write_text(json.dumps({**MEASURED, "events": []}))
    assert refused("whatif", "t.json", "--step", "2") == "t.json has no events: no step to replay"
    assert refused("whatif", "t.json") == "t.json has no events: no step to replay"


def test_well_formed_timeline_still_read():
    tl = Timeline.from_dict(MEASURED, "t.json")
    assert (tl.num_ranks, len(tl.events), tl.steps()) == (2, 96, [0, 1, 2])


# -- 3. profiler events whose duration is NaN or negative


def _chrome_trace(folder: Path, dur: float) -> None:
    """Two ranks' traces, rank 0's `Forward 0` lasting `dur` microseconds."""
    folder.mkdir()
    for rank in (0, 1):
        events = [{"ph": "X", "cat": "user_annotation", "name": f"Forward {rank}", "pid": 1, "tid": 1,
                   "ts": 1000.5, "dur": dur if rank == 0 else 20.0}]
        (folder / f"rank{rank}.json").write_text(json.dumps({"distributedInfo": {"rank": rank, "world_size": 2},
                                                             "traceEvents": events}))


@pytest.mark.parametrize("dur, shown", [(float("nan"), "nan"), (-5, "-5"), (float("inf"), "inf")])
def test_import_trace_bad_duration(refused, tmp_path, dur, shown):
    _chrome_trace(tmp_path / "traces", dur)
    assert refused("import-trace", "traces", "-o", "out.json") == \
        f"traces/rank0.json: event 'Forward 0' at ts 1000.5 has dur {shown}: expected a finite ts and a finite " \
        "dur >= 0"
    assert not Path("out.json").exists()


# -- 4. torch_dtype pipesim does not model


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
@pytest.mark.parametrize("value", ["garbage", "int8", 16])
def test_unknown_torch_dtype_refused(key, value):
    with pytest.raises(PipesimError) as err:
        model_from_hf({**TINY, key: value}, where="config.json")
    assert str(err.value) == f"config.json: field {key!r} {value!r} is not a dtype pipesim models; choose one of " \
                             "float32, bfloat16, float16"


def test_unknown_torch_dtype_refused_by_the_cli(refused, tmp_path):
    Path("config.json").write_text(json.dumps({**TINY, "torch_dtype": "int8"}))
    assert refused(*SIM, "--seq", "64", "--model-config", "config.json") == \
        "config.json: field 'torch_dtype' 'int8' is not a dtype pipesim models; choose one of float32, bfloat16, " \
        "float16"


@pytest.mark.parametrize("given, dtype", [({}, "bfloat16"), ({"torch_dtype": None}, "bfloat16"),
                                          ({"torch_dtype": "float16"}, "float16"), ({"dtype": "float32"}, "float32")])
def test_known_or_absent_torch_dtype(given, dtype):
    assert model_from_hf({**TINY, **given}, where="config.json").dtype == dtype


def test_dtype_flag_overrides_the_file():
    assert model_from_hf({**TINY, "torch_dtype": "int8"}, where="config.json", dtype="float16").dtype == "float16"


def test_an_executor_config_file_that_is_not_utf8_is_one_line(tmp_path):
    """`python -m executor --config FILE` (what `pipesim run` hands each worker) reads the file as UTF-8."""
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(PipesimError) as err:
        config_argument(["--config", str(path)], "usage")
    assert str(err.value) == f"cannot read {path}: not UTF-8 (byte 0: invalid start byte)"


def test_a_reused_folders_broken_campaign_record_is_one_line(tmp_path):
    (tmp_path / CAMPAIGN_FILE).write_text('{"command": "x"}')
    with pytest.raises(PipesimError) as err:
        provenance(tmp_path)
    assert str(err.value) == (f"{tmp_path / CAMPAIGN_FILE} is not a campaign record pipesim wrote "
                              "(KeyError: 'started')")
