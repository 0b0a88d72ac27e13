"""The schedule library: one module per family, each registering its builders by name.

Adding a schedule is one module in this package that calls `register`; modules are discovered
automatically, so the simulator, executor, plots and tests pick it up with no other edit.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.ir.gc_pause import no_gc
from pipesim.ir.schedule import Schedule

Builder = Callable[[int, int, int], Schedule]  # (ranks p, microbatches m, virtual v) -> schedule


@dataclass(frozen=True)
class ScheduleSpec:
    """A registered schedule family."""

    name: str
    build: Builder
    summary: str
    virtual: bool = False  # takes --virtual V (chunks per rank)
    default_virtual: int = 1
    order: int = 100  # position in listings: simple schedules first


_REGISTRY: dict[str, ScheduleSpec] = {}


def register(name: str, summary: str, *, virtual: bool = False, default_virtual: int = 1, order: int = 100):
    """Decorator: register `build(p, m, v)` under the lower-case `name`."""

    def wrap(build: Builder) -> Builder:
        if name in _REGISTRY:
            raise RuntimeError(f"schedule {name!r} registered twice")
        _REGISTRY[name] = ScheduleSpec(name, build, summary, virtual, default_virtual, order)
        return build

    return wrap


def _discover() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def names() -> list[str]:
    """Registered schedule names, simple ones first."""
    return sorted(_REGISTRY, key=lambda n: (_REGISTRY[n].order, n))


def spec(name: str) -> ScheduleSpec:
    if name not in _REGISTRY:
        raise PipesimError(f"unknown schedule {name!r}; choose one of: {', '.join(names())}")
    return _REGISTRY[name]


def build(name: str, stages: int, microbatches: int, virtual: int | None = None) -> Schedule:
    """Build a registered schedule for p ranks (`stages`), m microbatches and v chunks per rank."""
    entry = spec(name)
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise PipesimError(f"--stages must be a positive integer, got {stages!r}")
    if not isinstance(microbatches, int) or microbatches < 1:
        raise PipesimError(f"--microbatches must be a positive integer, got {microbatches!r}")
    v = entry.default_virtual if virtual is None else virtual
    if not isinstance(v, int) or v < 1:
        raise PipesimError(f"--virtual must be a positive integer, got {v!r}")
    if v != 1 and not entry.virtual:
        raise PipesimError(f"schedule {name!r} has one stage per rank; --virtual {v} is not admitted")
    with no_gc():  # a big schedule is 100k+ action tuples: the cyclic GC would rescan everything alive meanwhile
        return entry.build(stages, microbatches, v)


_discover()
