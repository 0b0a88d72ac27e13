"""Run configuration, checked before any process group exists.

`RunConfig` is built at the edge (`pipesim run`'s flags, pipesim.commands.run_args) and crosses to
the torchrun workers as JSON (`to_dict`/`from_dict`, derived from the dataclass fields, the `Job` and
its ParallelDims, CommOptions and KernelSwitches nested): one spelling of every field. The run's
layout and layer options are its `job` (pipesim.job, built once at the edge); the pipeline size is
`stages` or what dp, cp and tp leave of the world, resolved in one place (`job_for`). Options of a
Job the executor does not implement are refused by name (`unhonoured`), never ignored. Errors show
the arithmetic (`dp(2) * pp(2) * tp(2) != WORLD_SIZE(6)`) and reach the user as one line with exit
code 2, both from `pipesim run` (before torchrun starts) and from `python -m executor`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import schedules
from executor.config_json import dataclass_from_dict
from executor.expert_checks import check_experts
from pipesim.errors import PipesimError
from pipesim.ir import torch_csv
from pipesim.ir.lowering import add_p2p
from pipesim.ir.schedule import Action, Schedule
from pipesim.job import Job
from pipesim.model.config import ModelConfig, split_layers
from pipesim.model.executor_scope import unbuilt_structure

FAIL_MODES = ("raise", "kill", "hang")
# the NVIDIA driver's device nodes (Linux; /dev/dxg under WSL 2): without any of them CUDA cannot be available
CUDA_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs; `names` may hold several schedules run one after another."""

    names: tuple[str, ...] = ()  # registered schedules (empty when `csv` is given)
    csv: str | None = None  # torch.distributed.pipelining schedule CSV instead of names
    stages: int | None = None  # pipeline ranks P; default WORLD_SIZE / (dp * cp * tp) (`job_for`)
    microbatches: int = 8
    virtual: int | None = None  # chunks per rank (interleaved schedules only)
    # the layout (dp, tp; its pp is `stages`, set by `job_for`) and the layer options (sp, recompute) the ranks run
    job: Job = field(default_factory=Job)
    model: ModelConfig = field(default_factory=ModelConfig)
    # `--model MODULE:FACTORY` (pipesim.cost.user_model_costs): the user's layers instead of `model`, whose batch and
    # seed still apply
    factory: str | None = None
    layer_split: tuple[int, ...] | None = None  # layers per stage, e.g. (3, 2, 2, 1)
    steps: int = 3
    # first steps left out of step_time (still trained and reported); `pipesim run` refuses warmup >= steps, a
    # library caller that allows it gets every step counted
    warmup: int = 1
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.01
    backend: str | None = None  # gloo | nccl; default nccl when CUDA is available, else gloo
    pg_timeout: float = 60.0  # seconds a blocked collective or recv waits before failing
    bucket_bytes: int | None = None  # DP all-reduce bucket size; None = one all-reduce per parameter set
    json: str | None = None
    trace: str | None = None
    save_dir: str | None = None  # each rank writes its final parameters and the result here
    fail_rank: int | None = None  # fault injection (tests): this rank fails ...
    fail_at: str | None = None  # ... at this action (torch notation, e.g. 1F3) ...
    fail_mode: str = "raise"  # ... by raising, SIGKILL-ing itself, or hanging
    quiet: bool = False
    # zb-auto / zb-2p ordered for the simulated costs at the edge (pipesim.commands.run_args.searched_orders):
    # (name, one tuple of action strings per rank); a name absent here runs the registry's (unit-cost) order
    orders: tuple = ()
    # experts over ep > 1: an overlapped F&B pair issues its forward's all-to-all asynchronously and runs the
    # backward before waiting (executor.runtime); False runs the pair's halves back to back (the bench's baseline)
    a2a_overlap: bool = True
    slow_ranks: tuple[int, ...] = ()  # what-if (docs/whatif.md): these global ranks' compute is stretched ...
    slow_factors: tuple[float, ...] = ()  # ... by these factors (>= 1), by sleeping the extra time after each action

    def __post_init__(self) -> None:
        if not isinstance(self.job, Job):
            raise PipesimError(f"a run's job must be a pipesim.job.Job, got {type(self.job).__name__}")
        if self.job.pp not in (1, self.stages):  # one pipeline size: pp 1 in the job is the placeholder
            raise PipesimError(f"the job's pp({self.job.pp}) is not stages({self.stages}): give the pipeline "
                               "ranks as stages")

    def job_for(self, world: int) -> Job:
        """The job on `world` ranks: pp is `stages`, or what dp, cp and tp leave; the grid must fill the world."""
        dims = self.job.dims
        pp = self.stages
        if pp is None:
            rest = dims.dp * dims.cp * dims.tp
            if world % rest:
                cp = f" * cp({dims.cp})" if dims.cp > 1 else ""
                raise PipesimError(f"WORLD_SIZE({world}) is not divisible by dp({dims.dp}){cp} * tp({dims.tp})")
            pp = world // rest
        job = self.job.with_pp(pp)
        job.dims.check_world(world)
        return job

    def check(self, world: int) -> list[Schedule]:
        """Validate against the world size; return the schedules to run (validated IR)."""
        unbuilt = unbuilt_structure(self.model)
        if unbuilt:
            raise PipesimError(f"the executor does not build {', '.join(unbuilt)}, which this model has (pipesim "
                               "simulate takes it)")
        check_experts(self.model, self.job, factory=self.factory)
        unrun = unhonoured(self.job)
        if unrun:
            raise PipesimError(f"the executor does not implement {'; '.join(unrun)}: it trains with plain DDP "
                               "(ZeRO 0), cp 1, torch's own attention and kernels, and unsplit non-blocking P2P "
                               "(those options are the cost model's: pipesim simulate, plan)")
        job = self.job_for(world)
        if self.warmup < 0:
            raise PipesimError(f"--warmup must be >= 0, got {self.warmup}")
        if self.optimizer not in ("sgd", "adam"):
            raise PipesimError(f"unknown --optimizer {self.optimizer!r}; choose sgd or adam")
        if self.backend not in (None, "gloo", "nccl"):
            raise PipesimError(f"unknown --backend {self.backend!r}; choose gloo or nccl")
        if self.backend == "nccl":
            import torch  # only for nccl: `pipesim run`'s checks stay free of torch's start-up

            if torch.cuda.device_count() < 1:
                raise PipesimError("--backend nccl needs CUDA GPUs and this machine has none; use --backend gloo")
        if len(self.slow_ranks) != len(self.slow_factors):
            raise PipesimError("--slow: one factor per rank")
        twice = [r for i, r in enumerate(self.slow_ranks) if r in self.slow_ranks[:i]]
        if twice:  # as simulate's --slow (pipesim.sim.perturb): a second factor would be dropped
            raise PipesimError(f"--slow names rank {twice[0]} more than once: give each rank one factor")
        for rank, factor in zip(self.slow_ranks, self.slow_factors, strict=True):
            if not 0 <= rank < world:
                raise PipesimError(f"--slow {rank}={factor:g}: rank {rank} does not exist (ranks 0-{world - 1})")
            if not factor >= 1:
                raise PipesimError(f"--slow {rank}={factor:g}: the executor slows a rank by sleeping, so the factor "
                                   "must be >= 1")
        if self.fail_mode not in FAIL_MODES:
            raise PipesimError(f"unknown --fail-mode {self.fail_mode!r}; choose {', '.join(FAIL_MODES)}")
        if job.recompute == "op":
            raise PipesimError("--recompute op (torchtitan's per-op checkpointing) is simulated, not run: the executor "
                               "has --recompute selective and full")
        if job.recompute == "selective" and self.model.kind != "gpt":
            raise PipesimError("--recompute selective re-runs the attention core, which --model mlp does not have; "
                               "use --recompute full")
        if self.factory is not None:
            for flag, plain, value in (("--tp", 1, job.tp), ("--sequence-parallel", False, job.sp),
                                       ("--recompute", "none", job.recompute)):
                if value != plain:
                    raise PipesimError(f"{flag} needs pipesim's own --model mlp or gpt, not --model {self.factory}")
        m = self.microbatches  # checked before the schedules are built: their size grows with m
        # the cost model's checks of the batch split and of the sizes tp divides (hidden; gpt's heads; the sequence
        # under sequence parallelism, which splits a transformer's sequence over tp as Megatron does). The MLP's
        # sequence parallelism splits a microbatch's rows instead (checked below), and its MLP also runs full
        # recomputation, which the cost model's MLP refuses
        plain = replace(job, dims=replace(job.dims, ep=1)) if self.factory else job  # a factory's ep: check_run
        sp = job.sp and self.model.kind == "gpt"
        replace(plain, sp=sp, recompute=job.recompute if self.model.kind == "gpt" else "none").check(self.model, m)
        dp, tp = job.dp, job.tp
        if job.sp and self.model.kind == "mlp" and self.model.batch % (dp * m * tp):
            raise PipesimError(f"--sequence-parallel splits each microbatch over tp: --batch {self.model.batch} does "
                               f"not split into dp({dp}) x {m} microbatches x tp({tp}) evenly")
        built = [self._schedule(name, job.pp) for name in (self.names or (None,))]
        for sched in built if self.model.tied_embeddings else ():
            if sched.chains > 1:
                raise PipesimError(f"{sched.name} runs each model stage on two ranks, and this model's head is tied to "
                                   "its embedding: the executor ties them on schedules with one chain")
        self._check_fault(job, built)
        for sched in built if self.factory is None else ():  # a factory's layers are counted when it is called
            split = self.layers_per_stage(sched.model_stages)  # DualPipe: 2 chains of p stages, p chunks
            if tp > 1 and self.model.kind == "mlp" and any(n % 2 for n in split):
                raise PipesimError(f"tensor parallel MLP pairs column- and row-parallel layers: layers per stage "
                                   f"{split} must all be even")
        return built

    def _check_fault(self, job: Job, built: list[Schedule]) -> None:
        """--fail-rank and --fail-at together, naming an action that rank runs (executor.runtime arms it in the
        rank's lowered program): a fault that could never fire is refused, not run as a clean run."""
        if self.fail_rank is None and self.fail_at is None:
            return
        if self.fail_at is None:
            raise PipesimError(f"--fail-rank {self.fail_rank} needs --fail-at ACTION: the action where it fails, "
                               "e.g. 1F3")
        if self.fail_rank is None:
            raise PipesimError(f"--fail-at {self.fail_at} needs --fail-rank RANK: the rank that fails there")
        target = Action.parse(self.fail_at)
        pp = job.dims.coords(self.fail_rank).pp
        if not any(target in add_p2p(sched).programs[pp] for sched in built):
            stages = built[0].stages_of(pp)
            held = f"stage{'s' * (len(stages) > 1)} {', '.join(map(str, stages))}"
            raise PipesimError(f"--fail-at {self.fail_at}: rank {self.fail_rank} (pipeline rank {pp}: {held}, "
                               f"microbatches 0 to {self.microbatches - 1}) never runs it, so the fault could "
                               "never fire")

    def layers_per_stage(self, num_stages: int) -> list[int]:
        weights = list(self.layer_split) if self.layer_split else None  # a chunk may hold no layer (an identity stage)
        return split_layers(self.model.layers, num_stages, weights)

    def _world_mismatch(self, pp: int, ranks: int) -> str:
        """The CSV's `ranks` pipeline ranks against the `pp` the world's ranks leave over dp x cp x tp (`job_for`),
        and the world the CSV needs (a typed --stages the CSV lacks: torch_csv.check_csv_counts)."""
        d = self.job.dims
        cp = f" x cp({d.cp})" if d.cp > 1 else ""
        return (f"{self.csv} has {ranks} pipeline ranks, but the run's {pp * d.dp * d.cp * d.tp} ranks (--nproc x "
                f"nodes) over dp({d.dp}){cp} x tp({d.tp}) leave {pp}: it needs {ranks * d.dp * d.cp * d.tp} ranks")

    def _schedule(self, name: str | None, pp: int) -> Schedule:
        from pipesim.ir.schedule_check import validate  # networkx: kept out of `pipesim`'s start-up

        if name is not None and self.csv:
            raise PipesimError("give a schedule NAME or --from-csv FILE, not both")
        if name is None and not self.csv:
            raise PipesimError(f"name a schedule ({', '.join(schedules.names())}) or give --from-csv FILE")
        if self.csv:
            sched = torch_csv.load(self.csv)
            torch_csv.check_csv_counts(sched, self.csv, stages=self.stages, microbatches=self.microbatches,
                                       virtual=self.virtual)
            if sched.num_ranks != pp:
                raise PipesimError(self._world_mismatch(pp, sched.num_ranks))
        else:
            v = self.virtual if (self.virtual and schedules.spec(name).virtual) else None
            if self.virtual and len(self.names) == 1:
                v = self.virtual  # let the registry reject --virtual for a one-chunk schedule
            sched = schedules.build(name, pp, self.microbatches, v)
            searched = dict(self.orders).get(name)
            if searched is not None:  # the order the simulator timed for this run's costs, the same actions
                if len(searched) != pp:
                    raise PipesimError(f"{name}'s searched order has {len(searched)} ranks, the run pp({pp})")
                programs = tuple(tuple(Action.parse(a) for a in prog) for prog in searched)
                sched = Schedule(name, self.microbatches, sched.placement, programs, dict(sched.meta))
        check_transport_order(validate(sched), nccl=self.uses_nccl())
        return sched

    def uses_nccl(self) -> bool:
        """The backend the run will take (default nccl with CUDA, else gloo)."""
        if self.backend is not None:
            return self.backend == "nccl"
        if not any(Path(dev).exists() for dev in CUDA_DEVICE_FILES):  # no NVIDIA driver: no CUDA, without torch
            return False
        import torch  # kept out of `pipesim run`'s start-up unless a GPU driver is there to ask

        return torch.cuda.is_available()

    def for_schedule(self, name: str) -> RunConfig:
        return replace(self, names=(name,))

    def to_dict(self) -> dict:
        """Plain JSON types; `from_dict` inverts it exactly (field by field, the model and the job nested)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        """The config `to_dict` gave (the model and the job nested); unknown keys are an error, missing ones take
        their defaults."""
        return dataclass_from_dict(cls, data, "run configuration")


EXECUTED = ("dims", "recompute", "sp")  # the Job fields the executor runs (cp only unset; ep: expert_checks)


def unhonoured(job: Job) -> list[str]:
    """The flags of `job`'s options the executor cannot run, as the user would give them (empty: it runs them all).

    The executor trains with plain DDP and eager torch modules (torch's scaled_dot_product_attention picks its own
    kernel): ZeRO, context parallelism, an attention kernel, the
    framework's communication switches (scatter-gather, bucketed overlapped gradient reduction, blocking P2P) and
    the GPU kernel switches are the cost model's."""
    dims = job.dims
    out = [f"--cp {job.cp}"] if job.cp > 1 else []  # ep and etp: executor.expert_checks
    # the executor's selective recomputation is the attention core's alone (Megatron-core's default module)
    out += [f"--recompute-modules {' '.join(job.recompute_modules)}"] if job.recompute_modules else []
    plain = Job(**{name: getattr(job, name) for name in EXECUTED})
    job = replace(job, recompute_modules=())  # listed above
    if job != plain:
        dense = replace(dims, ep=1, etp=None)  # executor.expert_checks judges them
        flags = replace(job, dims=dense, recompute="none", sp=False).flags()
        names = [f.name for f in fields(Job) if getattr(job, f.name) != getattr(plain, f.name)]
        out.append(" ".join(flags) if flags else ", ".join(names))  # a field without a flag: its name
    return out


def configs_to_json(cfgs: list[RunConfig]) -> str:
    """One JSON text for a chain of runs (what `python -m executor --config` reads)."""
    return json.dumps([cfg.to_dict() for cfg in cfgs], separators=(",", ":"))


def configs_from_json(text: str) -> list[RunConfig]:
    """The chain `configs_to_json` wrote (a single object is a chain of one)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PipesimError(f"cannot read the run configuration: {exc}") from None
    items = data if isinstance(data, list) else [data]
    if not items:
        raise PipesimError("the run configuration lists no run")
    return [RunConfig.from_dict(item) for item in items]


def check_transport_order(lowered: Schedule, *, nccl: bool) -> None:
    """NCCL pairs a rank pair's messages in issue order (gloo matches by tag): refuse a mismatch up front."""
    from pipesim.ir.schedule_check import fifo_mismatches  # networkx: kept out of `pipesim`'s start-up

    pairs = fifo_mismatches(lowered) if nccl else []
    if pairs:
        names = ", ".join(f"{a}->{b}" for a, b in pairs)
        raise PipesimError(
            f"{lowered.name}: ranks {names} receive in a different order than they send; NCCL matches messages "
            "in issue order (gloo, by tag, does not): reorder the RECVs or use --backend gloo"
        )
