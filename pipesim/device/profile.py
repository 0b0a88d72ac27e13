"""A device family's figures for the kernel time model, each with the source it comes from.

A GEMM's time depends on the device as much as on its shape: how many SMs share the tiles, the
tile shapes the library picks from, the tensor-core peak per dtype, the HBM bandwidth, and how
close to those peaks real kernels get. `DeviceProfile` holds those figures; the shipped families
(A100, H100, H200, B200, B300) live in pipesim/presets/gemm/devices.toml with a source per field, and a
GPU run of `pipesim calibrate --gpu` replaces the measured ones (`DeviceProfile.with_measured`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path

from pipesim.errors import PipesimError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

FRACTIONS = ("matmul_efficiency", "memory_efficiency", "overlap", "flash_forward_efficiency",
             "flash_backward_efficiency")
# a family may leave these out (each still names its source)
OPTIONAL_FRACTIONS = frozenset({"memory_bound_efficiency", "flash2_forward_efficiency", "flash2_backward_efficiency",
                                "flash_hd64_forward", "flash_hd64_backward", "flash2_hd64_forward",
                                "flash2_hd64_backward"})
OPTIONAL = OPTIONAL_FRACTIONS | {"power_limit", "power_ratings"}
DERIVED = frozenset({"clock_scale"})  # set from a hardware file's board (pipesim.device.power), never in the presets
# bytes per element (float4: NVFP4's E2M1, two to a byte; its block scales are the casts' bytes)
DTYPE_BYTES = {"float32": 4, "tfloat32": 4, "bfloat16": 2, "float16": 2, "float8": 1, "float4": 0.5}


@dataclass(frozen=True)
class DeviceProfile:
    """Figures of one accelerator for pipesim/device's kernel model (SI units)."""

    name: str
    sms: int  # streaming multiprocessors: tiles run one per SM per wave
    tiles: tuple[tuple[int, int], ...]  # (rows, cols) output tile shapes the GEMM library picks from
    flops: dict[str, float]  # dtype -> dense peak FLOP/s ("tfloat32": fp32 inputs on tensor cores)
    hbm_bandwidth: float  # bytes/s, datasheet
    matmul_efficiency: float  # best achievable fraction of the peak for a large GEMM (MAMF / peak)
    memory_efficiency: float  # achievable fraction of hbm_bandwidth streaming (a copy; GEMM and flash operands)
    kernel_overhead: float  # seconds per kernel (launch and fixed start-up), added once per kernel
    overlap: float  # fraction of min(compute, memory) hidden behind the other (1: max, 0: sum)
    flash_forward_efficiency: float  # flash attention forward: fraction of the peak
    flash_backward_efficiency: float  # flash attention backward (recompute included): fraction of the peak
    sources: dict[str, str] = field(default_factory=dict, compare=False)  # field -> citation
    # NCCL channels (one thread block, one SM, each) of a collective inside the node: the SMs an overlapped
    # GEMM loses (pipesim.comm.overlap_interference); 0: overlap taken as free
    nccl_channels: int = 0
    # memory-bound kernels (norms, softmax, activations, dropout, adds, the optimizer): their bytes/s / hbm_bandwidth;
    # None: memory_efficiency (a run on an H200 measured torch's at 0.57 of the datasheet against a copy's 0.88)
    memory_bound_efficiency: float | None = None
    # FlashAttention-2 (PyTorch SDPA's flash backend, --attention flash2): forward and backward fractions of the
    # peak; None: the family has no such figure (refused)
    flash2_forward_efficiency: float | None = None
    flash2_backward_efficiency: float | None = None
    # the flash kernel's rate at head dim 64 over its rate at 128, forward and backward (pipesim.device.kernels.
    # head_dim_factor: smaller heads do less MMA work per softmax); flash2_*: FlashAttention-2's; None: no figure, the
    # head dim changes nothing
    flash_hd64_forward: float | None = None
    flash_hd64_backward: float | None = None
    flash2_hd64_forward: float | None = None
    flash2_hd64_backward: float | None = None
    # the reference board's power limit (watts) the figures above were measured under, and the boards of the same die
    # NVIDIA rates at other limits: (watts, dense BF16 peak FLOP/s) pairs (pipesim.device.power); () none known
    power_limit: float | None = None
    power_ratings: tuple[tuple[float, float], ...] = ()
    # this board's sustained tensor clock over the reference board's (a lower power limit: pipesim.device.power);
    # every peak is taken times it
    clock_scale: float = 1.0

    def __post_init__(self) -> None:
        where = f"device {self.name!r}"
        if not isinstance(self.sms, int) or self.sms < 1:
            raise PipesimError(f"{where}: sms must be a positive integer, got {self.sms!r}")
        if not self.tiles or any(len(t) != 2 or min(t) < 1 for t in self.tiles):
            raise PipesimError(f"{where}: tiles must be (rows, cols) pairs of positive integers, got {self.tiles!r}")
        for dtype, peak in self.flops.items():
            if dtype not in DTYPE_BYTES or not _positive(peak):
                raise PipesimError(f"{where}: flops[{dtype!r}] must be a dtype of {', '.join(DTYPE_BYTES)} "
                                   f"with a positive FLOP/s, got {peak!r}")
        if not isinstance(self.nccl_channels, int) or isinstance(self.nccl_channels, bool) or \
                not 0 <= self.nccl_channels < self.sms:
            raise PipesimError(f"{where}: nccl_channels must be an integer from 0 to sms - 1, "
                               f"got {self.nccl_channels!r}")
        for name in ("hbm_bandwidth", "kernel_overhead"):
            value = getattr(self, name)
            if not (_positive(value) or (name == "kernel_overhead" and value == 0)):
                raise PipesimError(f"{where}: {name} must be positive, got {value!r}")
        if self.power_limit is not None and not _positive(self.power_limit):
            raise PipesimError(f"{where}: power_limit must be positive watts, got {self.power_limit!r}")
        if any(len(r) != 2 or not all(_positive(x) for x in r) for r in self.power_ratings):
            raise PipesimError(f"{where}: power_ratings must be (watts, FLOP/s) pairs of positive numbers, "
                               f"got {self.power_ratings!r}")
        if not _positive(self.clock_scale):
            raise PipesimError(f"{where}: clock_scale must be positive, got {self.clock_scale!r}")
        for name in (*FRACTIONS, *sorted(OPTIONAL_FRACTIONS)):
            value = getattr(self, name)
            if value is None and name in OPTIONAL_FRACTIONS:
                continue
            low_ok = value >= 0 if name == "overlap" else value > 0
            if not (isinstance(value, (int, float)) and low_ok and value <= 1):
                raise PipesimError(f"{where}: {name} must be a fraction in (0, 1], got {value!r}")

    def __hash__(self) -> int:  # dict fields: hash by their sorted items so a profile can key a cache
        return hash((self.name, self.sms, self.tiles, tuple(sorted(self.flops.items())), self.hbm_bandwidth,
                     self.matmul_efficiency, self.memory_efficiency, self.kernel_overhead, self.overlap,
                     self.flash_forward_efficiency, self.flash_backward_efficiency, self.nccl_channels,
                     self.memory_bound_efficiency, self.flash2_forward_efficiency, self.flash2_backward_efficiency,
                     self.flash_hd64_forward, self.flash_hd64_backward, self.flash2_hd64_forward,
                     self.flash2_hd64_backward, self.power_limit, self.power_ratings, self.clock_scale))

    @property
    def memory_bound_rate(self) -> float:
        """Bytes/s of a memory-bound kernel: HBM x memory_bound_efficiency (memory_efficiency when not given)."""
        eff = self.memory_efficiency if self.memory_bound_efficiency is None else self.memory_bound_efficiency
        return self.hbm_bandwidth * eff

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype` at this board's clock (`clock_scale`), or a one-line error naming the dtypes
        it has."""
        if dtype not in self.flops:
            raise PipesimError(f"device {self.name!r} has no {dtype} peak (has {', '.join(sorted(self.flops))})")
        return self.flops[dtype] * self.clock_scale

    def with_flash2(self) -> DeviceProfile:
        """The profile whose flash kernel is FlashAttention-2 (`--attention flash2`); one line when the family has
        no FlashAttention-2 figures."""
        fwd, bwd = self.flash2_forward_efficiency, self.flash2_backward_efficiency
        if fwd is None or bwd is None:
            raise PipesimError(f"--attention flash2: device {self.name!r} has no FlashAttention-2 figures; use "
                               "--attention flash (its fastest fused attention)")
        src = self.sources
        swapped = ("forward_efficiency", "backward_efficiency", "hd64_forward", "hd64_backward")
        return replace(self, **{f"flash_{x}": getattr(self, f"flash2_{x}") for x in swapped},
                       sources={**src, **{f"flash_{x}": src.get(f"flash2_{x}", "") for x in swapped}})

    def with_measured(self, source: str, **figures: float) -> DeviceProfile:
        """A copy whose `figures` (e.g. matmul_efficiency) come from a measurement named `source`."""
        unknown = set(figures) - {f.name for f in fields(self)}
        if unknown:
            raise PipesimError(f"device {self.name!r} has no field {', '.join(sorted(unknown))}")
        return replace(self, **figures, sources={**self.sources, **{k: source for k in figures}})


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _data_file() -> Path:
    return Path(str(resources.files("pipesim").joinpath("presets", "gemm", "devices.toml")))


def load_profiles(path: Path | None = None) -> dict[str, DeviceProfile]:
    """Every family of a device-profile TOML file (default: the shipped devices.toml), by table name."""
    path = path or _data_file()
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PipesimError(f"cannot read device profiles {path}: {exc}") from exc
    names = {f.name for f in fields(DeviceProfile)} - DERIVED
    profiles = {}
    for family, table in data.items():
        missing = names - set(table) - {"sources"} - OPTIONAL
        extra = set(table) - names
        if missing or extra:
            raise PipesimError(f"{path}: [{family}] " + (f"lacks {', '.join(sorted(missing))}" if missing else
                                                         f"has unknown {', '.join(sorted(extra))}"))
        unsourced = set(table) - {"name", "sources"} - set(table.get("sources", {}))  # every figure given
        if unsourced:
            raise PipesimError(f"{path}: [{family}] names no source for {', '.join(sorted(unsourced))}")
        ratings = tuple((float(w), float(f)) for w, f in table.get("power_ratings", ()))
        profiles[family] = DeviceProfile(**{**table, "tiles": tuple(tuple(t) for t in table["tiles"]),
                                            "power_ratings": ratings})
    return profiles


def device_profile(family: str) -> DeviceProfile:
    """The shipped profile of `family` (A100, A100-PCIe, H100, H200, B200, B300)."""
    profiles = load_profiles()
    if family not in profiles:
        raise PipesimError(f"unknown device family {family!r}; choose one of {', '.join(sorted(profiles))}")
    return profiles[family]


__all__ = ["DTYPE_BYTES", "DeviceProfile", "device_profile", "load_profiles"]
