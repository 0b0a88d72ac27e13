"""The planner's search space: every (schedule, p, v, t, d, microbatch size, recompute, zero) that divides
the model, the batch and the cluster, found by exact arithmetic before anything is costed.

Rules (cp = 1 this round): t x p x d == GPUs; t divides the GPUs of a node (tensor parallelism stays on
NVLink) and the heads and hidden size (and kv heads); layers split evenly over p x v chunks; the global
batch splits into d replicas x m microbatches of mbs sequences; ZeRO only with d > 1. With p = 1 every
schedule is the same single stage, so only 1f1b is kept. When nothing is left, `NoLayout` names the
constraint that removed the last survivors.
"""

from __future__ import annotations

from dataclasses import dataclass

import schedules
from pipesim.errors import PipesimError
from pipesim.hardware import Hardware
from pipesim.model.config import ModelConfig

VIRTUALS = (2, 3, 4)  # chunks per rank tried for schedules that take --virtual
MAX_STAGE_MICROBATCHES = 1 << 20  # p x v x m above this is not built (the simulate command's own bound)
RECOMPUTES = ("none", "selective", "full")
ZEROS = (0, 1)


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for: the model (its batch and seq are the step's), the cluster, the constraints."""

    model: ModelConfig
    hardware: Hardware  # already joined to the right number of nodes
    gpus: int  # GPUs the plan must fill exactly (t x p x d)
    schedules: tuple[str, ...] = ()  # empty: every registered schedule
    max_tp: int | None = None  # None: the GPUs of one node
    recomputes: tuple[str, ...] = RECOMPUTES
    zeros: tuple[int, ...] = ZEROS

    @property
    def schedule_names(self) -> tuple[str, ...]:
        return self.schedules or tuple(schedules.names())


@dataclass(frozen=True, order=True)
class Candidate:
    """One parallel configuration (cp = 1; sequence parallelism whenever t > 1)."""

    schedule: str
    p: int  # pipeline ranks
    v: int  # chunks per rank
    t: int  # tensor-parallel ranks
    d: int  # data-parallel replicas
    mbs: int  # sequences per microbatch
    m: int  # microbatches per step on each replica
    recompute: str
    zero: int

    @property
    def sp(self) -> bool:
        return self.t > 1

    @property
    def schedule_key(self) -> tuple[str, int, int, int]:
        """Configurations sharing this share one built schedule."""
        return (self.schedule, self.p, self.m, self.v)

    def label(self) -> str:
        v = f" v{self.v}" if self.v > 1 else ""
        return (f"{self.schedule} p{self.p}{v} t{self.t} d{self.d} mbs{self.mbs} m{self.m} "
                f"rc={self.recompute} zero{self.zero}")


class NoLayout(PipesimError):
    """No configuration passes the arithmetic; the message names the tightest constraint."""


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _tp_ok(model: ModelConfig, t: int) -> bool:
    kv = model.kv_heads or model.heads
    return model.hidden % t == 0 and model.heads % t == 0 and kv % t == 0


def layouts(req: PlanRequest) -> list[tuple[int, int, int]]:
    """(t, p, d) filling the cluster, t inside a node and dividing the heads (t = 1 always qualifies)."""
    node, model, g = req.hardware.devices_per_node, req.model, req.gpus
    max_tp = min(node, req.max_tp or node)
    tps = [t for t in divisors(node) if t <= max_tp and g % t == 0 and _tp_ok(model, t)]
    return [(t, p, g // (t * p)) for t in tps for p in divisors(g // t)]


def virtuals(name: str, p: int, layers: int) -> list[int]:
    """Chunks per rank to try: 1 for a plain schedule, VIRTUALS for one that takes --virtual (p > 1)."""
    if not schedules.spec(name).virtual:
        return [1]
    return [v for v in VIRTUALS if p > 1 and layers % (p * v) == 0]


def enumerate_candidates(req: PlanRequest) -> list[Candidate]:
    """Every candidate passing the arithmetic, sorted; NoLayout naming the constraint that emptied the set."""
    model = req.model
    for name in req.schedule_names:
        schedules.spec(name)  # unknown name: one line
    triples = layouts(req)
    by_batch = [(t, p, d) for t, p, d in triples if model.layers % p == 0 and model.batch % d == 0]
    if not by_batch:
        if not any(model.layers % p == 0 for _, p, _ in triples):  # (unreachable while p = 1 is a layout)
            raise NoLayout(f"--layers {model.layers} splits evenly over none of the pipeline sizes "
                           f"{sorted({p for _, p, _ in triples})}")
        ds = sorted({d for _, p, d in triples if model.layers % p == 0})
        raise NoLayout(f"--batch {model.batch} splits over none of the data-parallel sizes {ds} left by "
                       f"{req.gpus} GPUs and --layers {model.layers} (pp must divide the layers)")
    out: list[Candidate] = []
    too_big = 0
    for t, p, d in by_batch:
        names = [n for n in req.schedule_names if p > 1 or n == "1f1b"] or ["1f1b"]
        zeros = sorted({z if d > 1 else 0 for z in req.zeros})
        for mbs in divisors(model.batch // d):
            m = model.batch // (d * mbs)
            for name in names:
                for v in virtuals(name, p, model.layers):
                    if p * v * m > MAX_STAGE_MICROBATCHES:
                        too_big += 1
                        continue
                    out.extend(Candidate(name, p, v, t, d, mbs, m, rc, z) for rc in req.recomputes for z in zeros)
    if not out:
        raise NoLayout(f"every layout needs more than {MAX_STAGE_MICROBATCHES} stage-microbatches "
                       f"({too_big} refused); use a larger --batch per microbatch or fewer GPUs")
    return sorted(out)


__all__ = ["Candidate", "NoLayout", "PlanRequest", "RECOMPUTES", "ZEROS", "divisors", "enumerate_candidates",
           "layouts"]
