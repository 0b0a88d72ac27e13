"""Shared by the tests of bench/bench_published.py: the bench loaded by path (as `pipesim bench published` runs
it), its rows file and its mixture-of-experts sources, a KOR22 Table 4 layer command and result builders."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_published", ROOT / "bench" / "bench_published.py")
bp = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bp  # dataclasses look their module up there
_spec.loader.exec_module(bp)
pr = bp.report  # bench/published_report.py, loaded by bench_published

DATA = bp.load()
# the rows file's mixture-of-experts sources (issue 32), reported apart
MOE_SOURCES = frozenset({"MCOREMOE", "MOEZOO", "DEEPSEEKV3", "MOEZOOQWEN3", "MCOREMOE26", "MB26GB200MOE",
                         "MB26GB300MOE", "MB26B300MOE", "MB26B200MOE", "MB26GPTOSS", "MB26KIMI", "MB26NANO"})
LAYER = ("pipesim simulate 1f1b --model gpt --hidden 6144 --layers 1 --heads 64 --seq 2048 --vocab 51200 --batch 4 "
         "--microbatch-size 4 --tp 8 --stages 3 --layer-split 0,1,0 --dp 1 --dtype float16 --hardware dgx-a100 "
         "--nodes 3 --attention eager")
LAYER_ROWS = "\n".join(f"""[[rows]]
id = "{i}"
source = "KOR22"
table = "Table 4"
configuration = "layer {what}"
metric = "layer_{what}_ms"
published = {fig}
command = "{LAYER}"
""" for i, what, fig in (("fwd", "forward", 7.7), ("bwd", "backward", 11.9)))  # the two Table 4 rows of one 22B layer


def DATA_ROW(row_id: str):
    return next(r for r in DATA["rows"] if r.id == row_id)


def _result(row_id, source, published, predicted, metric="seconds_per_iteration", table="T"):
    m = bp.metrics.METRICS[metric]
    row = pr.Row(id=row_id, source=source, table=table, configuration=row_id, metric=metric,
                 command="pipesim simulate 1f1b", published=published, unit=m.unit, faster_is_higher=m.faster_is_higher)
    return pr.Result(row, predicted, "f")
