"""What-if perturbations: a slow rank, a slow link, jitter, or recorded durations, applied where costs meet the kernel.

The simulator compiles each rank's program into op records (`pipesim.sim.program`) whose seconds come from
the cost table; a perturbation rewrites those seconds once, after compilation and before the run, so every
schedule, configuration and machine model gets it the same way (nothing per schedule). Compiled ops are
shared per (rank, stage, kind); a perturbed op is a fresh record at its position, the shared ones untouched.

- `slow`: pipeline rank -> factor on its compute seconds (a throttled GPU, a busy host core);
- `slow_links`: (rank a, rank b) -> factor on the transfer seconds of messages between them, both ways;
- `jitter`: sigma of a lognormal factor exp(sigma z), z ~ N(0, 1), on every compute action's seconds
  (median 1, mean exp(sigma^2 / 2)), drawn from `random.Random(seed)` rank by rank, action by action, so
  one seed gives one result bit for bit;
- `durations`: (rank, index in the lowered program) -> seconds, replacing a compute action's seconds or a
  SEND's transfer seconds (the replay of a measured run, `pipesim.sim.replay`); the factors apply on top.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from pipesim.errors import PipesimError
from pipesim.ir.schedule import Schedule
from pipesim.sim.program import ComputeOp, Op, SendOp


@dataclass(frozen=True)
class Perturbation:
    """Factors on compute and transfer seconds (see the module docstring); the empty one changes nothing."""

    slow: tuple[tuple[int, float], ...] = ()  # (pipeline rank, factor on its compute seconds)
    slow_links: tuple[tuple[int, int, float], ...] = ()  # (rank a, rank b, factor on transfer seconds, both ways)
    jitter: float = 0.0  # sigma of the lognormal factor on every compute action (0: none)
    seed: int = 0  # of the jitter's draws
    durations: dict[tuple[int, int], float] = field(default_factory=dict, compare=False)  # seconds per action

    def __bool__(self) -> bool:
        return bool(self.slow or self.slow_links or self.jitter or self.durations)

    def check(self, ranks: int) -> None:
        """PipesimError naming the first rank, link or factor that does not fit a pipeline of `ranks` ranks."""
        for rank, factor in self.slow:
            _check_rank(rank, ranks, f"--slow {rank}={factor:g}")
            _check_factor(factor, f"--slow {rank}={factor:g}")
        _check_once([r for r, _ in self.slow], "--slow names rank {} more than once: give each rank one factor")
        for a, b, factor in self.slow_links:
            what = f"--slow-link {a}-{b}={factor:g}"
            _check_rank(a, ranks, what)
            _check_rank(b, ranks, what)
            if a == b:
                raise PipesimError(f"{what}: a link joins two different ranks")
            _check_factor(factor, what)
        _check_once([f"{min(a, b)}-{max(a, b)}" for a, b, _ in self.slow_links],
                    "--slow-link names link {} more than once: give each link one factor")
        if not math.isfinite(self.jitter) or self.jitter < 0:
            raise PipesimError(f"--jitter must be a sigma >= 0, got {self.jitter:g}")

    def apply(self, sched: Schedule, ops: list[list[Op]]) -> list[list[Op]]:
        """The compiled programs of `sched` (lowered) with these factors applied; `ops` itself is not changed."""
        if not self:
            return ops
        self.check(sched.num_ranks)
        slow = dict(self.slow)
        links: dict[frozenset, float] = {}
        for a, b, factor in self.slow_links:
            links[frozenset((a, b))] = links.get(frozenset((a, b)), 1.0) * factor
        draw = random.Random(self.seed).gauss if self.jitter else None
        out = []
        for rank, prog in enumerate(ops):
            stretch = slow.get(rank, 1.0)
            new = list(prog)
            for i, op in enumerate(prog):
                if type(op) is ComputeOp:
                    seconds = self.durations.get((rank, i), op.seconds) * stretch
                    if draw is not None:
                        seconds *= self._factor(draw(0.0, 1.0))
                    if seconds != op.seconds:
                        new[i] = op._replace(seconds=seconds)
                elif type(op) is SendOp:
                    seconds = self.durations.get((rank, i), op.seconds) * links.get(frozenset((rank, op.dst)), 1.0)
                    if seconds != op.seconds:
                        new[i] = op._replace(seconds=seconds)
            out.append(new)
        return out

    def _factor(self, z: float) -> float:
        """The jitter's factor exp(sigma z) for one draw; one line where it leaves the floats (a sigma of hundreds)."""
        try:
            return math.exp(self.jitter * z)
        except OverflowError:
            raise PipesimError(f"--jitter {self.jitter:g}: the factor exp(sigma z) of a draw z = {z:.2f} overflows; "
                               "give a smaller sigma") from None

    def describe(self) -> str:
        """`rank 1 x2, link 0-1 x3, jitter sigma 0.1 (seed 0)`: what was perturbed, for reports."""
        parts = [f"rank {r} x{f:g}" for r, f in self.slow]
        parts += [f"link {a}-{b} x{f:g}" for a, b, f in self.slow_links]
        if self.jitter:
            parts.append(f"lognormal jitter sigma {self.jitter:g} (seed {self.seed})")
        if self.durations:
            parts.append(f"{len(self.durations)} recorded durations")
        return ", ".join(parts) or "nothing"

    def to_dict(self) -> dict:
        return {"slow": [{"rank": r, "factor": f} for r, f in self.slow],
                "slow_links": [{"a": a, "b": b, "factor": f} for a, b, f in self.slow_links],
                "jitter_sigma": self.jitter, "seed": self.seed}


def _check_rank(rank: int, ranks: int, what: str) -> None:
    if not 0 <= rank < ranks:
        raise PipesimError(f"{what}: pipeline rank {rank} does not exist (ranks 0-{ranks - 1})")


def _check_once(keys: list, message: str) -> None:
    """A rank or link given twice would take one of its factors silently: refused, naming it."""
    twice = [k for i, k in enumerate(keys) if k in keys[:i]]
    if twice:
        raise PipesimError(message.format(twice[0]))


def _check_factor(factor: float, what: str) -> None:
    if not math.isfinite(factor) or factor <= 0:
        raise PipesimError(f"{what}: the factor must be a finite number > 0")


def parse_slow(text: str) -> tuple[int, float]:
    """`RANK=FACTOR` -> (rank, factor); PipesimError (one line) when malformed or the factor is not > 0."""
    rank, sep, factor = text.partition("=")
    try:
        if not sep:
            raise ValueError
        r, f = int(rank), float(factor)
    except ValueError:
        raise PipesimError(f"--slow {text!r}: expected RANK=FACTOR, e.g. 3=1.5") from None
    _check_factor(f, f"--slow {text}")
    if r < 0:
        raise PipesimError(f"--slow {text}: pipeline rank {r} does not exist")
    return r, f


def parse_slow_link(text: str) -> tuple[int, int, float]:
    """`A-B=FACTOR` -> (a, b, factor); PipesimError (one line) when malformed or the factor is not > 0."""
    pair, sep, factor = text.partition("=")
    a, dash, b = pair.partition("-")
    try:
        if not sep or not dash:
            raise ValueError
        ra, rb, f = int(a), int(b), float(factor)
    except ValueError:
        raise PipesimError(f"--slow-link {text!r}: expected A-B=FACTOR (two pipeline ranks), e.g. 0-1=2") from None
    _check_factor(f, f"--slow-link {text}")
    if ra == rb:
        raise PipesimError(f"--slow-link {text}: a link joins two different ranks")
    return ra, rb, f


__all__ = ["Perturbation", "parse_slow", "parse_slow_link"]
