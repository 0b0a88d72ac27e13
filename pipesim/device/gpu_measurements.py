"""GPU measurements as recorded by `pipesim calibrate --gpu`, and the device-profile figures they imply.

The file is a CSV with `#` header lines (what ran: device, torch, CUDA, date) and one row per
timed kernel: kind, dtype, shape, bytes, seconds. Kinds: `gemm` (shape b x m x n x k), `copy`
(bytes read + written), `launch` (an empty kernel), `flash_forward` / `flash_backward` (shape
b x s x heads x head_dim x causal), and NCCL collectives (`all_reduce`, `all_gather`,
`reduce_scatter`, `send_recv`; shape = ranks, bytes = S), and memory-bound kernels (`softmax`, `dropout`,
`layer_norm`, `gelu`; no shape, bytes as the model counts them). `summarise` turns them into the
fields of a `DeviceProfile` by the same definitions the shipped figures use (MAMF: the best
GEMM over the grid; the memory-bound kernels' median bandwidth, else the best copy's; the
median launch), and `profile_toml` writes a
table in pipesim/presets/gemm/devices.toml's format with the measurement as the source.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from pipesim.comm.collective_costs import busbw_factor
from pipesim.device.kernels import attention_flops, causal_tile_factor, head_dim_factor
from pipesim.device.profile import DeviceProfile
from pipesim.errors import PipesimError

HEADER = ("kind", "dtype", "shape", "bytes", "seconds")
FP8_GEMM = "float8"  # a gemm record's dtype for torch._scaled_mm on E4M3 operands (per-tensor scales, bf16 output)
GEMM, COPY, LAUNCH, FLASH_FWD, FLASH_BWD = "gemm", "copy", "launch", "flash_forward", "flash_backward"
GEMM_SUSTAINED = "gemm_sustained"  # a gemm's seconds per call after many seconds back to back (settled clock)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
# memory-bound kernels the model charges at memory_efficiency, as torch runs them; bytes as pipesim.model.layer_kernels
# counts them (softmax 2 S d and dropout 2 S d + S over attention scores, layer norm 2 H d, GeLU 2 F d)
MEMORY_BOUND = ("softmax", "dropout", "layer_norm", "gelu")
KINDS = (GEMM, GEMM_SUSTAINED, COPY, LAUNCH, FLASH_FWD, FLASH_BWD, *COLLECTIVES, *MEMORY_BOUND)
SHAPE_SIZES = {GEMM: 4, GEMM_SUSTAINED: 4, FLASH_FWD: 5, FLASH_BWD: 5,
               **{c: 1 for c in COLLECTIVES}}  # numbers in `shape`


@dataclass(frozen=True)
class Record:
    """One timed kernel (seconds per call)."""

    kind: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int  # bytes moved (copy) or S (collectives); 0 otherwise
    seconds: float

    @property
    def flops(self) -> float:
        """Useful FLOPs of a gemm or flash record (2 b m n k; flash as pipesim.device.kernels counts them)."""
        if self.kind in (GEMM, GEMM_SUSTAINED):
            b, m, n, k = self.shape
            return 2.0 * b * m * n * k
        if self.kind in (FLASH_FWD, FLASH_BWD):
            b, s, heads, head_dim, causal = self.shape
            return attention_flops(b, s, heads, head_dim, causal=bool(causal), backward=self.kind == FLASH_BWD)
        return 0.0


@dataclass(frozen=True)
class Measurements:
    """A recorded file: its header lines (key -> value) and its records."""

    meta: dict[str, str]
    records: tuple[Record, ...]

    def of(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind]


def _record(row: dict[str, str], where: str) -> Record:
    kind = row["kind"]
    if kind not in KINDS:
        raise PipesimError(f"{where}: unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    try:
        shape = tuple(int(x) for x in row["shape"].split("x")) if row["shape"] else ()
        nbytes, seconds = int(row["bytes"] or 0), float(row["seconds"])
    except ValueError as exc:
        raise PipesimError(f"{where}: {exc}") from exc
    if len(shape) != SHAPE_SIZES.get(kind, 0):
        raise PipesimError(f"{where}: {kind} needs a shape of {SHAPE_SIZES.get(kind, 0)} numbers, got {row['shape']!r}")
    if not seconds > 0:
        raise PipesimError(f"{where}: seconds must be positive, got {seconds}")
    return Record(kind, row["dtype"], shape, nbytes, seconds)


def parse(text: str, name: str = "measurements") -> Measurements:
    """Read a recorded file's text; a bad row is a one-line PipesimError naming its line."""
    meta: dict[str, str] = {}
    body = []
    for line in text.splitlines():
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep:
                meta[key.strip()] = value.strip()
        elif line.strip():
            body.append(line)
    reader = csv.DictReader(body)
    if tuple(reader.fieldnames or ()) != HEADER:
        raise PipesimError(f"{name}: columns must be {','.join(HEADER)}, got {','.join(reader.fieldnames or [])}")
    records = tuple(_record(row, f"{name} row {i}") for i, row in enumerate(reader, start=1))
    return Measurements(meta, records)


def read(path: Path) -> Measurements:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:  # a folder, a binary file: one line, no traceback
        raise PipesimError(f"cannot read measurements {path}: {exc}") from None
    return parse(text, str(path))


def write(meta: dict[str, str], records: list[Record]) -> str:
    """The file's text: `# key: value` lines, then the CSV (shapes joined with x, seconds to 9 significant digits)."""
    out = io.StringIO()
    for key, value in meta.items():
        out.write(f"# {key}: {value}\n")
    w = csv.writer(out, lineterminator="\n")
    w.writerow(HEADER)
    for r in records:
        w.writerow([r.kind, r.dtype, "x".join(str(x) for x in r.shape), r.nbytes, f"{r.seconds:.9g}"])
    return out.getvalue()


def summarise(data: Measurements, base: DeviceProfile, dtype: str = "bfloat16",
              fp8_peak: float | None = None) -> dict[str, float]:
    """Profile fields the records measure, by the shipped figures' definitions (only those with records).

    matmul_efficiency = max over `dtype` gemms of FLOP/s / peak, times `sustained_fraction` when the file
    has a sustained gemm (the rate training sees, not a burst's); memory_efficiency = max copy bytes/s / HBM
    (the streaming rate of GEMM and flash operands); memory_bound_efficiency = the median over the memory-bound
    kernels (MEMORY_BOUND, each kind's best bytes/s) / HBM, the kernels the model charges at that figure (on an
    H200 0.57 against a copy's 0.88: one figure cannot serve both); kernel_overhead = median launch; flash
    efficiencies = max over the causal records (pipesim times every flash kernel causal; a non-causal one runs
    faster per FLOP: 8 % at 8,192 tokens on the H200) of the FLOPs executed (`causal_tile_factor`) / seconds / peak,
    times the sustained fraction as matmul_efficiency (the same clock under the same power limit);
    fp8_matmul_efficiency = max over float8 gemms (torch._scaled_mm) of FLOP/s / `fp8_peak` (the family's FP8 peak,
    pipesim.device.fp8_rates), times the float8 gemm's own sustained fraction: under a power limit FP8 and BF16 GEMMs
    do not hold one clock (docs/gpu_model.md), so neither stands in for the other.
    """
    out: dict[str, float] = {}
    gemms = [r for r in data.of(GEMM) if r.dtype == dtype]
    if gemms:
        held = sustained_fraction(data, dtype)
        out["matmul_efficiency"] = max(r.flops / r.seconds for r in gemms) / base.peak(dtype) * (held or 1.0)
    fp8 = [r for r in data.of(GEMM) if r.dtype == FP8_GEMM]
    if fp8 and fp8_peak:
        out["fp8_matmul_efficiency"] = max(r.flops / r.seconds for r in fp8) / fp8_peak * \
            (sustained_fraction(data, FP8_GEMM) or 1.0)
    if data.of(COPY):
        out["memory_efficiency"] = max(r.nbytes / r.seconds for r in data.of(COPY)) / base.hbm_bandwidth
    kernels = memory_bound_bandwidths(data)
    if kernels:
        out["memory_bound_efficiency"] = statistics.median(kernels.values()) / base.hbm_bandwidth
    if data.of(LAUNCH):
        out["kernel_overhead"] = statistics.median(r.seconds for r in data.of(LAUNCH))
    for kind, name in ((FLASH_FWD, "flash_forward_efficiency"), (FLASH_BWD, "flash_backward_efficiency")):
        rows = [r for r in data.of(kind) if r.dtype == dtype and r.shape[4]]  # causal: the kernel training runs
        if rows:  # at the reference head dim (a row at another is divided by the family's head_dim_factor)
            executed = max(r.flops * causal_tile_factor(r.shape[1]) / r.seconds /
                           head_dim_factor(base, r.shape[3], backward=kind == FLASH_BWD) for r in rows)
            out[name] = executed / base.peak(dtype) * (sustained_fraction(data, dtype) or 1.0)
    return out


def sustained_fraction(data: Measurements, dtype: str = "bfloat16") -> float | None:
    """The sustained rate of a gemm over its burst rate (the grid's record of the same shape and dtype), at most 1;
    the smallest over the sustained records; None without one (or without its burst record)."""
    bursts = {r.shape: r.seconds for r in data.of(GEMM) if r.dtype == dtype}
    ratios = [min(1.0, bursts[r.shape] / r.seconds) for r in data.of(GEMM_SUSTAINED)
              if r.dtype == dtype and r.shape in bursts]
    return min(ratios) if ratios else None


def memory_bound_bandwidths(data: Measurements) -> dict[str, float]:
    """Bytes/s each memory-bound kernel kind reached at best (its bytes as the model counts them / seconds)."""
    return {kind: max(r.nbytes / r.seconds for r in data.of(kind)) for kind in MEMORY_BOUND if data.of(kind)}


def collective_figures(data: Measurements) -> dict[str, dict[str, float]]:
    """Per collective kind: busbw of its largest S (bytes/s, nccl-tests' factor) and the time of its smallest (s)."""
    out = {}
    for kind in COLLECTIVES:
        rows = data.of(kind)
        if rows:
            big, small = max(rows, key=lambda r: r.nbytes), min(rows, key=lambda r: r.nbytes)
            out[kind] = {"busbw": big.nbytes / big.seconds * busbw_factor(kind, big.shape[0]),
                         "small_message_seconds": small.seconds, "ranks": float(big.shape[0])}
    return out


def profile_toml(family: str, profile: DeviceProfile) -> str:
    """A devices.toml table for `profile` (its sources included), to load with pipesim.device.profile.load_profiles."""
    lines = [f"[{family}]", f'name = "{profile.name}"', f"sms = {profile.sms}",
             "tiles = [" + ", ".join(f"[{a}, {b}]" for a, b in profile.tiles) + "]",
             "flops = { " + ", ".join(f"{k} = {v:.6g}" for k, v in profile.flops.items()) + " }"]
    for name in ("hbm_bandwidth", "matmul_efficiency", "memory_efficiency", "kernel_overhead", "overlap",
                 "flash_forward_efficiency", "flash_backward_efficiency", "nccl_channels", "memory_bound_efficiency"):
        if getattr(profile, name) is not None:  # memory_bound_efficiency left out: it follows memory_efficiency
            lines.append(f"{name} = {getattr(profile, name):.6g}")
    lines += ["", f"[{family}.sources]"]
    for key, value in profile.sources.items():
        lines.append(f"{key} = {json.dumps(value)}")  # a JSON string is a valid TOML basic string
    return "\n".join(lines) + "\n"


__all__ = ["COLLECTIVES", "FP8_GEMM", "GEMM_SUSTAINED", "HEADER", "KINDS", "MEMORY_BOUND", "Measurements", "Record",
           "collective_figures", "memory_bound_bandwidths", "parse", "sustained_fraction",
           "profile_toml", "read", "summarise", "write"]
