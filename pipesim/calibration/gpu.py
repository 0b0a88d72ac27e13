"""A hardware file from GPU measurements: the family's preset with the measured kernel figures, HBM and link.

`pipesim calibrate --gpu` measures (pipesim/calibration/gpu_measure.py, torch) and `--from-measurements
FILE` reads a recorded file (pipesim/device/gpu_measurements.py's format); both end here, without torch, so the
tests assemble a recorded file on a machine with no GPU. What the file carries (docs/calibration.md):
[device.kernels] = the measured figures of the family's kernel model (by measured.summarise's
definitions), [device].hbm_bandwidth = the memory-bound kernels' median bytes/s (the best copy without
them), and with NCCL results the [intra] link the simulator's ring formula needs to reproduce the smallest
and the largest collective measured, with each other collective's bandwidth over it (collective_bandwidth).
Everything else (topology, peaks, the network across nodes) is the base preset's, named in `source`.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from pipesim.comm.collective_costs import ring_time
from pipesim.device import gpu_measurements as measured
from pipesim.device.fp8_rates import fp8_figures
from pipesim.device.gemm_reference import Comparison, Measured, compare
from pipesim.device.profile import DeviceProfile, device_profile, load_profiles
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware, KernelFigures
from pipesim.hardware.toml_io import load_hardware, preset_names

# fragment of torch.cuda.get_device_name (upper case) -> family; first match
FAMILY_NAMES = (("A100-PCIE", "A100-PCIe"), ("A100", "A100"), ("H100", "H100"), ("H200", "H200"),
                ("B200", "B200"), ("B300", "B300"))
LINK_KINDS = ("all_reduce", "send_recv")  # the collective the [intra] link is fitted to, in order of preference


def family_of(device_name: str) -> str:
    """The device family of a GPU name (e.g. "NVIDIA H100 80GB HBM3" -> H100), or a one-line error."""
    for fragment, family in FAMILY_NAMES:
        if fragment in device_name.upper():
            return family
    raise PipesimError(f"no device family for {device_name!r}; pass --family ({', '.join(sorted(load_profiles()))})")


def base_preset(family: str, device_name: str = "") -> Hardware:
    """The shipped single-node preset of `family` whose device model (its name before the first '-', e.g. GB200) is a
    word of the GPU's name `device_name` (a GB200 is the B200 family on its own board), else the first by name on the
    family's reference board (no [device.kernels]), or a one-line error."""
    presets = [hw for hw in map(load_hardware, preset_names()) if hw.device.family == family and hw.num_nodes == 1]
    words = set(re.split(r"[^A-Z0-9]+", device_name.upper()))
    named = [hw for hw in presets if hw.device.name.split("-")[0].upper() in words]
    if found := named or [hw for hw in presets if hw.device.kernels is None]:
        return found[0]
    raise PipesimError(f"no single-node preset has device family {family!r}; pass --hardware PRESET|FILE")


@dataclass(frozen=True)
class LinkFit:
    """The link figures with which pipesim.comm.collective_costs.ring_time gives the measured times at both ends."""

    kind: str  # the collective fitted (all_reduce or send_recv)
    ranks: int
    small: tuple[int, float]  # (bytes, seconds) of the smallest message measured
    large: tuple[int, float]  # (bytes, seconds) of the largest
    bandwidth: float  # bytes/s per direction
    latency: float  # seconds per message / ring step (0 when the fit went below)


def _median_at(rows: list[measured.Record], nbytes: int) -> float:
    return statistics.median(r.seconds for r in rows if r.nbytes == nbytes)


def _fit(data: measured.Measurements, kind: str) -> LinkFit | None:
    """Solve t = a L + c S / B for `kind` through the smallest and largest S measured (median of repeats), with a
    and c read off ring_time itself (a = its time at L = 1, S = 0; c = at S = 1, B = 1, L = 0). None: no two sizes."""
    rows = data.of(kind)
    sizes = sorted({r.nbytes for r in rows})
    if len(sizes) < 2:
        return None
    n = rows[0].shape[0]
    if n < 2 or any(r.shape[0] != n for r in rows):
        raise PipesimError(f"{kind} records must all be over the same number (>= 2) of ranks")
    small, large = (sizes[0], _median_at(rows, sizes[0])), (sizes[-1], _median_at(rows, sizes[-1]))
    a, c = ring_time(kind, n, 0, 1.0, 1.0), ring_time(kind, n, 1, 1.0, 0.0)  # latency, bytes coefficients
    if not large[1] > small[1]:
        raise PipesimError(f"{kind}: {large[0]} bytes took no longer than {small[0]} ({large[1]} s <= "
                           f"{small[1]} s); re-run the measurement")
    bandwidth = c * (large[0] - small[0]) / (large[1] - small[1])
    latency = max(0.0, (small[1] - c * small[0] / bandwidth) / a)
    return LinkFit(kind, n, small, large, bandwidth, latency)


def link_fit(data: measured.Measurements) -> LinkFit | None:
    """The [intra] link: `_fit` of the first of LINK_KINDS measured at two sizes or more; None: none was."""
    for kind in LINK_KINDS:
        fit = _fit(data, kind)
        if fit is not None:
            return fit
    return None


def collective_factors(data: measured.Measurements, link: LinkFit | None) -> dict[str, float]:
    """Each other ring collective's fitted bandwidth over the all_reduce link's (LinkClass.collective_bandwidth):
    NCCL runs all_gather and reduce_scatter as their own kernels, not as halves of an all_reduce (Korthikanti et
    al. 2022, section 6.2, found the pair slower than an all_reduce of the same bytes). {} without an all_reduce
    link or without the other kinds at two sizes over its ranks."""
    if link is None or link.kind != "all_reduce":
        return {}
    out = {}
    for kind in ("all_gather", "reduce_scatter"):
        fit = _fit(data, kind)
        if fit is not None and fit.ranks == link.ranks:
            out[kind] = fit.bandwidth / link.bandwidth
    return out


def collective_records(path: Path) -> list[measured.Record]:
    """Records of a `pipesim bench collectives --json` report (executor/collectives_bench.py) the model uses."""
    try:
        report = json.loads(Path(path).read_text())
        n = int(report["world_size"])
        return [measured.Record(r["op"], "float32", (n,), int(r["bytes"]), float(r["time"]))
                for r in report.get("results", []) if r["op"] in measured.COLLECTIVES]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PipesimError(f"cannot read collectives report {path}: {exc}") from None


def gemm_dtype(data: measured.Measurements) -> str:
    """The dtype matmul_efficiency is measured in: bfloat16 when the run timed it, else its first GEMM's."""
    dtypes = [r.dtype for r in data.of(measured.GEMM) if r.dtype != measured.FP8_GEMM]  # FP8's is its own figure
    return "bfloat16" if "bfloat16" in dtypes or not dtypes else dtypes[0]


@dataclass(frozen=True)
class GpuCalibration:
    """The hardware file's contents and what they came from."""

    hardware: Hardware
    family: str
    dtype: str  # of the GEMMs matmul_efficiency comes from
    profile: DeviceProfile  # the family's profile with the measured figures over it
    link: LinkFit | None
    gemms: Comparison | None  # the GEMM model with `profile` against every GEMM of `dtype` measured
    data: measured.Measurements | None = None  # the records it was assembled from

    def summary(self) -> str:
        k = self.hardware.device.kernels
        assert k is not None
        lines = [f"{self.hardware.device.name} as device family {self.family}: {k.source}",
                 "kernel figures: " + ", ".join(f"{n} {v:.4g}" for n, v in k.figures().items())]
        datasheet = self.profile.hbm_bandwidth / 1e12  # TB/s
        if k.memory_efficiency is not None:
            share = 100 * k.memory_efficiency
            lines.append(f"HBM: {datasheet * k.memory_efficiency:.3f} TB/s by the best copy ({share:.1f} % of the "
                         f"datasheet's {datasheet:.3f}): GEMM and flash operands")
        if k.memory_bound_efficiency is not None:
            kernels = measured.memory_bound_bandwidths(self.data) if self.data is not None else {}
            lines.append(f"memory-bound kernels: {datasheet * k.memory_bound_efficiency:.3f} TB/s, their median ("
                         + ", ".join(f"{n} {v / 1e12:.3f}" for n, v in kernels.items())
                         + f") ({100 * k.memory_bound_efficiency:.1f} % of the datasheet)")
        held = measured.sustained_fraction(self.data, self.dtype) if self.data is not None else None
        if held is not None:
            lines.append(f"sustained GEMM: {100 * held:.1f} % of its burst rate once the clock settled "
                         "(matmul_efficiency and the flash figures include it)")
        if self.link is not None:
            f = self.link
            lines.append(f"intra link: {f.bandwidth / 1e9:.1f} GB/s, {f.latency * 1e6:.2f} us: {f.kind} over "
                         f"{f.ranks} ranks reproduced at {f.small[0]} and {f.large[0]} bytes")
            factors = self.hardware.intra.collective_bandwidth
            if factors:
                lines.append("collectives' bandwidth over all_reduce's: "
                             + ", ".join(f"{k} {v:.3f}" for k, v in factors.items()))
        if k.fp8_matmul_efficiency is not None:
            held = measured.sustained_fraction(self.data, measured.FP8_GEMM) if self.data is not None else None
            lines.append(f"FP8 GEMMs (torch._scaled_mm): {100 * k.fp8_matmul_efficiency:.1f} % of the FP8 peak"
                         + (f", sustained at {100 * held:.1f} % of their burst" if held is not None else ""))
        if self.gemms is not None:
            lines.append(f"GEMM model with these figures vs the run's {self.dtype} GEMMs: {self.gemms.summary()}")
        return "\n".join(lines)


def source_of(meta: dict[str, str]) -> str:
    """One line naming the run: device, date, torch, CUDA (from the measurements' header)."""
    what = ", ".join(f"{key} {meta[key]}" for key in ("torch", "cuda") if meta.get(key))
    return f"measured on {meta.get('device', 'an unnamed device')}, {meta.get('date', 'undated')}" + \
        (f" ({what})" if what else "")


def fp8_peak(family: str) -> float | None:
    """The family's dense FP8 peak (pipesim/presets/gemm/fp8.toml), None for a family without FP8 tensor cores."""
    try:
        return fp8_figures(family).peak
    except PipesimError:
        return None


def assemble(data: measured.Measurements, *, family: str | None = None, base: Hardware | None = None) -> GpuCalibration:
    """The hardware file of a measurement: `base` (default: the family's single-node preset) with the measured
    kernel figures in [device.kernels], the memory-bound kernels' (or the best copy's) bandwidth as hbm_bandwidth,
    and the fitted [intra] link."""
    family = family or data.meta.get("family") or family_of(data.meta.get("device", ""))
    profile = device_profile(family)
    base = base or base_preset(family, data.meta.get("device", ""))
    dtype = gemm_dtype(data)
    figures = measured.summarise(data, profile, dtype, fp8_peak=fp8_peak(family))
    if not figures:
        raise PipesimError("the measurements hold no kernel record (gemm, copy, launch, flash_forward, "
                           "flash_backward): nothing to calibrate")
    source = source_of(data.meta)
    try:
        kernels = KernelFigures(**figures, source=source)
        measured_profile = profile.with_measured(source, **{k: v for k, v in figures.items()  # each as a profile's
                                                            if k != "fp8_matmul_efficiency"})
    except PipesimError as exc:
        raise PipesimError(f"{exc} (is the device family {family!r} right? pass --family)") from None
    measured_memory = {"memory_bound_efficiency", "memory_efficiency"} & set(figures)
    hbm = measured_profile.memory_bound_rate if measured_memory else base.device.hbm_bandwidth
    memory = int(data.meta["memory"]) if data.meta.get("memory", "").isdigit() else base.device.memory
    device = replace(base.device, name=data.meta.get("device", base.device.name), family=family, kernels=kernels,
                     hbm_bandwidth=hbm, memory=memory)
    link = link_fit(data)
    factors = collective_factors(data, link)
    intra = replace(base.intra, bandwidth=link.bandwidth, latency=link.latency,
                    collective_bandwidth=factors or None) if link else base.intra
    parts = ["kernel figures ([device.kernels]) and hbm_bandwidth (the memory-bound kernels' median bandwidth, or "
             "the best copy without them): " + source]
    if link:
        parts.append(f"[intra] bandwidth and latency: NCCL {link.kind} over {link.ranks} ranks, the ring formula "
                     f"through {link.small[0]} and {link.large[0]} bytes")
    if factors:
        parts.append("[intra] collective_bandwidth: each collective's bandwidth by the same fit over all_reduce's")
    parts.append(f"everything else: preset {base.name} ({base.source})")
    hardware = replace(base, name=f"{base.name}-measured", device=device, intra=intra, source="; ".join(parts))
    rows = [Measured(*r.shape, dtype=dtype, flops_per_s=r.flops / r.seconds)
            for r in data.of(measured.GEMM) if r.dtype == dtype]
    check = compare(rows, measured_profile) if rows and dtype in measured_profile.flops else None
    return GpuCalibration(hardware, family, dtype, measured_profile, link, check, data)


def measurements_path(output: Path) -> Path:
    """Where `--gpu` keeps its measurements: beside the hardware file, hw.toml -> hw.measurements.csv."""
    return output.with_name(output.stem + ".measurements.csv")


__all__ = ["GpuCalibration", "LinkFit", "assemble", "base_preset", "collective_factors", "collective_records",
           "family_of", "fp8_peak", "gemm_dtype", "link_fit", "measurements_path", "source_of"]
