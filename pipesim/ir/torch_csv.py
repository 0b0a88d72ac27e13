"""Interop with torch.distributed.pipelining: its schedule CSV and action notation.

One row per rank, one action per cell (`0F0`, `1B2`, `2I0`, `0SEND_F1`); empty cells are
spacing. Rows may be compute-only or include P2P actions ("compute_comms"). Stage placement is
inferred from which row runs each stage, as torch does.

torch also writes FSDP/DP bookkeeping actions (`0UNSHARD`, `0RESHARD`, `0REDUCE_GRAD`), which carry
no pipeline dependency: they are dropped on import and counted in `meta["ignored_actions"]`.
A composite `(0F3;3B1)OVERLAP_F_B` cell is one overlapped action (`Schedule.overlaps`): its two
sub-actions, forward first, adjacent in the program; it is written back the same way.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from pipesim.errors import PipesimError, refuse_special_file
from pipesim.ir.schedule import Action, Kind, Schedule

_BOOKKEEPING = re.compile(r"^\d+(UNSHARD|RESHARD|REDUCE_GRAD)\d*$")
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")


def parse_cell(cell: str) -> list[Action]:
    """Actions in one CSV cell: none for spacing and bookkeeping, several for OVERLAP_F_B."""
    text = cell.strip()
    if not text or _BOOKKEEPING.match(text):
        return []
    overlap = _OVERLAP.match(text)
    if overlap:
        parts = [Action.parse(part) for part in overlap.group(1).split(";") if part.strip()]
        if len(parts) != 2 or parts[0].kind != Kind.F or parts[1].kind not in (Kind.B, Kind.I):
            raise PipesimError(f"malformed {text!r}: OVERLAP_F_B holds one forward then one backward, "
                               "such as '(0F7;7B3)OVERLAP_F_B'")
        return parts
    return [Action.parse(text)]


def parse_rows(rows: list[list[str]], name: str = "csv") -> Schedule:
    """Build a schedule from rows of action strings (rank r = row r)."""
    programs: list[tuple[Action, ...]] = []
    pairs: set[tuple[Action, Action]] = set()
    ignored = 0
    for r, row in enumerate(rows):
        actions = []
        for col, cell in enumerate(row):
            try:
                parsed = parse_cell(cell)
            except PipesimError as exc:
                raise PipesimError(f"{name}: row {r + 1}, column {col + 1}: {exc}") from None
            ignored += bool(_BOOKKEEPING.match(cell.strip()))
            if len(parsed) == 2:
                pairs.add((parsed[0], parsed[1]))
            actions.extend(parsed)
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
    sched = Schedule(name, num_mb, tuple(placement[s] for s in range(num_stages)), tuple(programs),
                     overlaps=frozenset(pairs), chains=_chains(programs, num_stages, num_mb))
    sched.meta["ignored_actions"] = ignored
    return sched


def _chains(programs: list[tuple[Action, ...]], num_stages: int, num_mb: int) -> int:
    """The stage chains the actions imply (pipesim's DualPipe: 2), torch's CSV having no column for them: the
    fewest k > 1 such that every microbatch of block j (of m / k) stays on stage block j (of stages / k); else 1."""
    for k in range(2, min(num_stages, num_mb) + 1):
        if num_stages % k == 0 and num_mb % k == 0 and all(
                a.stage * k // num_stages == a.microbatch * k // num_mb for prog in programs for a in prog):
            return k
    return 1


def loads(text: str, name: str = "csv") -> Schedule:
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise PipesimError(f"{name}: malformed CSV: {exc}") from None
    return parse_rows(rows, name)


def load(path: str | Path) -> Schedule:
    """Read a torch.distributed.pipelining schedule CSV."""
    refuse_special_file(path, f"schedule CSV {path}")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PipesimError(f"schedule CSV not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PipesimError(f"cannot read schedule CSV {path}: {exc}") from None
    if text.startswith("\ufeff"):  # Excel's "CSV UTF-8": torch's reader (csv over open()) keeps it in the first cell
        raise PipesimError(f"schedule CSV {path} starts with a byte-order mark, which torch.distributed.pipelining "
                           "reads as part of its first action: save it without one")
    return loads(text, Path(path).name)


def check_csv_counts(schedule: Schedule, name: str, *, stages: int | None = None, microbatches: int | None = None,
                     virtual: int | None = None, microbatch_size: int | None = None) -> None:
    """Typed -p, -m or --virtual beside a schedule CSV: the CSV has its own counts, so one it does not have is
    refused rather than read past (None: not typed). `microbatch_size`: `microbatches` is what --microbatch-size
    gave (m = batch / (dp x N)), named so."""
    if microbatch_size is not None and microbatches != schedule.num_microbatches:
        raise PipesimError(f"--microbatch-size {microbatch_size} gives {microbatches} microbatches per replica; {name} "
                           f"has its own, {schedule.num_microbatches}")
    chunks = schedule.num_stages // schedule.num_ranks
    for flag, typed, own, what in (("--stages", stages, schedule.num_ranks, "ranks"),
                                   ("--microbatches", microbatches, schedule.num_microbatches, "microbatches"),
                                   ("--virtual", virtual, chunks, "stages per rank")):
        if typed is not None and typed != own:
            raise PipesimError(f"{flag} {typed}: {name} has its own {what}, {own}; drop {flag}")


def dumps(schedule: Schedule) -> str:
    """CSV text in torch's format (one row per rank)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for rank in range(schedule.num_ranks):
        writer.writerow(schedule.cells(rank))
    return out.getvalue()


def dump(schedule: Schedule, path: str | Path) -> None:
    Path(path).write_text(dumps(schedule))
