"""From a model and a machine to per-stage seconds: FLOPs and bytes per layer, roofline per action.

Each stage is a list of pieces (MLP layers; or embedding, transformer blocks, head). A piece knows
its FLOPs for F, I (gradient wrt input) and W (gradient wrt weights), the bytes it moves, what it
stashes for backward and its parameters. Tensor parallelism (Megatron) divides compute and most
activations by tp and adds blocking all_reduces inside F and I; see docs/cost_model.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipesim.costs import CostTable, StageCosts
from pipesim.errors import PipesimError
from pipesim.hardware import Hardware
from pipesim.model.config import ModelConfig, split_layers

GiB = 2**30
MLP_LAYER_OPS = (2, 2, 1)  # framework ops of one MLP layer in F, I, W
OPTIMIZER_BYTES_PER_PARAM = 16  # bytes: param + grad + Adam (mixed precision: 2 + 2 + 4 master + 4 m + 4 v)


@dataclass
class Work:
    """FLOPs, bytes moved and collectives of one microbatch through (part of) a stage, on one device."""

    flops: dict[str, float] = field(default_factory=lambda: {"F": 0.0, "I": 0.0, "W": 0.0})  # FLOPs
    moved: dict[str, float] = field(default_factory=lambda: {"F": 0.0, "I": 0.0, "W": 0.0})  # bytes (HBM)
    ops: dict[str, float] = field(default_factory=lambda: {"F": 0.0, "I": 0.0, "W": 0.0})  # framework ops
    activation_bytes: float = 0.0  # bytes stashed until backward
    param_count: float = 0.0  # parameters held on this device
    collectives: dict[str, list[tuple[str, int]]] = field(default_factory=lambda: {"F": [], "I": []})

    def add(self, f: float, i: float, w: float, *, moved: tuple[float, float, float] = (0.0, 0.0, 0.0),
            act: float = 0.0, params: float = 0.0, ops: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> None:
        for key, value in zip("FIW", (f, i, w), strict=True):
            self.flops[key] += value
        for key, value in zip("FIW", moved, strict=True):
            self.moved[key] += value
        for key, value in zip("FIW", ops, strict=True):
            self.ops[key] += value
        self.activation_bytes += act
        self.param_count += params


@dataclass(frozen=True)
class ParallelCosts:
    """A CostTable plus what tensor and data parallelism add around it."""

    table: CostTable  # per-stage seconds (already divided across tp) and bytes
    tp: int
    dp: int
    # (stage, "F"|"B"|"I"|"W") -> ((collective, bytes), ...) blocking, inside that action
    tp_collectives: dict[tuple[int, str], tuple[tuple[str, int], ...]]
    dp_grad_bytes: tuple[int, ...]  # per stage: gradient bytes all-reduced across dp at step end
    layers_per_stage: tuple[int, ...]  # MLP layers / transformer blocks per stage (0: unknown)
    dtype_bytes: int = 4  # bytes per parameter value (to count parameters from param_bytes)


def mlp_stage_work(model: ModelConfig, b: int, layers: int, tp: int = 1, *, first: bool = False) -> Work:
    """`layers` x (Linear(h, h) + GeLU) on a microbatch of b rows.

    Per layer F = 2*b*h*h FLOPs; I = F (grad wrt input); W = F (grad wrt weight); bias and GeLU
    FLOPs are not counted (as torch's FlopCounterMode). tp splits each weight; one all_reduce of
    b*h per column/row pair of layers in F and in I. Framework ops per layer: F 2 (linear, GeLU),
    I 2 (their input gradients), W 1 (the weight gradient). On the first stage the data needs no
    gradient, so its first Linear has none wrt its input: only the GeLU's gradient is left in I.
    """
    h, d = model.hidden, model.dtype_bytes
    work = Work()
    mm = 2 * b * h * h / tp  # FLOPs
    weights = (h * h / tp + h) * d  # bytes
    f_ops, i_ops, w_ops = MLP_LAYER_OPS
    for n in range(layers):
        no_dx = first and n == 0  # the data needs no gradient: I is only the GeLU's gradient
        i_moved = 2 * b * h * d / tp if no_dx else weights + 4 * b * h * d / tp  # bytes
        work.add(mm, 0.0 if no_dx else mm, mm, moved=(weights + 4 * b * h * d / tp, i_moved,
                                                      weights + 2 * b * h * d / tp),
                 act=2 * b * h * d / tp, params=h * h / tp + h, ops=(f_ops, i_ops - 1 if no_dx else i_ops, w_ops))
    if tp > 1:
        pairs = math.ceil(layers / 2)
        work.collectives["F"] += [("all_reduce", b * h * d)] * pairs
        work.collectives["I"] += [("all_reduce", b * h * d)] * pairs
    return work


def gpt_block_flops(model: ModelConfig, b: int) -> tuple[float, float, float]:
    """(F, I, W) FLOPs of one transformer block on b sequences, before tp.

    Weight matmuls (QKV, projection, 4h MLP): 24*b*s*h^2 forward, the same again for I and for W.
    Score matmuls (Q K^T and A V): 4*b*s^2*h forward; they have no weights, so their backward
    (grads wrt both operands, 8*b*s^2*h) goes entirely into I.
    """
    s, h = model.seq, model.hidden
    dense = 24 * b * s * h * h
    scores = 4 * b * s * s * h
    return dense + scores, dense + 2 * scores, dense


def gpt_block_activation_bytes(model: ModelConfig, b: int, tp: int = 1) -> float:
    """Korthikanti et al. (2022): s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes at 16 bits, scaled to the dtype."""
    s, h, a = model.seq, model.hidden, model.heads
    return s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)) * model.dtype_bytes / 2


def gpt_stage_work(model: ModelConfig, b: int, layers: int, *, first: bool, last: bool, tp: int = 1) -> Work:
    """Embedding (first stage), `layers` blocks, final norm + LM head + loss (last stage).

    Framework ops: embedding F 3 (two lookups, add), W 2; block F 10, I 10 (norms, matmuls,
    attention, activation, residual adds), W 6 (its weighted ops); head F 3, I 3, W 2.
    """
    s, h, v, d = model.seq, model.hidden, model.vocab, model.dtype_bytes
    act = b * s * h * d  # bytes of one (b, s, h) activation
    work = Work()
    if first:  # token + position lookup: no matmul FLOPs; vocab-parallel embedding all_reduces its output
        work.add(0.0, 0.0, 0.0, moved=(2 * act, 0.0, 2 * act), params=v * h / tp + s * h, ops=(3, 0, 2))
        if tp > 1:
            work.collectives["F"].append(("all_reduce", act))
    f, i, w = gpt_block_flops(model, b)
    block_params = 12 * h * h / tp + 13 * h  # weights split by tp, biases and layer norms kept whole
    block_act = gpt_block_activation_bytes(model, b, tp)
    for _ in range(layers):
        work.add(f / tp, i / tp, w / tp, moved=(block_params * d + block_act, block_params * d + block_act,
                                                block_params * d + block_act),
                 act=block_act, params=block_params, ops=(10, 10, 6))
        if tp > 1:
            work.collectives["F"] += [("all_reduce", act)] * 2
            work.collectives["I"] += [("all_reduce", act)] * 2
    if last:  # final norm + LM head (h x vocab, untied) + cross-entropy on vocab-parallel logits
        head = 2 * b * s * h * v / tp
        logits = b * s * v / tp * d
        work.add(head, head, head, moved=(h * v / tp * d + act + logits, h * v / tp * d + act + logits,
                                          h * v / tp * d + act + logits),
                 act=2 * act + logits, params=h * v / tp + 2 * h, ops=(3, 3, 2))
        if tp > 1:
            work.collectives["I"].append(("all_reduce", act))
    return work


def _check_parallel(model: ModelConfig, num_stages: int, microbatches: int, tp: int, dp: int) -> int:
    """Microbatch size, after checking that batch, heads and hidden divide."""
    for name, value in (("stages", num_stages), ("microbatches", microbatches), ("tp", tp), ("dp", dp)):
        if not isinstance(value, int) or value < 1:
            raise PipesimError(f"{name} must be a positive integer, got {value!r}")
    if model.batch % (dp * microbatches):
        raise PipesimError(f"--batch {model.batch} does not split into dp({dp}) x {microbatches} microbatches evenly")
    if model.hidden % tp:
        raise PipesimError(f"--hidden {model.hidden} is not divisible by tp({tp})")
    if model.kind == "gpt" and model.heads % tp:
        raise PipesimError(f"--heads {model.heads} is not divisible by tp({tp})")
    return model.batch // (dp * microbatches)


def model_costs(model: ModelConfig, num_stages: int, microbatches: int, hw: Hardware, *, tp: int = 1, dp: int = 1,
                layer_split: list[int] | None = None) -> ParallelCosts:
    """Per-stage costs of `model` cut into `num_stages` stages on `hw` (durations by roofline)."""
    b = _check_parallel(model, num_stages, microbatches, tp, dp)
    split = split_layers(model.layers, num_stages, layer_split)
    d = model.dtype_bytes
    stages: list[StageCosts] = []
    collectives: dict[tuple[int, str], tuple[tuple[str, int], ...]] = {}
    grads: list[int] = []
    boundary = b * model.hidden * d if model.kind == "mlp" else b * model.seq * model.hidden * d  # bytes
    for s, layers in enumerate(split):
        last = s == num_stages - 1
        if model.kind == "mlp":
            work = mlp_stage_work(model, b, layers, tp, first=s == 0)
        else:
            work = gpt_stage_work(model, b, layers, first=s == 0, last=last, tp=tp)
        fwd, inp, wgt = (hw.compute_time(work.flops[k], work.moved[k], model.dtype, k, work.ops[k]) for k in "FIW")
        if s == 0:  # no gradient leaves the first stage: a split I has nothing to send, W runs the whole backward
            inp, wgt = 0.0, inp + wgt
        param_bytes = round(work.param_count * d)
        stages.append(StageCosts(forward=fwd, backward_input=inp, backward_weight=wgt,
                                 boundary_bytes=0 if last else boundary,
                                 activation_bytes=round(work.activation_bytes), param_bytes=param_bytes,
                                 flops_forward=work.flops["F"], weight_ops=work.ops["W"],
                                 backward_ops=work.ops["I"] + work.ops["W"]))
        if work.collectives["F"]:
            collectives[(s, "F")] = tuple((k, round(n)) for k, n in work.collectives["F"])
        if work.collectives["I"]:
            # in a fused backward the input-gradient all_reduces happen inside B; split, in I (the first
            # stage: in W, which runs its whole backward)
            backward = tuple((k, round(n)) for k, n in work.collectives["I"])
            collectives[(s, "W" if s == 0 else "I")] = collectives[(s, "B")] = backward
        grads.append(param_bytes if dp > 1 else 0)
    return ParallelCosts(table=CostTable(tuple(stages)), tp=tp, dp=dp, tp_collectives=collectives,
                         dp_grad_bytes=tuple(grads), layers_per_stage=tuple(split), dtype_bytes=d)


FIW = tuple[float, float, float]  # one figure per kind of compute: F, I, W


def stage_work(model: ModelConfig, num_stages: int, m: int) -> list[tuple[FIW, FIW, FIW]]:
    """((F, I, W) FLOPs, (F, I, W) bytes moved, (F, I, W) framework ops) of one microbatch on each
    stage, as `model_costs` counts them (no tensor parallelism); the calibration fit inverts them."""
    b = model.batch // m
    out = []
    for s, layers in enumerate(split_layers(model.layers, num_stages)):
        if model.kind == "mlp":
            work = mlp_stage_work(model, b, layers, first=s == 0)
        else:
            work = gpt_stage_work(model, b, layers, first=s == 0, last=s == num_stages - 1)
        out.append(tuple(tuple(part[k] for k in "FIW") for part in (work.flops, work.moved, work.ops)))
    return out


def stage_flops(model: ModelConfig, num_stages: int, m: int) -> list[FIW]:
    """(F, I, W) FLOPs of one microbatch on each stage, as the simulator's cost model counts them."""
    return [work[0] for work in stage_work(model, num_stages, m)]


def action_flops(kind: str, stage: int, flops: FIW) -> tuple[FIW, int]:
    """(FLOPs attributed to the F, I, W rates, overheads charged) of one executed compute action.

    The first stage has no input gradient: its I is empty and its W runs the whole backward (a plain
    one, charged like a B), the rule `model_costs` applies to its durations.
    """
    f, i, w = flops
    if kind == "F":
        return (f, 0.0, 0.0), 1
    if kind == "B":
        return (0.0, i, w), 2
    if kind == "I":
        return ((0.0, 0.0, 0.0), 1) if stage == 0 else ((0.0, i, 0.0), 1)
    return ((0.0, i, w), 2) if stage == 0 else ((0.0, 0.0, w), 1)


def uniform_costs(num_stages: int, spec: dict[str, float], boundary_bytes: int = 0) -> ParallelCosts:
    """Hand-given costs (`parse_cost_spec` output: seconds of F, I, W), the same on every stage."""
    table = CostTable.uniform(num_stages, spec["F"], spec["I"], spec["W"], boundary_bytes=boundary_bytes)
    return ParallelCosts(table=table, tp=1, dp=1, tp_collectives={}, dp_grad_bytes=(0,) * num_stages,
                         layers_per_stage=(0,) * num_stages)


def check_fits_memory(costs: ParallelCosts, hw: Hardware, peak_inflight_by_stage: list[int], *,
                      placement: tuple[int, ...] | None = None) -> None:
    """PipesimError if a device's params + grads + Adam state + stashed activations exceed its memory.

    placement: stage -> rank (stages sharing a rank add up; their peaks are summed, an upper bound);
    default one stage per rank.
    """
    stages = costs.table.stages
    if len(peak_inflight_by_stage) != len(stages):
        raise PipesimError(f"{len(peak_inflight_by_stage)} in-flight counts for {len(stages)} stages")
    ranks = placement if placement is not None else tuple(range(len(stages)))
    state: dict[int, float] = {}
    acts: dict[int, float] = {}
    for s, c in enumerate(stages):
        r = ranks[s]
        state[r] = state.get(r, 0.0) + c.param_bytes / costs.dtype_bytes * OPTIMIZER_BYTES_PER_PARAM
        acts[r] = acts.get(r, 0.0) + c.activation_bytes * peak_inflight_by_stage[s]
    for r in sorted(state):
        need = state[r] + acts[r]
        if need > hw.device.memory:
            held = [s for s in range(len(stages)) if ranks[s] == r]
            inflight = max(peak_inflight_by_stage[s] for s in held)
            raise PipesimError(
                f"rank {r} (stage{'s' if len(held) > 1 else ''} {','.join(map(str, held))}) needs "
                f"{need / GiB:.2f} GiB (params+grads+Adam {state[r] / GiB:.2f} GiB, activations "
                f"{acts[r] / GiB:.2f} GiB for up to {inflight} in-flight microbatches) but {hw.device.name} "
                f"has {hw.device.memory / GiB:.2f} GiB"
            )


__all__ = ["ParallelCosts", "action_flops", "check_fits_memory", "model_costs", "stage_flops", "stage_work",
           "uniform_costs"]
