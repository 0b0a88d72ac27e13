"""The GEMM model against a measured table: OpenXLA's H100 (sm_90) matmul throughput, shape by shape.

The table (pipesim/presets/gemm/xla_sm90_matmul.csv, 375 batched shapes from 256 to 4096 per
dimension, BF16 and F32) is an independent measurement: no figure of the model is fitted to it.
`compare` predicts each row's FLOP/s and reports the relative errors, so docs/gpu_model.md and
tests/test_gemm.py print and bound the same numbers.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from pipesim.device.gemm import gemm_time
from pipesim.device.profile import DeviceProfile
from pipesim.errors import PipesimError

COLUMNS = {"bfloat16": "bf16_tflops", "tfloat32": "f32_tflops"}  # dtype -> column of the table (TFLOP/s)


@dataclass(frozen=True)
class Measured:
    """One measured GEMM: b x (m x k) @ (k x n) at `flops_per_s`."""

    b: int
    m: int
    n: int
    k: int
    dtype: str
    flops_per_s: float  # FLOP/s measured


@dataclass(frozen=True)
class Comparison:
    """Predicted vs measured FLOP/s over a table; errors are predicted / measured - 1."""

    rows: tuple[tuple[Measured, float], ...]  # (measured row, predicted FLOP/s)

    @property
    def errors(self) -> list[float]:
        return [pred / row.flops_per_s - 1 for row, pred in self.rows]

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(e) for e in self.errors)

    @property
    def max_abs_error(self) -> float:
        return max(abs(e) for e in self.errors)

    @property
    def median_error(self) -> float:
        """Signed: > 0 means the model is optimistic (predicts more FLOP/s than measured)."""
        return statistics.median(self.errors)

    def within(self, bound: float) -> float:
        """Fraction of rows with |error| <= bound."""
        return sum(abs(e) <= bound for e in self.errors) / len(self.rows)

    def summary(self) -> str:
        return (f"{len(self.rows)} shapes: median |error| {100 * self.median_abs_error:.1f} %, "
                f"max {100 * self.max_abs_error:.1f} %, median signed {100 * self.median_error:+.1f} %, "
                f"within 10 %: {100 * self.within(0.10):.0f} %, within 20 %: {100 * self.within(0.20):.0f} %")


def xla_table_path() -> Path:
    return Path(str(resources.files("pipesim").joinpath("presets", "gemm", "xla_sm90_matmul.csv")))


def read_table(dtype: str = "bfloat16", path: Path | None = None) -> list[Measured]:
    """Rows of the XLA-format table for `dtype` ("bfloat16", or "tfloat32" for XLA's default-precision F32)."""
    if dtype not in COLUMNS:
        raise PipesimError(f"the XLA table has no {dtype!r} column; choose one of {', '.join(COLUMNS)}")
    path = path or xla_table_path()
    lines = [line for line in Path(path).read_text().splitlines() if line and not line.startswith("#")]
    return [Measured(int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"]), dtype, float(r[COLUMNS[dtype]]) * 1e12)
            for r in csv.DictReader(lines)]


# The sustained / burst rate of GEMMs that the H200 run measured (devices.toml [H200RUN]), folded into the H100's
# GEMM figure (the same GH100 die under the same 700 W limit): XLA's table is short bursts, so it is compared with
# the figure before that fraction.
H100_SUSTAINED = 0.938


def compare(rows: list[Measured], device: DeviceProfile, *, sustained: float = 1.0) -> Comparison:
    """The model's FLOP/s for every measured row on `device`, its GEMM figure divided by `sustained` (the fraction
    a profile folds in that a burst measurement does not see)."""
    burst = replace(device, matmul_efficiency=device.matmul_efficiency / sustained) if sustained != 1.0 else device
    return Comparison(tuple((r, gemm_time(r.m, r.n, r.k, r.dtype, burst, batch=r.b).achieved) for r in rows))


__all__ = ["COLUMNS", "H100_SUSTAINED", "Comparison", "Measured", "compare", "read_table", "xla_table_path"]
