"""A torchrun worker's configuration as JSON: its one `--config` argument, and dataclasses back from their dicts.

The launcher hands each worker (`python -m executor`, `python -m executor.collectives_bench`) its configuration as
JSON of the configuration dataclass's fields (`dataclasses.asdict`); this is the way back, shared by every worker:
nested dataclasses rebuilt from their default factories, lists back to tuples, an unknown key refused by name in
one line. It knows no particular configuration (executor.run_config's RunConfig and
executor.collectives_config's CollectivesConfig use it), so it imports nothing of pipesim's but its error type.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path

from pipesim.errors import PipesimError


def dataclass_from_dict(cls, data: object, what: str):
    """`cls(**data)` from JSON: lists back to tuples, a dict back to a nested dataclass field (its default factory)."""
    if not isinstance(data, dict):
        raise PipesimError(f"a {what} is a JSON object, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise PipesimError(f"unknown {what} field(s): {', '.join(unknown)}")
    kw = {}
    for name, value in data.items():
        factory = known[name].default_factory
        if is_dataclass(factory) and isinstance(value, dict):
            value = dataclass_from_dict(factory, value, f"{what} {name}")  # RunConfig.model, .job, Job.dims ...
        elif isinstance(value, list):
            value = tuple(value)  # JSON has no tuples
        kw[name] = value
    return cls(**kw)


def config_argument(argv: list[str], usage: str) -> str:
    """The JSON text of a worker's one argument, `--config JSON` or `--config FILE`."""
    if len(argv) != 2 or argv[0] != "--config":
        raise PipesimError(f"{usage}; got {' '.join(argv) or 'no arguments'}")
    text = argv[1]
    if text.lstrip().startswith(("{", "[")):
        return text
    try:
        return Path(text).read_text(encoding="utf-8")
    except OSError as exc:
        raise PipesimError(f"cannot read {text}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise PipesimError(f"cannot read {text}: not UTF-8 (byte {exc.start}: {exc.reason})") from None


__all__ = ["config_argument", "dataclass_from_dict"]
