"""argparse's value types for the command line's numbers, in a module of their own so that every argument module can
take them (pipesim.commands.common re-exports them)."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    return bounded_int(text, 1)


def positive_float(text: str) -> float:
    """`text` as a finite number > 0 (argparse's error otherwise)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def bounded_int(text: str, minimum: int) -> int:
    """`text` as an integer >= `minimum` (argparse's error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


__all__ = ["bounded_int", "positive_float", "positive_int"]
