"""What the collectives benchmark measures, checked before torchrun starts; no torch at import.

Built from `pipesim bench collectives`' flags (pipesim.commands.bench_cmd) and handed to the torchrun
worker (`python -m executor.collectives_bench --config JSON`) as JSON of its fields.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from executor.config_json import dataclass_from_dict
from pipesim.errors import PipesimError

OPS = ("broadcast", "scatter", "gather", "reduce", "all_gather", "reduce_scatter", "all_reduce", "all_to_all",
       "send_recv")
_SUFFIX = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3}  # binary, as nccl-tests' -b/-e


@dataclass(frozen=True)
class CollectivesConfig:
    """One benchmark launch; sizes in bytes, timeout in seconds."""

    sizes: tuple[int, ...] = (1024, 64 * 1024, 1024**2, 16 * 1024**2)  # bytes, the whole buffer S
    ops: tuple[str, ...] = OPS
    iters: int = 20  # timed calls per size
    warmup: int = 2  # untimed calls per size
    backend: str = "auto"  # auto (nccl with GPUs, else gloo) | gloo | nccl
    json: str | None = None  # "-": stdout
    plot: str | None = None  # HTML file
    lecture: bool = False  # the lecture's all_reduce/reduce_scatter demo instead
    elements: int | None = None  # --lecture: float32 elements (default 100M on GPU, 10M on CPU)
    timeout: float = 120.0  # seconds, process-group timeout

    def check(self) -> CollectivesConfig:
        """Everything a user can get wrong, before any process group exists; returns self."""
        if not self.sizes:
            raise PipesimError("--sizes is empty")
        unknown = [o for o in self.ops if o not in OPS]
        if unknown:
            raise PipesimError(f"unknown collective {', '.join(map(repr, unknown))}; choose from {', '.join(OPS)}")
        for name in ("iters", "warmup", "elements"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "warmup" else 1):
                raise PipesimError(f"--{name} must be {'>= 0' if name == 'warmup' else 'positive'}, got {value}")
        if self.plot and not self.plot.endswith(".html"):
            raise PipesimError(f"--plot writes HTML; name the file *.html, got {self.plot!r}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise PipesimError(f"unknown --backend {self.backend!r}; choose auto, gloo or nccl")
        if self.backend == "nccl":
            import torch  # only for nccl: the parent's checks stay free of torch's start-up

            if not torch.cuda.is_available():
                raise PipesimError("--backend nccl needs CUDA GPUs; none are visible (use gloo)")
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> CollectivesConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PipesimError(f"cannot read the benchmark configuration: {exc}") from None
        return dataclass_from_dict(cls, data, "benchmark configuration")


def parse_size(text: str) -> int:
    """'64K' -> 65536 bytes (binary suffixes K, M, G; plain integers are bytes)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B") if text.strip() else ""
    unit = t[-1:] if t[-1:] in _SUFFIX else ""
    number = t[: len(t) - len(unit)]
    try:
        value = float(number) * _SUFFIX[unit]
    except ValueError:
        raise PipesimError(f"cannot read size {text!r}; use bytes or a K/M/G suffix, e.g. 1K,1M,16M") from None
    if value < 1 or value != int(value):
        raise PipesimError(f"size {text!r} must be a whole number of bytes >= 1")
    return int(value)


def parse_ops(text: str) -> list[str]:
    """'all_reduce,gather' -> the named collectives, each one of OPS."""
    ops = [o.strip() for o in text.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if not ops:
        raise PipesimError(f"--ops {text!r} names no collective; choose from {', '.join(OPS)}")
    if unknown:
        raise PipesimError(f"unknown collective {', '.join(map(repr, unknown))}; choose from {', '.join(OPS)}")
    return ops
