"""Run configuration, checked before any process group exists.

`RunConfig` is built at the edge (`pipesim run`'s flags, pipesim.commands.run_args) and crosses to
the torchrun workers as JSON (`to_dict`/`from_dict`, derived from the dataclass fields): one
spelling of every field. Errors show the arithmetic (`dp(2) * pp(2) * tp(2) != WORLD_SIZE(6)`) and
reach the user as one line with exit code 2, both from `pipesim run` (before torchrun starts) and
from `python -m executor`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path

import schedules
from pipesim.errors import PipesimError
from pipesim.ir import torch_csv
from pipesim.ir.schedule import Action, Schedule
from pipesim.model.config import ModelConfig, split_layers
from pipesim.model.options import RECOMPUTE  # one vocabulary with simulate/sweep (executed by models.set_recompute)
from pipesim.parallel_dims import ParallelDims

FAIL_MODES = ("raise", "kill", "hang")
# the NVIDIA driver's device nodes (Linux; /dev/dxg under WSL 2): without any of them CUDA cannot be available
CUDA_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs; `names` may hold several schedules run one after another."""

    names: tuple[str, ...] = ()  # registered schedules (empty when `csv` is given)
    csv: str | None = None  # torch.distributed.pipelining schedule CSV instead of names
    stages: int | None = None  # pipeline ranks P; default WORLD_SIZE / (dp * tp)
    microbatches: int = 8
    virtual: int | None = None  # chunks per rank (interleaved schedules only)
    dp: int = 1
    tp: int = 1
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
    sequence_parallel: bool = False
    recompute: str = "none"  # none | selective (gpt's attention core) | full (every layer)
    bucket_bytes: int | None = None  # DP all-reduce bucket size; None = one all-reduce per parameter set
    json: str | None = None
    trace: str | None = None
    save_dir: str | None = None  # each rank writes its final parameters and the result here
    fail_rank: int | None = None  # fault injection (tests): this rank fails ...
    fail_at: str | None = None  # ... at this action (torch notation, e.g. 1F3) ...
    fail_mode: str = "raise"  # ... by raising, SIGKILL-ing itself, or hanging
    quiet: bool = False

    def pp_size(self, world: int) -> int:
        if self.stages is not None:
            return self.stages
        if world % (self.dp * self.tp):
            raise PipesimError(f"WORLD_SIZE({world}) is not divisible by dp({self.dp}) * tp({self.tp})")
        return world // (self.dp * self.tp)

    def dims(self, world: int) -> ParallelDims:
        """The grid's sizes on `world` ranks (pp defaults to what dp and tp leave)."""
        return ParallelDims(pp=self.pp_size(world), dp=self.dp, tp=self.tp)

    def check(self, world: int) -> list[Schedule]:
        """Validate against the world size; return the schedules to run (validated IR)."""
        self.dims(world).check_world(world)
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
        if self.fail_mode not in FAIL_MODES:
            raise PipesimError(f"unknown --fail-mode {self.fail_mode!r}; choose {', '.join(FAIL_MODES)}")
        if self.fail_at is not None:
            Action.parse(self.fail_at)
        if self.recompute not in RECOMPUTE:
            raise PipesimError(f"unknown --recompute {self.recompute!r}; choose {', '.join(RECOMPUTE)}")
        if self.recompute == "selective" and self.model.kind != "gpt":
            raise PipesimError("--recompute selective re-runs the attention core, which --model mlp does not have; "
                               "use --recompute full")
        if self.factory is not None:
            for flag, plain, value in (("--tp", 1, self.tp), ("--sequence-parallel", False, self.sequence_parallel),
                                       ("--recompute", "none", self.recompute)):
                if value != plain:
                    raise PipesimError(f"{flag} needs pipesim's own --model mlp or gpt, not --model {self.factory}")
        elif self.tp > 1 and self.model.hidden % self.tp:
            raise PipesimError(f"--hidden {self.model.hidden} is not divisible by tp({self.tp})")
        if self.tp > 1 and self.model.kind == "gpt" and self.model.heads % self.tp:
            raise PipesimError(f"--heads {self.model.heads} is not divisible by tp({self.tp})")
        pp = self.pp_size(world)
        built = [self._schedule(name, pp) for name in (self.names or (None,))]
        m = self.microbatches
        if self.model.batch % (self.dp * m):
            raise PipesimError(f"--batch {self.model.batch} does not split into dp({self.dp}) * "
                               f"microbatches({m}) = {self.dp * m} equal parts")
        if self.sequence_parallel and self.model.batch % (self.dp * m * self.tp):
            raise PipesimError(f"--sequence-parallel splits each microbatch over tp: --batch {self.model.batch} does "
                               f"not split into dp({self.dp}) * microbatches({m}) * tp({self.tp}) equal parts")
        for sched in built if self.factory is None else ():  # a factory's layers are counted when it is called
            split = self.layers_per_stage(sched.model_stages)  # DualPipe: 2 chains of p stages, p chunks
            if self.tp > 1 and self.model.kind == "mlp" and any(n % 2 for n in split):
                raise PipesimError(f"tensor parallel MLP pairs column- and row-parallel layers: layers per stage "
                                   f"{split} must all be even")
        return built

    def layers_per_stage(self, num_stages: int) -> list[int]:
        weights = list(self.layer_split) if self.layer_split else None  # a chunk may hold no layer (an identity stage)
        return split_layers(self.model.layers, num_stages, weights)

    def _schedule(self, name: str | None, pp: int) -> Schedule:
        from pipesim.ir.schedule_check import validate  # networkx: kept out of `pipesim`'s start-up

        if name is not None and self.csv:
            raise PipesimError("give a schedule NAME or --from-csv FILE, not both")
        if name is None and not self.csv:
            raise PipesimError(f"name a schedule ({', '.join(schedules.names())}) or give --from-csv FILE")
        if self.csv:
            sched = torch_csv.load(self.csv)
            if sched.num_ranks != pp:
                raise PipesimError(f"{self.csv} has {sched.num_ranks} ranks but the run has pp({pp}) pipeline ranks")
            if sched.num_microbatches != self.microbatches:
                sched_m = sched.num_microbatches
                raise PipesimError(f"{self.csv} has {sched_m} microbatches but --microbatches is {self.microbatches}")
        else:
            v = self.virtual if (self.virtual and schedules.spec(name).virtual) else None
            if self.virtual and len(self.names) == 1:
                v = self.virtual  # let the registry reject --virtual for a one-chunk schedule
            sched = schedules.build(name, pp, self.microbatches, v)
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
        """Plain JSON types; `from_dict` inverts it (field by field, the model nested)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        """The config `to_dict` gave; unknown keys are an error, missing ones take their defaults."""
        return dataclass_from_dict(cls, data, "run configuration")


def dataclass_from_dict(cls, data: object, what: str):
    """`cls(**data)` from JSON: lists back to tuples, a dict back to a nested dataclass field (its default factory)."""
    if not isinstance(data, dict):
        raise PipesimError(f"a {what} is a JSON object, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise PipesimError(f"unknown {what} field(s): {', '.join(unknown)}")
    kw = {}
    for name, value in data.items():
        factory = known[name].default_factory
        if is_dataclass(factory) and isinstance(value, dict):
            value = dataclass_from_dict(factory, value, f"{what} {name}")  # e.g. RunConfig.model
        elif isinstance(value, list):
            value = tuple(value)  # JSON has no tuples
        kw[name] = value
    return cls(**kw)


def config_argument(argv: list[str], usage: str) -> str:
    """The JSON text of a worker's one argument, `--config JSON` or `--config FILE`."""
    if len(argv) != 2 or argv[0] != "--config":
        raise PipesimError(f"{usage}; got {' '.join(argv) or 'no arguments'}")
    text = argv[1]
    if text.lstrip().startswith(("{", "[")):
        return text
    try:
        return Path(text).read_text()
    except OSError as exc:
        raise PipesimError(f"cannot read {text}: {exc.strerror}") from None


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
