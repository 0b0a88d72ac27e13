"""Memory of one rank: parameters, gradients and optimizer states per ZeRO stage, and the peak breakdown.

ZeRO (Rajbhandari et al. 2020, section 3.1 and Figure 1): mixed-precision Adam holds 2 + 2 + 12
bytes per parameter (16-bit parameters and gradients; float32 master copy, momentum and
variance). Stage 1 shards the 12 over the dp ranks, stage 2 the gradients' 2 too, stage 3 the
parameters' 2 too. Megatron's distributed optimizer is stage 1 (its documented 6 + 12/d bytes
are the "megatron" precision below: float32 main gradients, `--accumulate-allreduce-grads-in-fp32`,
which bfloat16 takes by default as in Megatron-LM; `--grad-reduce-in-bf16` keeps 2 bytes). A rank
holds ceil(P / dp) of each sharded tensor (frameworks pad the flat buffer to divide). That is the
state between steps; during a pipelined step ZeRO-3's chunks are gathered too (`step_peak_state`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.model.activations import recompute_working_bytes, stage_activation_bytes
from pipesim.model.config import ModelConfig
from pipesim.model.cp_exchanges import cp_kv_block_bytes, cp_q_block_bytes
from pipesim.model.layer_collectives import Collective
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import stage_params

GiB = 2**30
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of the training state."""

    name: str
    param_bytes: int  # the copy forward and backward read
    grad_bytes: int  # the gradients reduced over dp
    optimizer_bytes: int  # master weights (if any) and Adam's two moments
    master_bytes: int  # of optimizer_bytes, the float32 master weights (0: the parameters are the master)


PRECISIONS = {
    "mixed": Precision("mixed", 2, 2, 12, 4),  # ZeRO paper: fp16/bf16 params and grads, fp32 master + m + v
    "fp32": Precision("fp32", 4, 4, 8, 0),  # float32 training: the parameters are the master copy; m + v
    "megatron": Precision("megatron", 2, 4, 12, 4),  # Megatron-LM bf16: fp32 main grads (18, or 6 + 12/d)
}


def named_precision(name: str) -> Precision:
    """PRECISIONS[name], or a 16-bit one with a precision-aware optimizer's states, `base+adam-M-A-S` (master, first
    and second moment bytes per parameter: pipesim.model.adam_states.AdamStates.tag)."""
    base, _, tag = name.partition("+")
    if base not in PRECISIONS or (tag and (base == "fp32" or not tag.startswith("adam-"))):
        raise PipesimError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
    if not tag:
        return PRECISIONS[base]
    master, m, v = (int(x) for x in tag.removeprefix("adam-").split("-"))
    return Precision(name, PRECISIONS[base].param_bytes, PRECISIONS[base].grad_bytes, master + m + v, master)


@dataclass(frozen=True)
class ModelState:
    """Bytes of parameters, gradients and optimizer states one rank holds between steps."""

    parameters: int
    gradients: int
    optimizer_states: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states


def check_zero(zero: int, dp: int) -> None:
    if zero not in ZERO_STAGES or isinstance(zero, bool):
        raise PipesimError(f"--zero must be one of 0, 1, 2, 3, got {zero!r}")
    if not isinstance(dp, int) or isinstance(dp, bool) or dp < 1:
        raise PipesimError(f"dp must be a positive integer, got {dp!r}")


def model_state_bytes(params: int, *, dp: int, zero: int, precision: Precision = PRECISIONS["mixed"]) -> ModelState:
    """Per-rank bytes of `params` parameters (already divided by tp and pp) under ZeRO stage `zero` over dp ranks."""
    check_zero(zero, dp)
    shard = -(-params // dp)  # ceil: the padded shard each dp rank owns
    return ModelState(parameters=(shard if zero >= 3 else params) * precision.param_bytes,
                      gradients=(shard if zero >= 2 else params) * precision.grad_bytes,
                      optimizer_states=(shard if zero >= 1 else params) * precision.optimizer_bytes)


def step_peak_state(params: int, *, dp: int, zero: int, precision: Precision = PRECISIONS["mixed"],
                    resident: float = 1.0) -> ModelState:
    """The model state a pipeline rank holds during the step (its peak), as the simulator times the step.

    Gradients stay as `model_state_bytes` shards them (ZeRO 2/3: Llama 3's FSDP shards them with PP; the
    time model still reduces them once per step: docs/large_models.md says where the two differ).
    ZeRO 3 adds the gathered parameters to the shard: `resident` of the chunk's (pipesim.model.fsdp's
    resident_fraction: all of it when FSDP2 keeps it gathered from the forward to the backward, two units when
    it reshards after each forward). dp = 1: `model_state_bytes`.
    """
    if not 0.0 < resident <= 1.0:
        raise PipesimError(f"the resident fraction of a ZeRO-3 chunk is in (0, 1], got {resident!r}")
    state = model_state_bytes(params, dp=dp, zero=zero, precision=precision)
    if dp == 1:
        return state
    gathered = round(params * resident) * precision.param_bytes if zero == 3 else 0
    return ModelState(parameters=state.parameters + gathered, gradients=state.gradients,
                      optimizer_states=state.optimizer_states)


def optimizer_step_bytes(params: int, *, dp: int, zero: int, precision: Precision = PRECISIONS["mixed"]) -> int:
    """HBM bytes of one Adam step on a rank (memory-bound): it updates the parameters it owns, all of them
    under ZeRO 0, its ceil(P / dp) shard under ZeRO 1-3.

    Per parameter it reads the gradient, the moments and the master weights (or the parameters
    themselves in fp32) and writes them back, plus the 16-bit copy when a master exists: mixed
    precision 14 + 14 = 28 bytes, fp32 16 + 12 = 28.
    """
    check_zero(zero, dp)
    owned = params if zero == 0 else -(-params // dp)
    reads = precision.grad_bytes + precision.optimizer_bytes + (0 if precision.master_bytes else precision.param_bytes)
    writes = precision.optimizer_bytes + precision.param_bytes
    return owned * (reads + writes)


def dp_collectives(params: int, *, dp: int, zero: int, microbatches: int,
                   precision: Precision = PRECISIONS["mixed"]) -> list[Collective]:
    """Data-parallel collectives of a stage holding `params` parameters, outside its layers.

    0: one all_reduce of the gradients at the step's end (DDP). 1: reduce_scatter of the gradients
    after the stage's last backward, then (after the optimizer step on the shard) all_gather of the
    parameters. 2: the same collectives, but the gradients stay sharded, so the reduce_scatter runs
    after every microbatch (`count` = microbatches; pipesim.cost.step_costs times each). 3:
    `zero3_chunk_collectives`. dp = 1: none.
    """
    check_zero(zero, dp)
    if dp == 1 or zero == 3:
        return []
    grads, weights = params * precision.grad_bytes, params * precision.param_bytes
    if zero == 0:
        return [Collective("all_reduce", grads, "step", "dp", "gradients")]
    gather = Collective("all_gather", weights, "step", "dp", "updated parameters")
    if zero == 2:
        return [Collective("reduce_scatter", grads, "W", "dp", "gradient shard, every microbatch", count=microbatches),
                gather]
    return [Collective("reduce_scatter", grads, "step", "dp", "gradients"), gather]


def zero3_chunk_collectives(chunk_params: int, *, dp: int, precision: Precision = PRECISIONS["mixed"]) -> list[
        Collective]:
    """ZeRO-3 / FSDP2 with pipelining, per chunk and step: all_gather of the chunk's parameters before its
    first forward (prefetched from the step's start; kept gathered through every microbatch's forward and
    backward, torchtitan's reshard_after_forward=False), reduce_scatter of its gradients after its last
    backward. dp = 1: none."""
    check_zero(3, dp)
    if dp == 1:
        return []
    weights, grads = chunk_params * precision.param_bytes, chunk_params * precision.grad_bytes
    return [Collective("all_gather", weights, "F", "dp", "chunk parameters", overlaps="earlier chunks' compute"),
            Collective("reduce_scatter", grads, "W", "dp", "chunk gradients", overlaps="later backward work")]


@dataclass(frozen=True)
class MemoryBreakdown:
    """One rank's memory at its peak, in bytes."""

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int  # stashed for backward, all in-flight microbatches together
    inflight: int  # microbatches (or chunk-microbatches) whose activations are stashed at the peak
    recompute: int = 0  # a recomputed layer's re-created activations, live during its backward
    comm_buffers: int = 0  # gathered parameters, P2P and collective buffers
    fp8_weights: int = 0  # FP8 copies of the linear weights, kept through the step (pipesim.cost.fp8_costs)

    def terms(self) -> dict[str, int]:
        """Each term by name (the keys of the JSON breakdown), largest first on ties by this order; fp8_weights
        only in an FP8 run."""
        terms = {"parameters": self.parameters, "gradients": self.gradients,
                 "optimizer_states": self.optimizer_states, "activations": self.activations,
                 "recompute": self.recompute, "comm_buffers": self.comm_buffers}
        return {**terms, "fp8_weights": self.fp8_weights} if self.fp8_weights else terms

    @property
    def total(self) -> int:
        return sum(self.terms().values())

    def largest(self) -> tuple[str, int]:
        terms = self.terms()
        name = max(terms, key=lambda k: terms[k])
        return name, terms[name]

    def to_dict(self) -> dict:
        return {**self.terms(), "inflight": self.inflight, "total": self.total}


def rank_memory(state: ModelState, *, activations_per_microbatch: int, inflight: int, recompute: int = 0,
                comm_buffers: int = 0) -> MemoryBreakdown:
    """The peak: model state, `inflight` microbatches' stashes, one recomputed layer's working set, buffers."""
    if inflight < 0:
        raise PipesimError(f"in-flight microbatches must be >= 0, got {inflight}")
    return MemoryBreakdown(parameters=state.parameters, gradients=state.gradients,
                           optimizer_states=state.optimizer_states,
                           activations=activations_per_microbatch * inflight, inflight=inflight,
                           recompute=recompute, comm_buffers=comm_buffers)


def comm_buffer_bytes(model: ModelConfig, b: int, opts: LayerOptions, *, dp: int = 1, zero: int = 0,
                      precision: Precision = PRECISIONS["mixed"]) -> int:
    """Communication buffers a pipeline rank holds at once (an estimate; frameworks differ).

    A P2P send and a receive buffer of the stage boundary (b s h d / cp; / t under sp); under sp
    one all-gathered layer input (b s h d / cp); under cp a K/V block in flight each way. ZeRO-3's
    gathered parameters are the rank's parameters term (`step_peak_state`), not a buffer.
    """
    opts.check(model)
    x = b * opts.local_seq(model) * model.hidden * model.dtype_bytes  # bytes of the full (b, s / cp, h) tensor
    total = 2 * opts.seq_sharded(x)
    if opts.sp and opts.tp > 1:
        total += x
    if opts.cp > 1 and opts.cp_comm == "a2a":  # Q, K, V in their head-sharded copies (as large as the rank's own)
        total += cp_q_block_bytes(model, b, opts) + cp_kv_block_bytes(model, b, opts)
    elif opts.cp > 1:  # ring attention's block in flight and the one held; all_gather: every rank's block at once
        total += (opts.cp if opts.cp_comm == "all_gather" else 2) * cp_kv_block_bytes(model, b, opts)
    return total


def stage_memory(model: ModelConfig, b: int, opts: LayerOptions, *, layers: int, first: bool, last: bool,
                 inflight: int, dp: int = 1, zero: int = 0,
                 precision: Precision = PRECISIONS["mixed"]) -> MemoryBreakdown:
    """Peak memory of one rank holding one pipeline stage of `layers` blocks (embedding if first, head if last)
    with `inflight` microbatches stashed (the schedule's peak for that stage)."""
    params = stage_params(model, opts.tp, layers=layers, first=first, last=last)
    return rank_memory(step_peak_state(params, dp=dp, zero=zero, precision=precision),
                       activations_per_microbatch=stage_activation_bytes(model, b, opts, StageLayers.uniform(layers),
                                                                         first=first, last=last),
                       inflight=inflight, recompute=recompute_working_bytes(model, b, opts) if layers else 0,
                       comm_buffers=comm_buffer_bytes(model, b, opts, dp=dp, zero=zero, precision=precision))


def check_rank_fits(memory: MemoryBreakdown, *, rank: int, capacity: int, device: str, where: str = "") -> None:
    """PipesimError naming the rank, its total and largest term when `memory` exceeds `capacity` bytes.

    where: what the rank holds, e.g. "stage 0" (shown in parentheses after the rank).
    """
    if memory.total <= capacity:
        return
    name, value = memory.largest()
    inflight = f" for up to {memory.inflight} in-flight microbatches" if name == "activations" else ""
    held = f" ({where})" if where else ""
    parts = ", ".join(f"{k.replace('_', ' ')} {v / GiB:.2f}" for k, v in memory.terms().items() if v)
    raise PipesimError(
        f"rank {rank}{held} needs {memory.total / GiB:.2f} GiB, the largest term {name.replace('_', ' ')} "
        f"{value / GiB:.2f} GiB{inflight} ({parts} GiB) but {device} has {capacity / GiB:.2f} GiB"
    )


__all__ = ["PRECISIONS", "ZERO_STAGES", "MemoryBreakdown", "ModelState", "Precision", "check_rank_fits", "check_zero",
           "comm_buffer_bytes", "dp_collectives", "model_state_bytes", "named_precision", "optimizer_step_bytes",
           "rank_memory", "stage_memory", "step_peak_state", "zero3_chunk_collectives"]
