"""Formatting at the edges: everything inside is seconds and bytes; tables print these."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """`512.00 KiB`, `1.50 GiB`, `12 B` (binary units, two decimals)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
