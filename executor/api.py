"""The executor as a library call: train any model with any schedule under an initialised process group.

    import torch.distributed as dist
    from executor.api import train

    dist.init_process_group("gloo")                       # under torchrun
    result = train("1f1b", model=nn.Sequential(...), split=[2, 2], loss_fn=F.mse_loss,
                   batches=lambda step: (x, y), steps=4, microbatches=4)

The schedule is a registered name, a `pipesim.ir.schedule.Schedule` or a torch.distributed.pipelining CSV
file; the model is a list of stage modules (one per stage, the same on every rank: each rank keeps
its own) or one `nn.Sequential`-like model cut by `split` (layers per stage). Boundary shapes come
from one pass of the first batch's microbatch through the stages on the meta device. `pipesim run`
(`python -m executor`) trains through `execute` here too. See docs/your_model.md.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import schedules
from executor.mesh import Mesh, build_mesh_for
from executor.params import module_parameters
from executor.run_config import RunConfig, check_transport_order
from executor.runtime import Runtime
from executor.timing import RankLog, gather, median_step_time, resolve, step_times, to_timeline, write_trace
from executor.workload import PiecesWorkload
from pipesim.errors import PipesimError
from pipesim.ir import torch_csv
from pipesim.ir.schedule import Schedule
from pipesim.job import Job
from pipesim.parallel_dims import ParallelDims
from pipesim.timeline import Timeline

Batches = Callable[[int], tuple[torch.Tensor, torch.Tensor]] | Sequence[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class TrainResult:
    """What `train` returns on every rank; losses, step times and the timeline on rank 0 only."""

    schedule: str
    losses: list[float]  # per step, mean over the global batch (rank 0; empty elsewhere)
    step_times: list[float]  # seconds per step, earliest start to latest end over all ranks (rank 0)
    stages: dict[int, nn.Module]  # this rank's trained stage modules, by stage index
    timeline: Timeline | None = None  # every action on every rank (rank 0, with trace=True or a path)

    @property
    def step_time(self) -> float:
        """Median seconds per step after the first (all steps when there is one)."""
        return median_step_time(self.step_times, 1) if self.step_times else 0.0

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's parameters under the full model's names (`pieces.<i>.<name>`), copied to the CPU. From the
        stage modules alone (`train` runs tp 1): the result keeps no runtime, and so no process group or pending
        work, alive past the user's destroy_process_group (gloo could then abort the process as it exits)."""
        return module_parameters(self.stages.values())


@dataclass
class Executed:
    """A finished Runtime and every rank's log (on rank 0; None elsewhere)."""

    runtime: Runtime
    logs: list[RankLog] | None


def execute(cfg: RunConfig, sched: Schedule, mesh: Mesh, device: torch.device, workload=None,
            progress: Callable[[int, float], None] | None = None,
            on_trained: Callable[[], None] | None = None) -> Executed:
    """Train `sched` on this rank (every rank calls it) and gather the logs on rank 0.

    `workload` (executor.workload): None for pipesim's own model from `cfg.model`; `on_trained` is
    called between the last step and the gathering (the launcher's status line)."""
    rt = Runtime(cfg, sched, mesh, device, workload)
    log = rt.train(progress)
    if on_trained is not None:
        on_trained()
    resolve(log, rt.program, rt.transfers.peer_of, rt.transfers.transfer_bytes)
    return Executed(rt, gather(log))


def free_runtimes() -> None:
    """Free finished runtimes now, before the caller's destroy_process_group. A Runtime's program closures refer
    back to it, so only the cyclic collector frees it, and the gloo objects it holds with it. Left to the
    collector's pass at interpreter exit, after destroy_process_group, gloo aborted the process there
    ("terminate called without an active exception"): examples/train_with_api.py on 2 loaded cores, 4 of 210 runs
    before, 0 of 160 with the runtime freed first."""
    gc.collect()


def resolve_schedule(schedule: str | Path | Schedule, pp: int, microbatches: int | None,
                     virtual: int | None = None) -> Schedule:
    """A registered name, a CSV file (`.csv`) or a Schedule -> a validated Schedule for `pp` ranks."""
    from pipesim.ir.schedule_check import validate  # networkx: only here

    if isinstance(schedule, Schedule):
        sched = schedule
    elif str(schedule).endswith(".csv"):
        sched = torch_csv.load(str(schedule))
    else:
        if microbatches is None:
            raise PipesimError(f"schedule {schedule!r}: give microbatches=")
        sched = schedules.build(str(schedule), pp, microbatches, virtual)
    if sched.num_ranks != pp:
        raise PipesimError(f"{sched.name} has {sched.num_ranks} ranks but the process group has pp({pp})")
    if microbatches is not None and sched.num_microbatches != microbatches:
        raise PipesimError(f"{sched.name} has {sched.num_microbatches} microbatches, not {microbatches}")
    check_transport_order(validate(sched), nccl=dist.get_backend() == "nccl")
    return sched


def pieces_of(model: nn.Module) -> list[nn.Module]:
    """The layers of an `nn.Sequential`-like model: its items when it iterates, else its children."""
    try:
        return list(model)
    except TypeError:
        return list(model.children())


def train(schedule: str | Path | Schedule, stages: Sequence[nn.Module] | None = None, *,
          model: nn.Module | None = None, split: Sequence[int] | None = None,
          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], batches: Batches,
          microbatches: int | None = None, steps: int | None = None, virtual: int | None = None,
          dp: int = 1, optimizer: str = "sgd", lr: float = 0.01,
          trace: bool | str = False) -> TrainResult:
    """Train under the initialised process group; every rank calls it with the same arguments.

    stages: one module per stage of the schedule (pipeline ranks x chunks per rank), or
    model + split: `split` layers per stage (None: even). loss_fn(output, target) is the mean over
    a microbatch (the step's loss is the mean of the microbatches'). batches: a function
    step -> (inputs, targets) of the global batch, or a sequence of such pairs (steps = its length).
    The world is dp x pp (the job's pp: WORLD_SIZE / dp); data-parallel replicas average their gradients.
    trace: True keeps the timeline on rank 0; a path also writes it there (pipesim plot reads it).
    """
    if (stages is None) == (model is None):
        raise PipesimError("give stages=[...] (one module per stage) or model= with split=, not both or neither")
    if not callable(batches):
        seq = list(batches)
        steps = len(seq) if steps is None else steps
        source = seq.__getitem__
    else:
        source = batches
    if not steps:
        raise PipesimError("give steps= (how many batches to train on)")
    # the one Job of this call (pipesim.job), its pp what dp leaves of the world
    cfg = RunConfig(job=Job(dims=ParallelDims(dp=dp)), steps=steps, warmup=min(1, steps - 1), optimizer=optimizer,
                    lr=lr, trace=str(trace) if trace else None, quiet=True)
    job = cfg.job_for(dist.get_world_size())
    sched = resolve_schedule(schedule, job.pp, microbatches, virtual)
    m = sched.num_microbatches
    x0, _ = source(0)
    if stages is not None:
        if len(stages) != sched.model_stages:  # DualPipe's two chains run each model stage twice
            raise PipesimError(f"{sched.name} has {sched.model_stages} stages; got {len(stages)} stage modules")
        pieces, split = list(stages), [1] * len(stages)
    else:
        pieces = pieces_of(model)
    if x0.shape[0] % (job.dp * m):
        raise PipesimError(f"a batch of {x0.shape[0]} rows does not split into dp({job.dp}) x {m} microbatches "
                           "evenly")
    workload = PiecesWorkload(pieces, len(pieces), False, loss_fn, source, x0.shape[0],
                              tuple(split) if split is not None else None)
    workload.layers_per_stage(sched.model_stages)  # the split fits the stages, before any group is built
    cfg = replace(cfg, names=(sched.name,), microbatches=m)
    mesh = build_mesh_for(job.dims)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    done = execute(cfg, sched, mesh, device, workload)
    logs, rt = done.logs, done.runtime
    # each rank holding a last stage logged the sum of its microbatches' losses / m: summed over a replica (DualPipe's
    # two chains end on two ranks), averaged over the dp replicas
    per = [lg.losses for lg in logs if lg.losses] if logs else []
    losses = [sum(r[i] for r in per) / job.dp for i in range(len(per[0]))] if per else []
    times = step_times(logs) if logs else []
    timeline = None
    if logs and trace:
        timeline = to_timeline(logs, sched.name, {"schedule": sched.name, "stages": sched.num_stages,
                                                 "microbatches": m, "dp": job.dp, "pp": job.pp, "tp": job.tp,
                                                 "steps": steps, "warmup": cfg.warmup, "step_times": times})
        if isinstance(trace, str | Path):
            write_trace(timeline, str(trace))
    modules = {s: st.module for s, st in rt.stages.items()}
    del done, rt
    free_runtimes()
    return TrainResult(sched.name, losses, times, modules, timeline)


__all__ = ["Executed", "TrainResult", "execute", "free_runtimes", "pieces_of", "resolve_schedule", "train"]
