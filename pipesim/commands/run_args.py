"""`pipesim run`'s flags and the `RunConfig`s they make: the run, then each `--then` run after it.

Each run's layout and layer options are one `Job` (pipesim.job), built here from --stages, --dp, --tp,
--ep, --sequence-parallel and --recompute and passed whole to the executor.
"""

from __future__ import annotations

import argparse

import schedules
from executor.run_config import FAIL_MODES, RunConfig
from pipesim.commands.arg_types import positive_int
from pipesim.commands.common import (
    DEFAULT_MICROBATCHES,
    add_model_args,
    add_output_args,
    add_router_args,
    add_schedule_args,
    add_structure_group,
    layer_split_list,
    model_config,
    user_model_config,
)
from pipesim.commands.split_args import add_split_args, split_rule, typed_split
from pipesim.cost.user_model_costs import is_factory_spec
from pipesim.errors import PipesimError
from pipesim.ir import torch_csv
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.options import RECOMPUTE
from pipesim.model.pipeline_split import schedule_split
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.perturb import parse_slow


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """The flags of one run (the same after each `--then`)."""
    add_schedule_args(parser, microbatch_size=True)
    for action in parser._actions:  # one meaning for --stages everywhere; only its default differs here
        if action.dest == "stages":
            action.help = "pipeline ranks (default WORLD_SIZE / (dp * tp))"
    add_model_args(parser)
    add_structure_group(parser)
    add_output_args(parser)
    g = parser.add_argument_group("run")
    g.add_argument("--dp", type=positive_int, default=1, help="data-parallel replicas (default 1)")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks per stage (default 1)")
    g.add_argument("--ep", type=positive_int, default=1, metavar="N",
                   help="expert-parallel ranks: --model moe's experts sharded over N ranks of a stage (Megatron-core's "
                        "--expert-model-parallel-size; pipesim simulate's --ep) (default 1)")
    g.add_argument("--etp", type=positive_int, default=None, metavar="N",
                   help="--model moe: tensor parallelism inside each expert (Megatron-core's "
                        "--expert-tensor-parallel-size; default --tp); the executor runs 1")
    add_router_args(g)
    g.add_argument("--no-a2a-overlap", dest="a2a_overlap", action="store_false",
                   help="--model moe with --ep: run an overlapped F&B pair's halves back to back instead of issuing "
                        "the forward's all-to-all before the backward (the overlap's baseline)")
    g.add_argument("--layer-split", type=layer_split_list, default=None, metavar="N,N,...",
                   help="layers per stage, e.g. 3,2,2,1 (default: even split, earlier stages take the remainder)")
    add_split_args(g)
    g.add_argument("--steps", type=positive_int, default=3, help="training steps (default 3)")
    g.add_argument("--warmup", type=int, default=1, help="steps left out of step_time (default 1)")
    g.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    g.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    g.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="process-group backend (default nccl with CUDA, else gloo)")
    g.add_argument("--pg-timeout", type=float, default=60.0, metavar="S",
                   help="seconds a blocked receive or collective waits before the run fails (default 60)")
    g.add_argument("--sequence-parallel", action="store_true", help="TP with sequence parallelism (gpt)")
    g.add_argument("--recompute", choices=[r for r in RECOMPUTE if r != "op"], default="none",
                   help="activation recomputation (torch.utils.checkpoint, non-reentrant): full re-runs each layer's "
                        "forward in its backward, selective only gpt's attention core (default none)")
    g.add_argument("--bucket-bytes", type=positive_int, default=None, help="DP all-reduce bucket size in bytes")
    g.add_argument("--save-dir", default=None, help="write each rank's final parameters and the result here")
    g.add_argument("--quiet", action="store_true", help="no progress bar or per-step lines")
    g.add_argument("--hardware", metavar="PRESET|FILE", default=None,
                   help="zb-auto / zb-2p: the machine whose simulated costs order them (default local-cpu under "
                        "gloo, dgx-h100 under NCCL)")
    g.add_argument("--ilp", type=float, nargs="?", const=10.0, default=None, metavar="SECONDS",
                   dest="ilp_time_limit",
                   help="zb-auto / zb-2p: also search their order by the Zero Bubble paper's ILP for up to SECONDS "
                        "(default 10)")
    g.add_argument("--then", nargs=argparse.REMAINDER, default=None, metavar="NAME ...",
                   help="afterwards run another configuration (same flags; backend and --pg-timeout as here) "
                        "in the same process group, paying the start-up once")
    g.add_argument("--slow", action="append", default=[], metavar="RANK=FACTOR",
                   help="what if (docs/whatif.md): global rank RANK's compute takes FACTOR (>= 1) times as long, the "
                        "extra time slept after each action (repeatable)")
    f = parser.add_argument_group("fault injection (tests)")
    f.add_argument("--fail-rank", type=int, default=None, help="global rank that fails")
    f.add_argument("--fail-at", default=None, metavar="ACTION", help="action where it fails, e.g. 1F3")
    f.add_argument("--fail-mode", choices=FAIL_MODES, default=None,
                   help="with --fail-at: raise (default), SIGKILL itself, or hang")


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


def job_from_args(args: argparse.Namespace) -> Job:
    """The run's one Job: its layout (pp only when --stages is given; else `RunConfig.job_for` sets it from the
    world) and layer options."""
    dims = ParallelDims(pp=args.stages or 1, dp=args.dp, tp=args.tp, ep=args.ep, etp=args.etp)
    return Job(dims=dims, recompute=args.recompute, sp=args.sequence_parallel)


def rule_split(args: argparse.Namespace, names: tuple[str, ...], model: ModelConfig | None) -> list[int] | None:
    """The layers per chunk the split flags give (pipesim.model.pipeline_split, as simulate cuts them), resolved here
    for the named schedules' placement; None without a split flag."""
    typed = typed_split(args)
    if not typed:
        return None
    rule = split_rule(args, typed, model, explicit=args.layer_split is not None)
    if args.stages is None or not names:
        raise PipesimError(f"{typed[0]} needs --stages and a schedule NAME here (the executor sets the stages from "
                           "the world otherwise): or give --layer-split")
    splits = set()
    for name in names:
        sched = schedules.build(name, args.stages, args.microbatches, args.virtual or 1)
        splits.add(tuple(schedule_split(rule, model, sched)))
    if len(splits) > 1:
        raise PipesimError(f"{typed[0]} cuts the schedules' stages differently: run them one at a time")
    return list(splits.pop())


def _microbatches(args: argparse.Namespace, model: ModelConfig) -> int:
    """m per step: --microbatch-size's (m = batch / (dp x N), as simulate resolves it), --microbatches', else a CSV's
    own count (RunConfig checks a typed one against it), else 8."""
    sched = torch_csv.load(args.from_csv) if args.from_csv else None
    if args.microbatch_size is None:
        return args.microbatches or (sched.num_microbatches if sched else DEFAULT_MICROBATCHES)
    m = model.microbatches_for(args.dp, microbatches=args.microbatches, microbatch_size=args.microbatch_size,
                               default_batch=args.batch is None)
    if sched is not None:
        torch_csv.check_csv_counts(sched, args.from_csv, microbatches=m, microbatch_size=args.microbatch_size)
    return m


def config_from_args(args: argparse.Namespace) -> RunConfig:
    names = tuple(n.strip() for n in args.name.split(",") if n.strip()) if args.name else ()
    factory = args.model if is_factory_spec(args.model) else None  # --model MODULE:FACTORY (cost.user_model_costs)
    slow = [parse_slow(text) for text in args.slow]
    model = user_model_config(args) if factory else model_config(args)
    args.microbatches = _microbatches(args, model)
    split = rule_split(args, names, None if factory else model) or args.layer_split  # refuses the two together
    if args.dropout:  # typed: a switch the executor cannot honour (a GPT's default dropout is the cost model's figure)
        raise PipesimError("--dropout: the executor trains without dropout (pipesim simulate costs it)")
    if args.fail_mode is not None and args.fail_at is None:  # RunConfig.check pairs --fail-rank and --fail-at
        raise PipesimError(f"--fail-mode {args.fail_mode} says how --fail-at's action fails: give it with "
                           "--fail-rank and --fail-at")
    return RunConfig(
        names=names, csv=args.from_csv, stages=args.stages, microbatches=args.microbatches, virtual=args.virtual,
        job=job_from_args(args), model=model, factory=factory,
        layer_split=tuple(split) if split else None, steps=args.steps, warmup=args.warmup,
        optimizer=args.optimizer, lr=args.lr, backend=args.backend, pg_timeout=args.pg_timeout,
        bucket_bytes=args.bucket_bytes, json=args.json, trace=args.trace,
        save_dir=args.save_dir, fail_rank=args.fail_rank, fail_at=args.fail_at, fail_mode=args.fail_mode or "raise",
        quiet=args.quiet, a2a_overlap=args.a2a_overlap, slow_ranks=tuple(r for r, _ in slow),
        slow_factors=tuple(f for _, f in slow),
    )
