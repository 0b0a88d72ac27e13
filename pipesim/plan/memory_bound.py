"""A cheap, exact-arithmetic lower bound on a candidate's peak memory per GPU, before any schedule is built.

bound = max(the fullest rank's model state, rank 0's model state + its in-flight activations) + buffers,
where the model state is what `pipesim.cost.rank_memory` counts (parameters of the chunks a rank holds, per ZeRO
stage, `step_peak_state`) and rank 0's in-flight count is the schedule family's closed form below, a lower
bound on the chunk-microbatches rank 0 stashes at its peak, times the smallest stash of its chunks (with
context parallelism each rank stashes seq / cp tokens: the layer options carry cp). A
candidate over device memory by this bound is over by `rank_memory` too (tests/test_plan_speed.py checks
bound <= exact on every registered schedule), so it is dropped without costing or building a schedule.
"""

from __future__ import annotations

from collections.abc import Callable

from pipesim.cost.model_costs import precision_of
from pipesim.cost.muon_step import muon_state_bytes
from pipesim.cost.stage_work import gpt_stage_work
from pipesim.job import Job
from pipesim.model.activations import stage_activation_bytes
from pipesim.model.config import ModelConfig, split_layers
from pipesim.model.fsdp import fsdp_units, resident_fraction
from pipesim.model.layer_kinds import StageLayers, stage_layers
from pipesim.model.memory import comm_buffer_bytes, named_precision, step_peak_state
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import stage_params
from pipesim.model.weight_tensors import split_tensors
from pipesim.plan.space import chunks_per_rank

# rank r holds stages r, r + p, ...
LOOPED = frozenset({"interleaved-1f1b", "combined-1f1b", "interleaved-zb", "looped-bfs"})
V_SHAPED = frozenset({"zb-v", "v-half", "v-min", "dualpipev"})  # rank r holds stages r and 2p - 1 - r
MIRRORED = frozenset({"dualpipe"})  # two directions: rank r runs replicas of model chunks r and p - 1 - r


def first_rank_inflight(name: str, p: int, m: int, v: int) -> int:
    """A lower bound on the chunk-microbatches rank 0 holds stashed at its peak (each family's closed form).

    1F1B and the ZB-H1-like orders: min(p, m) (Narayanan et al. 2021); GPipe: all m; looped BFS: all m x v;
    ZB-H2: 2p; Megatron's interleaved 1F1B: its warm-up (v - 1) p + 2 (p - 1) plus the steady state's one (combined
    1F1B: one more); interleaved
    zero bubble: min(m v, p v); V-shaped: two chunks per warm-up microbatch, up to 2p (ZB-V), p // 2 + 1 (V-Min);
    V-Half: m + 1 up to p + 1. Anything
    else: one (every schedule stashes the microbatch of its first forward).
    """
    if name == "naive":
        return 1
    if name == "gpipe":
        return m
    if name == "looped-bfs":
        return m * v
    if name == "zb-h2":
        return min(m, 2 * p)  # Qi et al. 2024: twice 1F1B's warm-up
    if name in ("1f1b", "zb-h1", "zb-2p", "zb-auto"):  # (zb-2p / zb-auto: reordered for the costs; 1F1B's bound)
        return min(p, m)
    if name == "interleaved-1f1b":
        return min(m * v, (v - 1) * p + 2 * (p - 1) + 1)
    if name == "combined-1f1b":  # one more warm-up forward (Megatron-core's A2A overlap)
        return min(m * v, (v - 1) * p + 2 * (p - 1) + 2)
    if name == "interleaved-zb":
        return min(m * v, p * v)
    if name in ("zb-v", "dualpipev"):
        return min(2 * m, 2 * p)
    if name == "v-half":  # Qi et al.'s building blocks: the first microbatch's two chunks, then one more each
        return min(m + 1, p + 1)  # (built: m + 1 up to p + 2 for even p, p + 1 for odd p, p <= 8)
    if name == "v-min":
        return min(2 * m, p // 2 + 1)
    return 1


def placement_family(name: str, k: int) -> str | None:
    """How `name` places its k chunks per rank: "plain" (k = 1), "looped", "v", "mirror"; None when not listed."""
    if name in MIRRORED and k == 1:
        return "mirror"
    if k == 1:
        return "plain"
    if name in LOOPED:
        return "looped"
    if name in V_SHAPED and k == 2:
        return "v"
    return None


def family_chunks(family: str | None, p: int, v: int) -> list[list[int]] | None:
    """The model chunks each rank holds under a placement family (None: unknown); "mirror" lists a rank's two
    replicas (the middle rank of an odd p holds its chunk twice)."""
    if family == "mirror":
        return [[r, p - 1 - r] for r in range(p)]
    if family == "plain":
        return [[r] for r in range(p)]
    if family == "looped":
        return [[r + k * p for k in range(v)] for r in range(p)]
    if family == "v":
        return [[r, 2 * p - 1 - r] for r in range(p)]
    return None


def rank_chunks(name: str, p: int, v: int) -> list[list[int]] | None:
    """The chunks each rank holds, by the family's placement; None for a schedule not listed here."""
    k = chunks_per_rank(name, v)
    return family_chunks(placement_family(name, k), p, k)


def chunk_params(model: ModelConfig, chunks: int, t: int, split: list[int] | None = None) -> tuple[int, ...]:
    """Parameters per chunk on one tp rank, cut as model_costs cuts (`split`, default split_layers; empty ends
    allowed)."""
    split = split or split_layers(model.layers, chunks)
    return tuple(stage_params(model, t, layers=n, first=s == 0, last=s == chunks - 1) for s, n in enumerate(split))


def moe_chunk_params(model: ModelConfig, chunks: int, opts: LayerOptions,
                     split: list[int] | None = None) -> tuple[tuple[int, int], ...]:
    """A mixture-of-experts model's (parameters, of which the routed experts') per chunk on one rank, exactly as
    model_costs counts them (`gpt_stage_work`: each chunk's MoE layers, the experts sharded over ep and etp)."""
    split = split or split_layers(model.layers, chunks)
    out = []
    for s, mix in enumerate(stage_layers(model, split)):
        work = gpt_stage_work(model, 1, mix, first=s == 0, last=s == chunks - 1, opts=opts)
        out.append((round(work.param_count), round(work.expert_params)))
    return tuple(out)


def muon_deal_key(c, dims) -> tuple:
    """What a candidate's Muon deal (pipesim.cost.muon_step) depends on: its chunks, tp, the dense and expert
    data-parallel ranks, ep and etp; the planner's Muon caches key on it."""
    return c.chunks, c.tp, dims.dp_cp, dims.edp, c.ep, c.etp


class MemoryBound:
    """`bound(c)` for the candidates of one model and attention kernel; every piece cached by what it depends on
    (model state by placement, p, v, t, d, ZeRO, not cp: every cp rank holds the same parameters; rank 0's stash
    by placement, p, v, mbs and the layer options, cp included)."""

    def __init__(self, model: ModelConfig, shared: Job, split: Callable[[int], list[int]] | None = None) -> None:
        """`shared`: what every candidate's Job shares (the request's `shared_job`: attention decided); `split`:
        layers per chunk for a number of chunks (the request's `stage_split`; default split_layers)."""
        self.model, self.shared = model, shared
        self.split = split or (lambda chunks: split_layers(model.layers, chunks))
        self.precision = named_precision(precision_of(model, shared.kernels.grad_fp32, shared.adam_states,
                                                      shared.fp8))
        self._params: dict[tuple, tuple[int, ...]] = {}
        self._moe_params: dict[tuple, tuple[tuple[int, int], ...]] = {}
        self._states: dict[tuple, tuple[int, int]] = {}
        self._stash: dict[tuple, int] = {}
        self._buffers: dict[tuple, int] = {}
        self._muon: dict[tuple, tuple[int, ...]] = {}
        self._checked: set[LayerOptions] = set()

    def params(self, chunks: int, t: int) -> tuple[int, ...]:
        key = (chunks, t)
        if key not in self._params:
            self._params[key] = chunk_params(self.model, chunks, t, self.split(chunks))
        return self._params[key]

    def moe_params(self, chunks: int, opts: LayerOptions) -> tuple[tuple[int, int], ...]:
        """`moe_chunk_params`, cached by what parameters depend on (chunks, tp, ep, etp)."""
        key = (chunks, opts.tp, opts.ep, opts.etp)
        if key not in self._moe_params:
            self._moe_params[key] = moe_chunk_params(self.model, chunks, opts, self.split(chunks))
        return self._moe_params[key]

    def options(self, c) -> LayerOptions:
        """`c`'s layer options (its Job's), checked against the model once per distinct options."""
        opts = c.job(self.shared).layer_options(self.model)
        if opts not in self._checked:
            opts.check(self.model)
            self._checked.add(opts)
        if self.shared.bf16_layers is not None:  # Megatron-core's bound: each count at most the layers per rank
            self.shared.bf16_layers.check(self.model, c.p)
        return opts

    def states(self, family: str | None, c, opts: LayerOptions) -> tuple[int, int]:
        """(the fullest rank's model state, rank 0's) in bytes; unknown placement: the smallest chunk's, twice.
        A mixture of experts' routed experts are sharded over the expert-data-parallel group (rank_memory's)."""
        key = (family, c.p, c.v, c.tp, c.dp, c.zero, c.cp, c.ep, c.etp)
        if key not in self._states:
            if self.model.moe is None and self.model.hybrid is None and self.model.linear_attention is None:
                params, experts = self.params(c.chunks, c.tp), (0,) * c.chunks
            else:
                both = self.moe_params(c.chunks, opts)
                params, experts = tuple(p for p, _ in both), tuple(e for _, e in both)
            job = c.job(self.shared)
            edp, policy = job.dims.edp, job.fsdp
            held = family_chunks(family, c.p, c.k) or [[min(range(c.chunks), key=lambda s: params[s])]]
            split = self.split(c.chunks)
            states = []
            for ids in held:
                total, routed = sum(params[s] for s in ids), sum(experts[s] for s in ids)
                units = sum(fsdp_units(split[s], first=s == 0, last=s == c.chunks - 1) for s in ids)  # rank_memory's
                resident = resident_fraction(policy, units) if policy is not None else 1.0
                parts = [step_peak_state(total - routed, dp=c.dp * c.cp, zero=c.zero,  # dense: over dp x cp
                                         precision=self.precision, resident=resident)]
                if routed:
                    parts.append(step_peak_state(routed, dp=edp, zero=c.zero, precision=self.precision,
                                                 resident=resident))
                state = sum(part.total for part in parts)
                if self.shared.muon is not None:  # Muon's states in place of Adam's (rank_memory's)
                    state += sum(self.muon_states(c, opts)[s] for s in ids) - sum(p.optimizer_states for p in parts)
                states.append(state)
            self._states[key] = (max(states), states[0])
        return self._states[key]

    def muon_states(self, c, opts: LayerOptions) -> tuple[int, ...]:
        """Bytes per chunk: Muon's optimizer state on the chunk's fullest rank (model_costs' `muon_state_bytes`, the
        dist_muon deal over dp x cp and the expert-data-parallel ranks), cached by what the deal depends on."""
        dims = c.job(self.shared).dims
        key = muon_deal_key(c, dims)
        if key not in self._muon:
            split = self.split(c.chunks)
            self._muon[key] = tuple(
                muon_state_bytes(tensors, self.model, c.tp, self.shared.muon, dp=dims.dp_cp, edp=dims.edp,
                                 precision=self.precision)
                for tensors in split_tensors(self.model, opts, split))
        return self._muon[key]

    def first_stash(self, family: str | None, c, opts: LayerOptions) -> int:
        """The smallest per-microbatch stash among rank 0's chunks (any chunk when the placement is unknown)."""
        key = (family, c.p, c.v, c.mbs, c.tp, c.sp, c.recompute, c.cp, c.ep, c.etp)
        if key not in self._stash:
            chunks = c.chunks
            split = self.split(chunks)
            held = family_chunks(family, c.p, c.k)
            ids = held[0] if held else range(chunks)
            self._stash[key] = min(stage_activation_bytes(
                self.model, c.mbs, opts, StageLayers.of(self.model, sum(split[:s]), split[s]), first=s == 0,
                last=s == chunks - 1) for s in ids)
        return self._stash[key]

    def buffers(self, c, opts: LayerOptions) -> int:
        key = (c.mbs, c.tp, c.sp, c.recompute, c.cp, c.dp, c.zero)
        if key not in self._buffers:
            self._buffers[key] = comm_buffer_bytes(self.model, c.mbs, opts, dp=c.dp * c.cp, zero=c.zero,
                                                   precision=self.precision)
        return self._buffers[key]

    def bound(self, c) -> int:
        """Bytes: a lower bound on `c`'s peak memory on its fullest GPU (pipesim.cost.rank_memory's figure)."""
        opts = self.options(c)
        family = placement_family(c.schedule, c.k)
        fullest, first = self.states(family, c, opts)
        stash = first_rank_inflight(c.schedule, c.p, c.m, c.v) * self.first_stash(family, c, opts)
        return max(fullest, first + stash) + self.buffers(c, opts)


__all__ = ["LOOPED", "MIRRORED", "V_SHAPED", "MemoryBound", "chunk_params", "family_chunks", "first_rank_inflight",
           "moe_chunk_params", "muon_deal_key", "placement_family", "rank_chunks"]
