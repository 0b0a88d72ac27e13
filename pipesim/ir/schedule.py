"""The schedule IR: actions, placements and per-rank programs.

Everything in pipesim (simulator, executor, plots) consumes these objects directly.
A schedule is a placement (stage -> rank) plus one ordered program of actions per rank,
in the same vocabulary as torch.distributed.pipelining (`0F0`, `1B2`, `2I0`, `0SEND_F1`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

from pipesim.errors import PipesimError


class Kind(str, Enum):
    """What an action does; the values are torch.distributed.pipelining's spellings."""

    F = "F"  # forward of one microbatch through one stage
    B = "B"  # full backward (input grad + weight grad)
    I = "I"  # noqa: E741  backward for the input gradient only
    W = "W"  # backward for the weight gradient only
    SEND_F = "SEND_F"  # send stage output (activation) to stage + 1
    RECV_F = "RECV_F"  # receive stage input from stage - 1
    SEND_B = "SEND_B"  # send input gradient to stage - 1
    RECV_B = "RECV_B"  # receive output gradient from stage + 1

    def __str__(self) -> str:
        return self.value


COMPUTE = frozenset({Kind.F, Kind.B, Kind.I, Kind.W})
SENDS = frozenset({Kind.SEND_F, Kind.SEND_B})
RECVS = frozenset({Kind.RECV_F, Kind.RECV_B})
BACKWARD_FIRST = frozenset({Kind.B, Kind.I})  # the backward piece that produces the input grad

_kind_of = itemgetter(1)  # Action -> its kind, in C
_ACTION_RE = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")


class Action(NamedTuple):
    """One step of a rank's program: (stage, kind, microbatch).

    A NamedTuple rather than a dataclass: schedules hold hundreds of thousands of actions and
    tuple creation, hashing and ordering run in C.
    """

    stage: int
    kind: Kind
    microbatch: int

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE

    @property
    def is_comm(self) -> bool:
        return self.kind not in COMPUTE

    @property
    def peer_stage(self) -> int | None:
        """The stage on the other end of a P2P action (None for compute)."""
        if self.kind in (Kind.SEND_F, Kind.RECV_B):
            return self.stage + 1
        if self.kind in (Kind.RECV_F, Kind.SEND_B):
            return self.stage - 1
        return None

    def matching(self) -> Action:
        """The SEND for a RECV and the RECV for a SEND."""
        pairs = {
            Kind.SEND_F: Kind.RECV_F,
            Kind.RECV_F: Kind.SEND_F,
            Kind.SEND_B: Kind.RECV_B,
            Kind.RECV_B: Kind.SEND_B,
        }
        if self.kind not in pairs:
            raise ValueError(f"{self} is not a P2P action")
        assert self.peer_stage is not None
        return Action(self.peer_stage, pairs[self.kind], self.microbatch)

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    def describe(self) -> str:
        """Long form for messages: `RECV_F(stage 1, mb 3)`."""
        return f"{self.kind.value}(stage {self.stage}, mb {self.microbatch})"

    @staticmethod
    def parse(text: str) -> Action:
        """Parse torch's notation (`2F0`, `3SEND_F1`); raises PipesimError on anything else."""
        match = _ACTION_RE.match(text.strip())
        if not match:
            raise PipesimError(
                f"malformed action {text.strip()!r}: expected STAGE KIND MICROBATCH such as "
                "'0F0', '1B2', '2I0', '2W0' or '0SEND_F1'"
            )
        stage, kind, mb = match.groups()
        return Action(int(stage), Kind(kind), int(mb))


@dataclass(frozen=True)
class Schedule:
    """A placement (stage -> rank) and one ordered program per rank.

    `num_stages` counts model chunks (p * v for interleaved); `placement[s]` is the rank of stage s.
    Programs may be compute-only or lowered (with SEND/RECV actions, see `pipesim.ir.lowering`).
    """

    name: str
    num_microbatches: int
    placement: tuple[int, ...]  # stage -> rank
    programs: tuple[tuple[Action, ...], ...]  # rank -> ordered actions
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    # (forward, backward) pairs run as one overlapped action (torch's OVERLAP_F_B): adjacent in their
    # rank's program, the forward first; the pair starts when both inputs are in and both outputs
    # leave when it ends (see `overlap_partner`, lowering and the simulator's timing rule)
    overlaps: frozenset[tuple[Action, Action]] = frozenset()
    # disjoint stage chains (DualPipe's two directions): chain c is stages [c L, (c + 1) L), L = stages / chains,
    # and carries microbatches [c m / chains, (c + 1) m / chains); stage s runs model stage s % L, so stages of
    # one model stage in different chains are replicas (the same parameters, gradients summed before the step)
    chains: int = 1

    @property
    def num_stages(self) -> int:
        return len(self.placement)

    @property
    def model_stages(self) -> int:
        """Distinct model stages (layer chunks): the length of one chain."""
        return self.num_stages // max(1, self.chains)

    def model_stage(self, stage: int) -> int:
        """The model stage (layer chunk) schedule stage `stage` runs."""
        return stage % self.model_stages

    def chain_first(self, stage: int) -> bool:
        """True when `stage` takes the data (no stage before it on its microbatches' path)."""
        return stage % self.model_stages == 0

    def chain_last(self, stage: int) -> bool:
        """True when `stage` computes the loss (no stage after it on its microbatches' path)."""
        return stage % self.model_stages == self.model_stages - 1

    def chain_of(self, microbatch: int) -> int:
        """The chain microbatch `microbatch` traverses (contiguous blocks of m / chains)."""
        return microbatch * self.chains // max(1, self.num_microbatches)

    def microbatch_stages(self, microbatch: int) -> range:
        """The stages microbatch `microbatch` visits, in forward order (all of them with one chain)."""
        first = self.chain_of(microbatch) * self.model_stages
        return range(first, first + self.model_stages)

    def visits(self, stage: int, microbatch: int) -> bool:
        return self.chain_of(microbatch) == stage // self.model_stages

    def replicas(self, stage: int) -> tuple[int, ...]:
        """The stages (this one included) that run the same model stage as `stage`."""
        base, n = self.model_stage(stage), self.model_stages
        return tuple(c * n + base for c in range(self.chains))

    @property
    def num_ranks(self) -> int:
        return len(self.programs)

    @property
    def stages_per_rank(self) -> int:
        return self.num_stages // max(1, self.num_ranks)

    def rank_of(self, stage: int) -> int:
        return self.placement[stage]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return tuple(s for s, r in enumerate(self.placement) if r == rank)

    @property
    def split_backward(self) -> bool:
        """True when backward is split into I and W actions (zero-bubble family)."""
        return any(a.kind == Kind.I for prog in self.programs for a in prog)

    def split_pairs(self) -> frozenset[tuple[int, int]]:
        """(stage, microbatch) pairs whose backward is split into I and W."""
        return frozenset((a.stage, a.microbatch) for prog in self.programs for a in prog if a.kind == Kind.I)

    @property
    def has_comms(self) -> bool:
        # kinds read in C (no per-action property call): lowering asks this of ~100k-action schedules
        return any(not COMPUTE.issuperset(map(_kind_of, prog)) for prog in self.programs)

    def compute_only(self) -> Schedule:
        """The same schedule with every SEND/RECV removed."""
        progs = tuple(tuple(a for a in prog if a.is_compute) for prog in self.programs)
        return Schedule(self.name, self.num_microbatches, self.placement, progs, dict(self.meta), self.overlaps,
                        self.chains)

    def with_programs(self, programs: tuple[tuple[Action, ...], ...]) -> Schedule:
        return Schedule(self.name, self.num_microbatches, self.placement, programs, dict(self.meta), self.overlaps,
                        self.chains)

    def overlap_partner(self) -> dict[Action, Action]:
        """Each half of an overlapped pair -> the other half (empty without overlaps)."""
        out: dict[Action, Action] = {}
        for fwd, bwd in self.overlaps:
            out[fwd], out[bwd] = bwd, fwd
        return out

    def overlap_labels(self) -> list[list[str]]:
        """The overlapped pairs as sorted [forward, backward] labels (`["0F3", "3B1"]`), for timelines' meta."""
        return sorted([str(f), str(b)] for f, b in self.overlaps)

    def cells(self, rank: int) -> list[str]:
        """Rank `rank`'s program in torch's notation, an overlapped pair as one `(0F7;7B3)OVERLAP_F_B` cell."""
        prog, out, i = self.programs[rank], [], 0
        while i < len(prog):
            if i + 1 < len(prog) and (prog[i], prog[i + 1]) in self.overlaps:
                out.append(overlap_cell(prog[i], prog[i + 1]))
                i += 2
                continue
            out.append(str(prog[i]))
            i += 1
        return out

    def num_actions(self) -> int:
        return sum(len(p) for p in self.programs)

    def to_dict(self) -> dict:
        """JSON-friendly form: torch notation strings per rank (`chains` only when there are several)."""
        out = {
            "name": self.name,
            "num_ranks": self.num_ranks,
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "placement": list(self.placement),
            "programs": [self.cells(r) for r in range(self.num_ranks)],
        }
        if self.chains > 1:
            out["chains"] = self.chains
        return out


def actions_for(stage: int, kind: Kind, microbatches: Iterable[int]) -> tuple[Action, ...]:
    """`Action(stage, kind, mb)` for each of `microbatches`, in order, built in C (no per-action Python call).

    GPipe p=64, m=1024 is 131k actions: the NamedTuple's Python-level `__new__` was most of its build time.
    """
    return tuple(map(tuple.__new__, repeat(Action), zip(repeat(stage), repeat(kind), microbatches)))


def overlap_cell(forward: Action, backward: Action) -> str:
    """torch's spelling of an overlapped forward + backward: `(0F7;7B3)OVERLAP_F_B`."""
    return f"({forward};{backward})OVERLAP_F_B"


def overlapped(schedule: Schedule, pairs: set[tuple[Action, Action]]) -> Schedule:
    """`schedule` with `pairs` (forward, backward) marked as overlapped actions."""
    return Schedule(schedule.name, schedule.num_microbatches, schedule.placement, schedule.programs,
                    dict(schedule.meta), frozenset(pairs), schedule.chains)


def loop_placement(num_ranks: int, chunks: int) -> tuple[int, ...]:
    """Megatron's looped placement: stage c*p + r lives on rank r."""
    return tuple(s % num_ranks for s in range(num_ranks * chunks))


def v_placement(num_ranks: int) -> tuple[int, ...]:
    """V-shaped placement (ZB-V, DualPipeV): rank r holds stages r and 2p - 1 - r."""
    return tuple(list(range(num_ranks)) + list(range(num_ranks - 1, -1, -1)))
