"""What bench/gpu_layers.py and bench/gpu_memory_kernels.py share: the run's meta.json, and one case's records
written as they come (a case that fails loses only its own records, and says so in one line)."""

from __future__ import annotations

import csv
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import torch


def write_meta(folder: Path, dev: torch.device, dtype: torch.dtype, iters: int) -> None:
    """folder/meta.json: the device, torch, CUDA, dtype, calls per round and the date (UTC)."""
    meta = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "dtype": str(dtype).removeprefix("torch."), "iters": iters,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def record_case(script: str, label: str, fill: Callable[[list[dict]], None], out: csv.DictWriter, fh: IO[str],
                dev: torch.device, t0: float) -> None:
    """Run `fill` (it appends the case's records to the list it is given) and write what it made, also when it
    fails part way; then the progress line (seconds since `t0`) and, on a GPU, the allocator's cache emptied."""
    rows: list[dict] = []
    try:
        fill(rows)
    except Exception as exc:  # noqa: BLE001 (one case's failure must not lose the others' records)
        print(f"{script}: {label}: {type(exc).__name__}: {exc}", file=sys.stderr)
    out.writerows(rows)
    fh.flush()
    print(f"{label}: {len(rows)} records ({time.perf_counter() - t0:.0f} s)", flush=True)
    if dev.type == "cuda":
        torch.cuda.empty_cache()


__all__ = ["record_case", "write_meta"]
