"""The planner's search space: every (schedule, p, v, tp, cp, dp, microbatch size, recompute, zero) that divides
the model, the batch and the cluster, found by exact arithmetic before anything is costed.

Rules: tp x cp x p x dp == GPUs; tp divides the GPUs of a node (tensor parallelism stays on NVLink) and the heads
and hidden size (and kv heads); cp is one of the request's `cps` that `LayerOptions.check` admits (flash
attention, a sequence divisible by 2 cp), and tp x cp may cross nodes (ring attention's hops overlap the
attention blocks; Llama 3 405B's 128k-token phase ran tp 8 x cp 16 on 8-GPU nodes); the layers go over p x v
chunks, evenly or (with `uneven`, the default) as `split_layers` splits them (earlier chunks take the
remainder; p x v at most the layers); the global batch splits into dp replicas x m microbatches of mbs
sequences; ZeRO only with dp > 1; sequence parallelism on, off or both when tp > 1 (`sequence_parallel`).
A candidate's options are a Job (`Candidate.job`): the request's shared ones with the candidate's layout.
With p = 1 every schedule is the same single stage, so only 1f1b is kept. When nothing is left, `NoLayout`
names the constraint that removed the last survivors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

import schedules
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.job import Job, gathers_parameters
from pipesim.model.config import ModelConfig, split_layers
from pipesim.model.op_recompute import OP, check_op_recompute
from pipesim.model.options import LayerOptions
from pipesim.model.pipeline_split import BalancedSplit, SplitRule
from pipesim.parallel_dims import ParallelDims
from pipesim.plan.stack_space import RECOMPUTES, ZEROS
from pipesim.sim.sim_setup import on_gpus

VIRTUALS = (2, 3, 4)  # chunks per rank tried for schedules that take --virtual
MAX_STAGE_MICROBATCHES = 1 << 20  # p x v x m above this is not built (the simulate command's own bound)


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for: the model (its batch and seq are the step's), the cluster, the constraints."""

    model: ModelConfig
    hardware: Hardware  # already joined to the right number of nodes
    gpus: int  # GPUs the plan must fill exactly (tp x cp x p x dp)
    schedules: tuple[str, ...] = ()  # empty: every registered schedule
    max_tp: int | None = None  # None: the GPUs of one node
    recomputes: tuple[str, ...] = RECOMPUTES
    zeros: tuple[int, ...] = ZEROS
    # what every candidate shares: attention (None: SimSetup's default), comm options (as simulate's flags), the
    # main gradients' dtype; its layout, recompute, sp and zero are each candidate's (`Candidate.job`)
    job: Job = Job()
    sequence_parallel: tuple[bool, ...] = (True,)  # choices when tp > 1 (Megatron's practice: on)
    uneven: bool = True  # p x v need not divide the layers (split_layers' remainder split)
    cps: tuple[int, ...] = (1,)  # context-parallel sizes to try (default none: today's plans unchanged)
    # what "selective" recomputes in this plan: Megatron-core's --recompute-modules (() its default, core_attn)
    recompute_modules: tuple[str, ...] = ()
    framework: str | None = None  # the stack planned for (its space: pipesim.plan.stack_space; its exports only)
    # how every candidate cuts its layers (placement-free; unset: even); BalancedSplit: `plan --balance-layers`
    split_rule: SplitRule | BalancedSplit = SplitRule()

    def stage_split(self, chunks: int) -> list[int]:
        """Layers per chunk as the candidates' costs cut them: the split rule's (PipesimError where it cannot
        split `chunks`), else the even split."""
        return self.split_rule.split(self.model.layers, chunks) or split_layers(self.model.layers, chunks)

    @property
    def schedule_names(self) -> tuple[str, ...]:
        return self.schedules or tuple(schedules.names())

    @property
    def shared_job(self) -> Job:
        """The options every candidate shares, its attention kernel decided as `pipesim simulate` decides it."""
        return self.job.resolve_attention(on_gpus(self.hardware), self.model)


@dataclass(frozen=True, order=True)
class Candidate:
    """One parallel configuration."""

    schedule: str
    p: int  # pipeline ranks
    v: int  # chunks per rank
    tp: int  # tensor-parallel ranks
    dp: int  # data-parallel replicas
    mbs: int  # sequences per microbatch
    m: int  # microbatches per step on each replica
    recompute: str
    zero: int
    sp: bool = False  # sequence parallelism (only with tp > 1)
    cp: int = 1  # context-parallel ranks (each holds seq / cp tokens of every sequence)
    ep: int = 1  # expert-parallel ranks (a mixture-of-experts model)
    etp: int = 0  # tensor parallelism inside each expert; 0: tp (Megatron-core's default, and a dense model's)
    modules: tuple[str, ...] = ()  # with recompute "selective": its --recompute-modules (() core_attn alone)

    def job(self, shared: Job) -> Job:
        """This candidate's Job: its layout, recompute, sp and ZeRO over the request's `shared_job` (the one
        place a candidate's fields become options)."""
        dims = ParallelDims(pp=self.p, dp=self.dp, tp=self.tp, cp=self.cp, ep=self.ep, etp=self.etp or None)
        comm = shared.comm
        if comm.overlap_param_gather and not gathers_parameters(self.zero, shared.muon):  # only those gathers overlap
            comm = replace(comm, overlap_param_gather=False)
        reshard = shared.fsdp_reshard if self.zero == 3 else "default"  # FSDP2's policy: sharded parameters only
        torchao = shared.fp8 is not None and shared.fp8.impl == "torchao"  # FSDP2's float8 gather, not the optimizer's
        fp8_gather = shared.fp8_param_gather and self.zero in ((3,) if torchao else (1, 2))
        adam = shared.adam_states if self.zero in (1, 2) else None  # the precision-aware optimizer: likewise
        modules = self.modules if self.recompute == "selective" else ()
        kernels = shared.kernels
        if kernels.ub is not None and (self.tp == 1 or not self.sp):  # userbuffers ride on sp's collectives only
            kernels = replace(kernels, ub=None)
        return replace(shared, dims=dims, recompute=self.recompute, sp=self.sp, zero=self.zero, comm=comm,
                       recompute_modules=modules, kernels=kernels, fsdp_reshard=reshard, fp8_param_gather=fp8_gather,
                       adam_states=adam)

    @property
    def k(self) -> int:
        """Model chunks per rank: v, or what the schedule's model_stages say."""
        return chunks_per_rank(self.schedule, self.v)

    @property
    def chunks(self) -> int:
        """Pipeline stages (chunks) of the model: p x k."""
        return self.p * self.k

    @property
    def schedule_key(self) -> tuple[str, int, int, int]:
        """Configurations sharing this share one built schedule."""
        return (self.schedule, self.p, self.m, self.v)

    def label(self) -> str:
        v = f" v{self.v}" if self.v > 1 else ""
        sp = " sp" if self.sp else (" nosp" if self.tp > 1 else "")
        cp = f" cp{self.cp}" if self.cp > 1 else ""
        ep = f" ep{self.ep}" if self.ep > 1 or self.etp else ""
        etp = f" etp{self.etp}" if self.etp else ""
        return (f"{self.schedule} p{self.p}{v} t{self.tp}{sp}{cp}{ep}{etp} d{self.dp} mbs{self.mbs} m{self.m} "
                f"rc={self.recompute}{'(' + '+'.join(self.modules) + ')' if self.modules else ''} zero{self.zero}")


@cache
def chunks_per_rank(name: str, v: int) -> int:
    """Model chunks per rank of `name` with v (the model is cut into p x this): v, as a small build (p 2, m 8)
    says (`model_stages`: DualPipe's two directions run replicas of p chunks); v when the builder refuses it."""
    try:
        return schedules.build(name, 2, 8, v).model_stages // 2
    except PipesimError:
        return v


class NoLayout(PipesimError):
    """No configuration passes the arithmetic; the message names the tightest constraint."""


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _tp_ok(model: ModelConfig, t: int) -> bool:
    kv = model.kv_heads or model.heads
    return model.hidden % t == 0 and model.heads % t == 0 and kv % t == 0


def cp_refusal(req: PlanRequest, cp: int, tp: int = 1) -> str | None:
    """Why the model layer refuses context parallelism `cp` at tensor parallelism `tp` (LayerOptions.check's line:
    a2a also splits each tp rank's heads over cp), None when it admits it."""
    try:
        LayerOptions(tp=tp, cp=cp, attention=req.shared_job.attention_kernel,
                     cp_comm=req.shared_job.cp_comm).check(req.model)
    except PipesimError as exc:
        return str(exc)
    return None


def op_refusal(req: PlanRequest, tp: int, cp: int) -> str | None:
    """Why torchtitan's per-op checkpointing is not modelled at (tp, cp) for this model and kernels
    (pipesim.model.op_recompute), None when it is."""
    job = req.shared_job
    try:
        check_op_recompute(req.model, tp=tp, cp=cp, attention=job.attention_kernel)
    except PipesimError as exc:
        return str(exc)
    return None


def layouts(req: PlanRequest) -> list[tuple[int, int, int, int]]:
    """(t, cp, p, d) filling the cluster: t inside a node and dividing the heads (t = 1 always qualifies), cp
    one of the request's that the model layer admits (cp x t may cross nodes)."""
    node, model, g = req.hardware.devices_per_node, req.model, req.gpus
    max_tp = min(node, req.max_tp or node)
    tps = [t for t in divisors(node) if t <= max_tp and g % t == 0 and _tp_ok(model, t)]
    cps = sorted({cp for cp in req.cps if cp == 1 or cp_refusal(req, cp) is None})
    heads_split = req.shared_job.cp_comm == "a2a"  # Ulysses: each (t, cp) pair must split the heads
    return [(t, cp, p, g // (t * cp * p)) for t in tps for cp in cps if (g // t) % cp == 0
            and not (heads_split and cp > 1 and cp_refusal(req, cp, t) is not None)
            for p in divisors(g // (t * cp))]


# what a schedule's builder refuses, by arithmetic on (p, m, v) (the builders' own checks, asked before building)
ADMITS = {
    "interleaved-1f1b": lambda p, m, v: m % p == 0,  # Megatron: microbatches a multiple of the stages
    "combined-1f1b": lambda p, m, v: m % p == 0,
    "interleaved-zb": lambda p, m, v: m % max(1, m // p) == 0,  # whole rounds
    "dualpipev": lambda p, m, v: m >= 2 * p and v == 2,
    "dualpipe": lambda p, m, v: p % 2 == 0 and m % 2 == 0 and m >= 2 * p,  # two chains of p, m / 2 each way
    "zb-v": lambda p, m, v: v == 2,
    "v-half": lambda p, m, v: v == 2,
    "v-min": lambda p, m, v: v == 2,
}


# schedules Megatron-core runs only with experts sharded and without full recomputation (its A2A overlap asserts
# expert_model_parallel_size > 1 and recompute_granularity != "full": megatron/core/transformer/transformer_config.py)
NEEDS_EP = frozenset({"combined-1f1b"})

# zb-auto / zb-2p are reordered for each candidate's costs by a search whose time grows steeply with p
# (measured on the 2-core machine: p 8, m 64: 1.0 s; p 16, m 32: 5.9 s): the planner tries them up to p = 8
MAX_AUTO_STAGES = 8
AUTO_NAMES = ("zb-auto", "zb-2p")


def admits(name: str, p: int, m: int, v: int) -> bool:
    """False when `name`'s builder refuses (p, m, v) by its own arithmetic, or (zb-auto / zb-2p) p is above
    MAX_AUTO_STAGES; True when unknown (the builder decides)."""
    if name in AUTO_NAMES and p > MAX_AUTO_STAGES:
        return False
    rule = ADMITS.get(name)
    return rule is None or rule(p, m, v)


def splits(layers: int, chunks: int, uneven: bool) -> bool:
    """The layers go over `chunks` chunks: evenly, or (uneven) at least one layer each."""
    return chunks <= layers if uneven else layers % chunks == 0


def virtuals(name: str, p: int, layers: int, uneven: bool = False) -> list[int]:
    """Chunks per rank to try: 1 for a plain schedule, VIRTUALS for one that takes --virtual (p > 1)."""
    if not schedules.spec(name).virtual:
        return [1] if splits(layers, p * chunks_per_rank(name, 1), uneven) else []
    return [v for v in VIRTUALS if p > 1 and splits(layers, p * v, uneven)]


def expert_layouts(model: ModelConfig, t: int, cp: int, d: int, sp: bool) -> list[tuple[int, int]]:
    """(ep, etp) to try for a mixture-of-experts model on a (t, cp, d) stage: ep any divisor of the experts and
    etp tp (Megatron-core's default: 0) or 1, where ep x etp divides t cp d, etp the expert width, and the
    layer options admit them (expert parallelism with tp needs sp; without sp the experts split as the MLP);
    a dense model: [(1, 0)]."""
    if model.moe is None:
        return [(1, 0)]
    out = []
    for ep in divisors(model.moe.experts):
        for etp in ((0, 1) if t > 1 else (0,)):
            width = etp or t
            if (t * cp * d) % (ep * width) or model.moe.expert_ffn % width:
                continue
            if t > 1 and ((ep > 1 and not sp) or (not sp and width != t)):
                continue
            out.append((ep, etp))
    return out


def enumerate_candidates(req: PlanRequest) -> list[Candidate]:
    """Every candidate passing the arithmetic, sorted; NoLayout naming the constraint that emptied the set."""
    model = req.model
    for name in req.schedule_names:
        schedules.spec(name)  # unknown name: one line
    grids = layouts(req)
    if not grids:  # every --cp refused by the model layer, or dividing none of the GPUs left by t
        cps = sorted(set(req.cps))
        refusals = [r for r in (cp_refusal(req, cp) for cp in cps if cp > 1) if r]
        raise NoLayout(refusals[0] if refusals else f"--cp {','.join(map(str, cps))} divides none of the "
                       f"{req.gpus} GPUs left by the tensor-parallel sizes")
    fit = [(t, cp, p, d) for t, cp, p, d in grids if splits(model.layers, p, req.uneven)]
    by_batch = [(t, cp, p, d) for t, cp, p, d in fit if model.batch % d == 0]
    if not by_batch:
        if not fit:  # (unreachable while p = 1 is a layout)
            raise NoLayout(f"--layers {model.layers} splits over none of the pipeline sizes "
                           f"{sorted({p for _, _, p, _ in grids})}")
        ds = sorted({d for _, _, _, d in fit})
        rule = "at most the layers" if req.uneven else "must divide the layers"
        raise NoLayout(f"--batch {model.batch} splits over none of the data-parallel sizes {ds} left by "
                       f"{req.gpus} GPUs and --layers {model.layers} (pp {rule})")
    out: list[Candidate] = []
    too_big = 0
    op_refused = [r for t, cp, _, _ in by_batch if OP in req.recomputes and (r := op_refusal(req, t, cp))]
    if req.recomputes == (OP,) and len(op_refused) == len(by_batch):
        raise NoLayout(op_refused[0])
    for t, cp, p, d in by_batch:
        names = [n for n in req.schedule_names if p > 1 or n == "1f1b"] or ["1f1b"]
        zeros = sorted({z if d > 1 else 0 for z in req.zeros})
        recomputes = [rc for rc in req.recomputes if rc != OP or op_refusal(req, t, cp) is None]
        sps = sorted(set(req.sequence_parallel)) if t > 1 else [False]
        for mbs in divisors(model.batch // d):
            m = model.batch // (d * mbs)
            for name in names:
                for v in virtuals(name, p, model.layers, req.uneven):
                    if not admits(name, p, m, v):
                        continue
                    if p * chunks_per_rank(name, v) * m > MAX_STAGE_MICROBATCHES:
                        too_big += 1
                        continue
                    out.extend(Candidate(name, p, v, t, d, mbs, m, rc, z, sp, cp, ep, etp,
                                         req.recompute_modules if rc == "selective" else ())
                               for rc in recomputes for z in zeros for sp in sps
                               for ep, etp in expert_layouts(model, t, cp, d, sp)
                               if name not in NEEDS_EP or (ep > 1 and rc != "full"))
    if not out:
        raise NoLayout(f"every layout needs more than {MAX_STAGE_MICROBATCHES} stage-microbatches "
                       f"({too_big} refused); use a larger --batch per microbatch or fewer GPUs")
    return sorted(out)


__all__ = ["Candidate", "NoLayout", "PlanRequest", "cp_refusal", "divisors", "enumerate_candidates",
           "expert_layouts", "layouts", "op_refusal"]
