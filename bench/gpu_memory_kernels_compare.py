"""The rates bench/gpu_memory_kernels.py recorded, beside the one rate pipesim charges every memory-bound kernel.

  python bench/gpu_memory_kernels_compare.py MEMORY_KERNELS.csv [--hardware PRESET_OR_FILE]

Seconds are the GPU's time in kernels (gpu_seconds) where recorded. Rates are fractions of the HBM datasheet bandwidth
of the hardware (default: the shipped H200 profile, hgx-h200), with the model's bytes of each kernel
(pipesim.model.layer_kernels). It prints the copy and the Liger-shape LayerNorm references, each op family's
byte-weighted rate per direction (forward, backward) and implementation (eager, compiled), and per case and phase
the rate of the whole fused kernel list: eager (torch's kernels), best (per kernel the faster of the two), against
the profile's memory_bound_efficiency. No torch needed.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gpu_layer_configs import timed_as_backward

from pipesim.cost.device_profiles import profile_of
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware

IMPLS = ("eager", "compiled")


@dataclass(frozen=True)
class Record:
    case: str
    phase: str
    kernel: str
    family: str
    impl: str
    nbytes: int  # the model's bytes
    seconds: float

    @property
    def direction(self) -> str:
        """"B" for a kernel timed as its op's backward, else "F"."""
        return "B" if timed_as_backward(self.kernel, self.family) else "F"


def _seconds(row: dict) -> float:
    """The GPU's time in kernels where recorded (the host's launch overhead hidden, as inside a layer), else the
    clock's."""
    gpu = float(row.get("gpu_seconds") or 0.0)
    return gpu if gpu > 0 else float(row["seconds"])


def read(path: Path) -> list[Record]:
    with open(path, newline="") as fh:
        return [Record(r["case"], r["phase"], r["kernel"], r["family"], r["impl"], int(r["nbytes"]), _seconds(r))
                for r in csv.DictReader(fh)]


def rate(nbytes: float, seconds: float, hbm: float) -> float:
    """Bytes per second as a fraction of `hbm` (bytes/s)."""
    return nbytes / seconds / hbm


def family_rates(records: list[Record], hbm: float) -> dict[tuple[str, str, str], tuple[float, int]]:
    """(family, direction, impl) -> (byte-weighted rate, distinct measurements). A measurement shared by several
    kernels of a case (the two LayerNorms) counts once."""
    seen: dict[tuple, Record] = {}
    for r in records:
        if r.case and not r.case.startswith("Liger"):
            seen.setdefault((r.case, r.family, r.direction, r.impl, r.nbytes, r.seconds), r)
    sums: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in seen.values():
        acc = sums[(r.family, r.direction, r.impl)]
        acc[0] += r.nbytes
        acc[1] += r.seconds
        acc[2] += 1
    return {k: (rate(b, s, hbm), int(n)) for k, (b, s, n) in sums.items()}


def list_rates(records: list[Record], hbm: float) -> dict[tuple[str, str], tuple[float, float, int]]:
    """(case, phase) -> (eager rate, best rate, model bytes) of the case's whole fused list in that phase."""
    by: dict[tuple[str, str, str], dict[str, Record]] = defaultdict(dict)
    for r in records:
        if r.case and not r.case.startswith("Liger"):
            by[(r.case, r.phase, r.kernel)][r.impl] = r
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for (case, phase, _), impls in by.items():
        acc = out[(case, phase)]
        nbytes = next(iter(impls.values())).nbytes
        acc[0] += impls["eager"].seconds if "eager" in impls else 0.0
        acc[1] += min(r.seconds for r in impls.values())
        acc[2] += nbytes
    return {k: (rate(b, e, hbm) if e else 0.0, rate(b, best, hbm), int(b)) for k, (e, best, b) in out.items()}


def report(records: list[Record], hbm: float, figure: float) -> list[str]:
    lines = [f"HBM {hbm / 1e12:.3f} TB/s; the profile charges every memory-bound kernel {figure:.3f} of it"]
    for r in records:
        if not r.case or r.case.startswith("Liger"):
            lines.append(f"  reference {r.case or 'HBM copy'}: {rate(r.nbytes, r.seconds, hbm):.3f}")
    lines.append("op family, direction: byte-weighted rate (distinct measurements) per implementation")
    fams = family_rates(records, hbm)
    for fam, direction in sorted({(f, d) for f, d, _ in fams}):
        cells = [f"{impl} {fams[(fam, direction, impl)][0]:.3f} ({fams[(fam, direction, impl)][1]})"
                 for impl in IMPLS if (fam, direction, impl) in fams]
        lines.append(f"  {fam:18s} {direction}: " + " | ".join(cells))
    lines.append("case, phase: the fused list's rate (its model bytes), eager and best of eager/compiled per kernel")
    for (case, phase), (eager, best, nbytes) in list_rates(records, hbm).items():
        lines.append(f"  {case:26s} {phase}: {nbytes / 1e6:7.0f} MB  eager {eager:.3f}  best {best:.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path, help="memory_kernels.csv of bench/gpu_memory_kernels.py")
    ap.add_argument("--hardware", default="hgx-h200", help="the preset or hardware file whose HBM and figure to use")
    args = ap.parse_args(argv)
    try:
        records = read(args.records)
        hw = load_hardware(args.hardware)
        profile = profile_of(hw.device.family, hw.device.kernels)
        print("\n".join(report(records, profile.hbm_bandwidth, profile.memory_bound_rate / profile.hbm_bandwidth)))
    except (PipesimError, OSError, KeyError, ValueError) as exc:
        print(f"gpu_memory_kernels_compare.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
