"""Run configuration, checked before any process group exists.

Errors show the arithmetic (`dp(2) * pp(2) * tp(2) != WORLD_SIZE(6)`) and reach the user as one line
with exit code 2, both from `pipesim run` (before torchrun starts) and from `python -m executor`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace

from pipesim.commands.common import (
    add_model_args,
    add_output_args,
    add_schedule_args,
    int_list,
    model_config,
    positive_int,
)
from pipesim.errors import PipesimError
from pipesim.ir import Action, Schedule
from pipesim.model_config import ModelConfig, split_layers

FAIL_MODES = ("raise", "kill", "hang")


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
    layer_split: tuple[int, ...] | None = None  # layers per stage, e.g. (3, 2, 2, 1)
    steps: int = 3
    warmup: int = 1  # first steps left out of step_time (still trained and reported); all count if steps <= warmup
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.01
    backend: str | None = None  # gloo | nccl; default nccl when CUDA is available, else gloo
    pg_timeout: float = 60.0  # seconds a blocked collective or recv waits before failing
    sequence_parallel: bool = False
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

    def check(self, world: int) -> list[Schedule]:
        """Validate against the world size; return the schedules to run (validated IR)."""
        pp = self.pp_size(world)
        if self.dp * pp * self.tp != world:
            raise PipesimError(f"dp({self.dp}) * pp({pp}) * tp({self.tp}) != WORLD_SIZE({world})")
        if self.warmup < 0:
            raise PipesimError(f"--warmup must be >= 0, got {self.warmup}")
        if self.optimizer not in ("sgd", "adam"):
            raise PipesimError(f"unknown --optimizer {self.optimizer!r}; choose sgd or adam")
        if self.backend not in (None, "gloo", "nccl"):
            raise PipesimError(f"unknown --backend {self.backend!r}; choose gloo or nccl")
        if self.backend == "nccl":
            import torch

            if torch.cuda.device_count() < 1:
                raise PipesimError("--backend nccl needs CUDA GPUs and this machine has none; use --backend gloo")
        if self.fail_mode not in FAIL_MODES:
            raise PipesimError(f"unknown --fail-mode {self.fail_mode!r}; choose {', '.join(FAIL_MODES)}")
        if self.fail_at is not None:
            Action.parse(self.fail_at)
        if self.tp > 1 and self.model.hidden % self.tp:
            raise PipesimError(f"--hidden {self.model.hidden} is not divisible by tp({self.tp})")
        if self.tp > 1 and self.model.kind == "gpt" and self.model.heads % self.tp:
            raise PipesimError(f"--heads {self.model.heads} is not divisible by tp({self.tp})")
        built = [self._schedule(name, pp) for name in (self.names or (None,))]
        m = self.microbatches
        if self.model.batch % (self.dp * m):
            raise PipesimError(f"--batch {self.model.batch} does not split into dp({self.dp}) * "
                               f"microbatches({m}) = {self.dp * m} equal parts")
        if self.sequence_parallel and self.model.batch % (self.dp * m * self.tp):
            raise PipesimError(f"--sequence-parallel splits each microbatch over tp: --batch {self.model.batch} does "
                               f"not split into dp({self.dp}) * microbatches({m}) * tp({self.tp}) equal parts")
        for sched in built:
            split = self.layers_per_stage(sched.num_stages)
            if self.tp > 1 and self.model.kind == "mlp" and any(n % 2 for n in split):
                raise PipesimError(f"tensor parallel MLP pairs column- and row-parallel layers: layers per stage "
                                   f"{split} must all be even")
        return built

    def layers_per_stage(self, num_stages: int) -> list[int]:
        weights = list(self.layer_split) if self.layer_split else None
        return split_layers(self.model.layers, num_stages, weights)

    def _schedule(self, name: str | None, pp: int) -> Schedule:
        import schedules
        from pipesim import torch_csv
        from pipesim.validate import validate

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
        import torch

        return torch.cuda.is_available()

    def for_schedule(self, name: str) -> RunConfig:
        return replace(self, names=(name,))

    def to_argv(self) -> list[str]:
        """Flags for `python -m executor` that rebuild this config (used by `pipesim run`)."""
        m = self.model
        argv = [",".join(self.names)] if self.names else ["--from-csv", str(self.csv)]
        argv += ["--microbatches", str(self.microbatches), "--dp", str(self.dp), "--tp", str(self.tp)]
        if self.stages is not None:
            argv += ["--stages", str(self.stages)]
        if self.virtual is not None:
            argv += ["--virtual", str(self.virtual)]
        argv += ["--model", m.kind, "--hidden", str(m.hidden), "--layers", str(m.layers), "--heads", str(m.heads),
                 "--seq", str(m.seq), "--vocab", str(m.vocab), "--batch", str(m.batch), "--dtype", m.dtype,
                 "--seed", str(m.seed)]
        if self.layer_split:
            argv += ["--layer-split", ",".join(map(str, self.layer_split))]
        argv += ["--steps", str(self.steps), "--warmup", str(self.warmup), "--optimizer", self.optimizer,
                 "--lr", repr(self.lr), "--pg-timeout", repr(self.pg_timeout), "--fail-mode", self.fail_mode]
        optional = {"--backend": self.backend, "--json": self.json, "--trace": self.trace,
                    "--save-dir": self.save_dir, "--fail-rank": self.fail_rank, "--fail-at": self.fail_at,
                    "--bucket-bytes": self.bucket_bytes}
        for flag, value in optional.items():
            if value is not None:
                argv += [flag, str(value)]
        if self.sequence_parallel:
            argv.append("--sequence-parallel")
        if self.quiet:
            argv.append("--quiet")
        return argv


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `pipesim run` and `python -m executor`."""
    add_schedule_args(parser)
    parser.set_defaults(stages=None)
    for action in parser._actions:  # one meaning for --stages everywhere; only its default differs here
        if action.dest == "stages":
            action.help = "pipeline ranks (default WORLD_SIZE / (dp * tp))"
    add_model_args(parser)
    add_output_args(parser)
    g = parser.add_argument_group("run")
    g.add_argument("--dp", type=positive_int, default=1, help="data-parallel replicas (default 1)")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks per stage (default 1)")
    g.add_argument("--layer-split", type=int_list, default=None, metavar="N,N,...",
                   help="layers per stage, e.g. 3,2,2,1 (default: even split, earlier stages take the remainder)")
    g.add_argument("--steps", type=positive_int, default=3, help="training steps (default 3)")
    g.add_argument("--warmup", type=int, default=1, help="steps left out of step_time (default 1)")
    g.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    g.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    g.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="process-group backend (default nccl with CUDA, else gloo)")
    g.add_argument("--pg-timeout", type=float, default=60.0, metavar="S",
                   help="seconds a blocked receive or collective waits before the run fails (default 60)")
    g.add_argument("--sequence-parallel", action="store_true", help="TP with sequence parallelism (gpt)")
    g.add_argument("--bucket-bytes", type=positive_int, default=None, help="DP all-reduce bucket size in bytes")
    g.add_argument("--save-dir", default=None, help="write each rank's final parameters and the result here")
    g.add_argument("--quiet", action="store_true", help="no progress bar or per-step lines")
    g.add_argument("--then", nargs=argparse.REMAINDER, default=None, metavar="NAME ...",
                   help="afterwards run another configuration (same flags; backend and --pg-timeout as here) "
                        "in the same process group, paying the start-up once")
    f = parser.add_argument_group("fault injection (tests)")
    f.add_argument("--fail-rank", type=int, default=None, help="global rank that fails")
    f.add_argument("--fail-at", default=None, metavar="ACTION", help="action where it fails, e.g. 1F3")
    f.add_argument("--fail-mode", choices=FAIL_MODES, default="raise", help="raise, SIGKILL itself, or hang")


class _ThenParser(argparse.ArgumentParser):
    """Parses the flags after `--then`; a mistake there is a PipesimError (one line, exit 2)."""

    def error(self, message: str):  # noqa: D401
        raise PipesimError(f"after --then: {message}")


def configs_from_args(args: argparse.Namespace) -> list[RunConfig]:
    """The run and every `--then` run after it; the process-group settings must agree across them."""
    first = config_from_args(args)
    cfgs = [first]
    rest = args.then
    while rest is not None:
        parser = _ThenParser(prog="--then", add_help=False)
        add_run_args(parser)
        parser.set_defaults(backend=first.backend, pg_timeout=first.pg_timeout)  # inherited unless given
        sub = parser.parse_args(rest)
        cfg = config_from_args(sub)
        if (cfg.backend, cfg.pg_timeout) != (first.backend, first.pg_timeout):
            raise PipesimError("--backend and --pg-timeout set up the one process group: give them before --then")
        cfgs.append(cfg)
        rest = sub.then
    return cfgs


def chain_argv(cfgs: list[RunConfig]) -> list[str]:
    """Flags for `python -m executor` that rebuild these configs (joined by `--then`)."""
    argv = cfgs[0].to_argv()
    for cfg in cfgs[1:]:
        argv += ["--then", *cfg.to_argv()]
    return argv


def config_from_args(args: argparse.Namespace) -> RunConfig:
    names = tuple(n.strip() for n in args.name.split(",") if n.strip()) if args.name else ()
    return RunConfig(
        names=names, csv=args.from_csv, stages=args.stages, microbatches=args.microbatches, virtual=args.virtual,
        dp=args.dp, tp=args.tp, model=model_config(args),
        layer_split=tuple(args.layer_split) if args.layer_split else None, steps=args.steps, warmup=args.warmup,
        optimizer=args.optimizer, lr=args.lr, backend=args.backend, pg_timeout=args.pg_timeout,
        sequence_parallel=args.sequence_parallel, bucket_bytes=args.bucket_bytes, json=args.json, trace=args.trace,
        save_dir=args.save_dir, fail_rank=args.fail_rank, fail_at=args.fail_at, fail_mode=args.fail_mode,
        quiet=args.quiet,
    )


def check_transport_order(lowered: Schedule, *, nccl: bool) -> None:
    """NCCL pairs a rank pair's messages in issue order (gloo matches by tag): refuse a mismatch up front."""
    from pipesim.validate import fifo_mismatches

    pairs = fifo_mismatches(lowered) if nccl else []
    if pairs:
        names = ", ".join(f"{a}->{b}" for a, b in pairs)
        raise PipesimError(
            f"{lowered.name}: ranks {names} receive in a different order than they send; NCCL matches messages "
            "in issue order (gloo, by tag, does not): reorder the RECVs or use --backend gloo"
        )
