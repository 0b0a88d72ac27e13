"""What data parallelism, the optimizer and context parallelism add to one stage's step, for the simulator.

The model layer (pipesim.model.memory, pipesim.model.layer_collectives) says which collectives a stage issues and
how many bytes Adam reads and writes; this module turns that into the per-stage figures the
simulator kernel places in time (docs/simulator.md, "The step's end"):

- ZeRO 0: one all_reduce of the gradients after the stage's last backward (DDP).
- ZeRO 1: a reduce_scatter of the gradients after the stage's last backward, then, after the
  optimizer step on the shard, an all_gather of the updated parameters (Megatron's distributed
  optimizer: a full gradient buffer accumulates over the microbatches, reduced once).
- ZeRO 2: the same all_gather, but the gradients stay sharded (the memory model's 2P / dp), so a
  reduce_scatter follows every weight-gradient backward (phase `microbatch`); the optimizer waits
  for the last (docs/simulator.md, "ZeRO").
- ZeRO 3 (FSDP2; pipesim.model.fsdp says when it reshards): gathered once per step, an all_gather of each
  chunk's parameters before its first forward (prefetched from the step's start; the chunk stays gathered
  through every forward and backward, torchtitan's default with PP) and a reduce_scatter of its gradients
  after its last backward. A chunk FSDP2 frees between computes (reshard after forward, or without
  pipelining after every backward) is gathered again whenever it computes while freed (phase "gather",
  unit by unit beside that compute), and without pipelining its gradients are reduce-scattered after
  every backward ("microbatch", as ZeRO 2).
- The optimizer step is memory-bound, on the shard the rank owns. On a GPU preset with a device family it is
  Megatron-LM's passes (pipesim.model.optimizer_step: main-gradient copy, fp16's unscale, the norm for clipping,
  Adam, the copy back to the 16-bit parameters, the gradient buffer's zeroing), each a memory-bound kernel of
  the device profile (pipesim.device.kernels.memory_bound_time); elsewhere one fused Adam pass,
  `optimizer_step_bytes` at the device's HBM bandwidth (the model before issue 15).
- Context parallelism: ring attention's K/V hops (`cp_layer_exchanges`), each overlapping the
  attention of the block held; `RingExchange` carries one run of hops and the compute it hides behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from pipesim.cost.device_profiles import profile_of
from pipesim.cost.muon_step import MuonStage
from pipesim.device.kernels import memory_bound_time
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.cp_exchanges import cp_layer_exchanges
from pipesim.model.fp8 import Fp8Options, data_bytes
from pipesim.model.fsdp import FsdpPolicy
from pipesim.model.memory import (
    Precision,
    dp_collectives,
    named_precision,
    optimizer_step_bytes,
    zero3_chunk_collectives,
)
from pipesim.model.optimizer_step import optimizer_passes, pass_bytes
from pipesim.model.options import LayerOptions

# When a step collective runs, relative to the stage's (chunk's) work:
PHASES = ("forward", "backward", "grads", "microbatch", "params", "gather")
# forward: before its first forward (prefetched at the step's start); backward: before its first backward
# (prefetched); grads: after its last backward (the optimizer waits for it); microbatch: after each of its
# weight-gradient backwards (ZeRO 2; the optimizer waits for them too); params: after the optimizer step;
# gather: before any of its computes that finds the chunk freed (ZeRO 3 resharding, issued when it starts)


@dataclass(frozen=True)
class StepCollective:
    """One data-parallel collective of a stage per step, over the stage's dp group (the experts': edp)."""

    kind: str  # all_reduce, reduce_scatter or all_gather
    nbytes: int  # bytes of the whole buffer (nccl-tests convention, as comm_costs)
    phase: str  # one of PHASES
    group: str = "dp"  # "dp", or "edp" for the routed experts' state (the expert-data-parallel group)

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise PipesimError(f"unknown step phase {self.phase!r}; choose one of {', '.join(PHASES)}")


@dataclass(frozen=True)
class StepCosts:
    """Per stage: its data-parallel collectives and its optimizer step (what `simulate` adds after the pipeline)."""

    collectives: tuple[tuple[StepCollective, ...], ...]  # per stage, in issue order
    optimizer_seconds: tuple[float, ...]  # per stage: the Adam step on the shard this rank owns
    optimizer_bytes: tuple[int, ...]  # per stage: HBM bytes that step reads and writes
    zero: int = 0  # ZeRO stage the figures were made for (reported)
    fsdp: FsdpPolicy | None = None  # ZeRO 3's resharding (pipesim.model.fsdp); None under ZeRO 0-2
    # the parameters' all-gather runs in the DDP buckets with --overlap-param-gather (ZeRO 1-2, dist_muon)
    bucketed_gather: bool = False


def _precision(precision: Precision | str) -> Precision:
    if isinstance(precision, Precision):
        return precision
    return named_precision(precision)


def stage_step_collectives(params: int, *, dp: int, zero: int, precision: Precision | str = "mixed",
                           overlap_param_gather: bool = False, fsdp: FsdpPolicy | None = None,
                           fp8_params: int = 0, fp8: Fp8Options | None = None) -> tuple[StepCollective, ...]:
    """The dp collectives of one stage holding `params` parameters (per tp rank) in one step; () when dp = 1.
    `overlap_param_gather` (Megatron's flag, ZeRO 1/2): the parameters' all-gather runs before the chunk's first
    forward of the (next) step instead of after the optimizer. `fsdp` (ZeRO 3; None: gathered once per step):
    when FSDP2 frees the chunk between computes. `fp8_params` (--fp8-param-gather: the distributed optimizer's under
    ZeRO 1/2, torchao's FSDP2 float8 all-gather under ZeRO 3): of the parameters, those gathered quantized, as
    `fp8`'s data bytes (pipesim.model.fp8.data_bytes; None: one FP8 byte each): under NVFP4 (--fp4-param-gather)
    packed, two elements to a byte (Megatron-core's param_and_grad_buffer.py: the param buffer holds numel // 2 uint8
    for NVFP4 parameters; their block scales, 1/256 byte per element, not counted)."""
    prec = _precision(precision)
    gathered_bytes = data_bytes(fp8_params, fp8) if fp8 is not None else fp8_params  # what their gather moves
    fp8_saved = fp8_params * prec.param_bytes - gathered_bytes  # bytes that saves against 16-bit parameters
    if zero == 3:
        chunk = zero3_chunk_collectives(params, dp=dp, precision=prec)
        if not chunk:
            return ()
        gather, scatter = chunk
        gathered = gather.nbytes - fp8_saved
        if fsdp is None or fsdp.once_per_step:  # gathered once, kept until the backward
            return (StepCollective("all_gather", gathered, "forward"),
                    StepCollective("reduce_scatter", scatter.nbytes, "grads"))
        return (StepCollective("all_gather", gathered, "gather"),
                StepCollective("reduce_scatter", scatter.nbytes, "microbatch" if fsdp.after_backward else "grads"))
    out = []
    grads = "microbatch" if zero == 2 else "grads"  # ZeRO 2 keeps only its gradient shard: reduce every microbatch
    for c in dp_collectives(params, dp=dp, zero=zero, microbatches=1, precision=prec):
        gathered = "forward" if overlap_param_gather else "params"
        if c.kind == "all_gather":
            out.append(StepCollective(c.kind, c.nbytes - fp8_saved, gathered))
        else:
            out.append(StepCollective(c.kind, c.nbytes, grads))
    return tuple(out)


@lru_cache(maxsize=1 << 16)  # the planner's estimate asks it for every candidate's ranks (pure, immutable result)
def optimizer_bytes_and_seconds(params: int, *, dp: int, zero: int, hw: Hardware, precision: Precision | str = "mixed",
                                loss_scaling: bool = False) -> tuple[int, float]:
    """HBM bytes and seconds of one optimizer step over the parameters a rank holds (`params`, one tp rank's).

    With a device family: the precision's passes (pipesim.model.optimizer_step), each a memory-bound kernel;
    `loss_scaling` adds fp16's unscale pass. Without: one Adam pass, its bytes / the device's HBM bandwidth.
    """
    prec = _precision(precision)
    if not hw.device.family:
        nbytes = optimizer_step_bytes(params, dp=dp, zero=zero, precision=prec)
        return nbytes, nbytes / hw.device.hbm_bandwidth
    profile = profile_of(hw.device.family, hw.device.kernels)
    each = pass_bytes(optimizer_passes(prec, loss_scaling=loss_scaling), params, dp=dp, zero=zero)
    return sum(each), sum(memory_bound_time(b, profile).seconds for b in each)


def optimizer_seconds(params: int, *, dp: int, zero: int, hw: Hardware, precision: Precision | str = "mixed",
                      loss_scaling: bool = False) -> float:
    """Seconds of one optimizer step over the parameters a rank owns (`optimizer_bytes_and_seconds`)."""
    return optimizer_bytes_and_seconds(params, dp=dp, zero=zero, hw=hw, precision=precision,
                                       loss_scaling=loss_scaling)[1]


def _muon_collectives(params: int, experts: int, job: Job, prec: Precision) -> tuple[StepCollective, ...]:
    """Megatron-core's Muon: DDP's all-reduce of the gradients over dp x cp (the routed experts' over edp) and, under
    dist_muon, the updated parameters' all-gather after the step, or before the next forward with
    --overlap-param-gather (LayerWiseDistributedOptimizer's async_allgather, in the DDP buckets)."""
    assert job.muon is not None
    out: list[StepCollective] = []
    for count, ranks, group in ((params - experts, job.dims.dp_cp, "dp"), (experts, job.dims.edp, "edp")):
        if not count or ranks == 1:
            continue
        out += [replace(c, group=group) for c in stage_step_collectives(count, dp=ranks, zero=0, precision=prec)]
        if job.muon.distributed:
            out.append(StepCollective("all_gather", count * prec.param_bytes,
                                      "forward" if job.comm.overlap_param_gather else "params", group))
    return tuple(out)


def step_costs(params_per_stage: Sequence[int], job: Job, *, hw: Hardware, precision: Precision | str = "mixed",
               loss_scaling: bool = False, experts_per_stage: Sequence[int] = (),
               fp8_per_stage: Sequence[int] = (), fp8_experts_per_stage: Sequence[int] = (),
               muon_stages: Sequence[MuonStage] = ()) -> StepCosts:
    """Data-parallel collectives and optimizer step of every stage under the job's dp and ZeRO stage;
    `params_per_stage` counts one tp rank's parameters of each stage (pipesim.model.param_counts.stage_params);
    `loss_scaling`: fp16's grad scaler. `experts_per_stage`: of those, the routed experts' (a MoE model), whose
    gradients are reduced and state sharded over the expert-data-parallel group (edp = tp cp dp / (ep etp),
    Megatron-core's) instead of dp. `fp8_per_stage`: of the parameters, those --fp8-param-gather gathers in FP8;
    `fp8_experts_per_stage`: of those, the routed experts' (gathered over edp with their state). `muon_stages`: under
    --optimizer muon / dist_muon, each stage's step (pipesim.cost.muon_step), whose seconds replace Adam's."""
    prec = _precision(precision)
    experts = list(experts_per_stage) or [0] * len(params_per_stage)
    if job.muon is not None:
        return StepCosts(collectives=tuple(_muon_collectives(p, e, job, prec)
                                           for p, e in zip(params_per_stage, experts, strict=True)),
                         optimizer_seconds=tuple(m.seconds for m in muon_stages),
                         optimizer_bytes=tuple(m.pass_bytes for m in muon_stages), zero=0, fsdp=None,
                         bucketed_gather=job.gathers_parameters)
    dp, zero, edp = job.dims.dp_cp, job.zero, job.dims.edp  # the dense state's replicas include the cp ranks
    overlap, fsdp = job.comm.overlap_param_gather, job.fsdp
    fp8 = list(fp8_per_stage) or [0] * len(params_per_stage)
    fp8_experts = list(fp8_experts_per_stage) or [0] * len(params_per_stage)
    collectives, seconds, nbytes = [], [], []
    for p, e, f, fe in zip(params_per_stage, experts, fp8, fp8_experts, strict=True):
        colls = stage_step_collectives(p - e, dp=dp, zero=zero, precision=prec, overlap_param_gather=overlap,
                                       fsdp=fsdp, fp8_params=f - fe, fp8=job.fp8)
        opt_bytes, opt_seconds = optimizer_bytes_and_seconds(p - e, dp=dp, zero=zero, hw=hw, precision=prec,
                                                             loss_scaling=loss_scaling)
        if e:
            if edp > 1:
                colls += tuple(replace(c, group="edp")
                               for c in stage_step_collectives(e, dp=edp, zero=zero, precision=prec,
                                                               overlap_param_gather=overlap, fsdp=fsdp,
                                                               fp8_params=fe, fp8=job.fp8))
            more_bytes, more_seconds = optimizer_bytes_and_seconds(e, dp=edp, zero=zero, hw=hw, precision=prec,
                                                                   loss_scaling=loss_scaling)
            opt_bytes, opt_seconds = opt_bytes + more_bytes, opt_seconds + more_seconds
        collectives.append(colls)
        seconds.append(opt_seconds)
        nbytes.append(opt_bytes)
    return StepCosts(collectives=tuple(collectives), optimizer_seconds=tuple(seconds),
                     optimizer_bytes=tuple(nbytes), zero=zero, fsdp=fsdp, bucketed_gather=job.gathers_parameters)


@dataclass(frozen=True)
class RingExchange:
    """`hops` ring-attention hops in sequence, each sending `nbytes` to the next cp rank (and receiving as
    much) while `overlap` seconds of attention compute run; a hop longer than that is exposed by the difference."""

    nbytes: int  # bytes per hop, per direction
    hops: int
    overlap: float  # seconds of compute each hop hides behind (0: fully exposed)
    # "send_recv": a hop to the next cp rank; "all_gather" / "reduce_scatter" / "all_to_all": one collective over the
    # cp group (--cp-comm-type all_gather, a2a), `nbytes` its size, run `hops` times and exposed whole
    kind: str = "send_recv"


def ring_exchanges(model: ModelConfig, b: int, opts: LayerOptions, *, layers: int, attention_forward: float,
                   attention_backward: float) -> dict[str, tuple[RingExchange, ...]]:
    """Ring attention's hops of `layers` layers per microbatch, by phase ("F", "I"); {} when cp = 1.

    attention_forward / attention_backward: seconds of one layer's attention core on this rank (all cp
    blocks together); each hop overlaps one block's share (1 / cp of it). Forward: cp - 1 K/V hops.
    Backward: cp - 1 hops carrying K/V and the accumulating dK/dV together, then the last dK/dV hop home
    with nothing left to hide behind. Full recomputation's re-run forward hops overlap the re-run
    forward's blocks. Key the "I" entry as the model's backward (B, or I with a split backward).
    """
    if opts.cp == 1 or layers == 0:
        return {}
    cp = opts.cp
    block_f, block_b = attention_forward / cp, attention_backward / cp  # seconds per block
    out: dict[str, list[RingExchange]] = {"F": [], "I": []}
    if opts.cp_comm != "p2p":  # all_gather, a2a: collectives over the cp group, blocking (nothing to hide behind)
        for c in cp_layer_exchanges(model, b, opts):
            out[c.phase].append(RingExchange(c.nbytes, c.count * layers, 0.0, c.kind))
        return {k: tuple(v) for k, v in out.items() if v}
    backward: list = []
    for c in cp_layer_exchanges(model, b, opts):
        if c.phase == "F" or c.what.startswith("recompute"):
            out[c.phase].append(RingExchange(c.nbytes, c.count * layers, block_f))
        else:
            backward.append(c)
    if backward:  # K/V and dK/dV move together for cp - 1 hops; the last dK/dV hop goes home alone
        together = sum(c.nbytes for c in backward)
        out["I"].append(RingExchange(together, (cp - 1) * layers, block_b))
        tail = sum(c.nbytes for c in backward if c.count == cp)
        if tail:
            out["I"].append(RingExchange(tail, layers, 0.0))
    return {k: tuple(v) for k, v in out.items() if v}


def exposed_seconds(exchanges: Sequence[RingExchange], hop_seconds) -> float:
    """Seconds of `exchanges` not hidden behind compute: per hop max(0, hop time - overlap).

    hop_seconds(nbytes) -> seconds of one hop (the slowest link of the cp ring)."""
    total = 0.0
    for x in exchanges:
        hop = hop_seconds(x.nbytes)
        if hop > x.overlap:
            total += x.hops * (hop - x.overlap)
    return total


def per_microbatch_stages(step: StepCosts | None) -> frozenset[int]:
    """Stages whose gradients are reduced after every microbatch (ZeRO 2; ZeRO 3 without pipelining)."""
    if step is None:
        return frozenset()
    return frozenset(s for s, cs in enumerate(step.collectives) if any(c.phase == "microbatch" for c in cs))


__all__ = ["PHASES", "RingExchange", "StepCollective", "StepCosts", "exposed_seconds", "optimizer_bytes_and_seconds",
           "optimizer_seconds", "per_microbatch_stages", "ring_exchanges", "stage_step_collectives", "step_costs"]
