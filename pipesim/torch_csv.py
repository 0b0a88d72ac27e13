"""Interop with torch.distributed.pipelining: its schedule CSV and action notation.

One row per rank, one action per cell (`0F0`, `1B2`, `2I0`, `0SEND_F1`); empty cells are
spacing. Rows may be compute-only or include P2P actions ("compute_comms"). Stage placement is
inferred from which row runs each stage, as torch does.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from pipesim.errors import PipesimError
from pipesim.ir import Action, Schedule


def parse_rows(rows: list[list[str]], name: str = "csv") -> Schedule:
    """Build a schedule from rows of action strings (rank r = row r)."""
    programs: list[tuple[Action, ...]] = []
    for r, row in enumerate(rows):
        actions = []
        for col, cell in enumerate(row):
            if not cell.strip():
                continue
            try:
                actions.append(Action.parse(cell))
            except PipesimError as exc:
                raise PipesimError(f"{name}: row {r + 1}, column {col + 1}: {exc}") from None
        programs.append(tuple(actions))
    if not programs or not any(programs):
        raise PipesimError(f"{name}: no actions found")
    placement: dict[int, int] = {}
    for r, prog in enumerate(programs):
        for a in prog:
            if a.stage in placement and placement[a.stage] != r:
                raise PipesimError(
                    f"{name}: stage {a.stage} appears on rank {placement[a.stage]} and rank {r}; "
                    "each stage must live on one rank"
                )
            placement[a.stage] = r
    num_stages = max(placement) + 1
    missing = [s for s in range(num_stages) if s not in placement]
    if missing:
        raise PipesimError(f"{name}: stage {missing[0]} has no actions (stages must be 0..{num_stages - 1})")
    num_mb = 1 + max(a.microbatch for prog in programs for a in prog)
    return Schedule(name, num_mb, tuple(placement[s] for s in range(num_stages)), tuple(programs))


def loads(text: str, name: str = "csv") -> Schedule:
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise PipesimError(f"{name}: malformed CSV: {exc}") from None
    return parse_rows(rows, name)


def load(path: str | Path) -> Schedule:
    """Read a torch.distributed.pipelining schedule CSV."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise PipesimError(f"schedule CSV not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PipesimError(f"cannot read schedule CSV {path}: {exc}") from None
    return loads(text, Path(path).name)


def dumps(schedule: Schedule) -> str:
    """CSV text in torch's format (one row per rank)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for prog in schedule.programs:
        writer.writerow([str(a) for a in prog])
    return out.getvalue()


def dump(schedule: Schedule, path: str | Path) -> None:
    Path(path).write_text(dumps(schedule))
