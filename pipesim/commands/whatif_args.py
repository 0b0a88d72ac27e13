"""The what-if flags (`--slow`, `--slow-link`, `--jitter`, `--jitter-seed`) shared by `simulate` and `sweep`, and the
report lines they add (`pipesim.sim.blame`'s loss of time and who waited on whom)."""

from __future__ import annotations

import argparse

from pipesim.commands.arg_types import bounded_int
from pipesim.errors import PipesimError
from pipesim.sim.perturb import Perturbation, parse_slow, parse_slow_link


def add_whatif_args(parser: argparse.ArgumentParser) -> None:
    """--slow RANK=FACTOR, --slow-link A-B=FACTOR (repeatable), --jitter SIGMA, --jitter-seed N."""
    g = parser.add_argument_group("what if (docs/whatif.md): stragglers, slow links, jitter")
    g.add_argument("--slow", action="append", default=[], metavar="RANK=FACTOR",
                   help="pipeline rank RANK's compute takes FACTOR times as long (repeatable), e.g. 3=1.5")
    g.add_argument("--slow-link", action="append", default=[], metavar="A-B=FACTOR",
                   help="messages between pipeline ranks A and B take FACTOR times as long, both ways (repeatable)")
    g.add_argument("--jitter", type=float, default=0.0, metavar="SIGMA",
                   help="every compute action's seconds times exp(SIGMA z), z ~ N(0,1): lognormal, median 1 "
                        "(e.g. 0.1: about 10 %% spread); default 0")
    g.add_argument("--jitter-seed", type=lambda t: bounded_int(t, 0), default=None, metavar="N",
                   help="with --jitter: seed of the jitter's draws (default 0): one seed, one result")


def perturbation_from_args(args: argparse.Namespace) -> Perturbation | None:
    """The Perturbation the flags ask for, or None when they ask for none. Bad values: PipesimError."""
    slow = tuple(parse_slow(t) for t in args.slow)
    links = tuple(parse_slow_link(t) for t in args.slow_link)
    if args.jitter < 0 or args.jitter != args.jitter:
        raise PipesimError(f"--jitter must be a sigma >= 0, got {args.jitter:g}")
    if args.jitter_seed is not None and not args.jitter:  # nothing is drawn without it
        raise PipesimError("--jitter-seed seeds --jitter's draws: it needs --jitter SIGMA > 0")
    seed = 0 if args.jitter_seed is None else args.jitter_seed
    pert = Perturbation(slow=slow, slow_links=links, jitter=args.jitter, seed=seed)
    return pert if pert else None


def whatif_lines(report: dict, limit: int = 6) -> list[str]:
    """The human-readable lines of a `pipesim.sim.blame.what_if` report."""
    lines = [f"what if {report['perturbation']}: step {report['step_time'] * 1e3:.3f} ms vs "
             f"{report['baseline_step_time'] * 1e3:.3f} ms unperturbed, {report['loss'] * 1e3:+.3f} ms "
             f"({report['loss_fraction'] * 100:+.1f} %)"]
    culprits = [(k, v) for k, v in report["extra_wait_by_culprit"].items() if v > 1e-12]
    if culprits:
        lines.append("extra waiting, by whom it was caused: " + ", ".join(f"{k} {v * 1e3:.3f} ms"
                                                                        for k, v in culprits[:limit]))
    rows = [w for w in report["waits"] if w["extra"] > 1e-12][:limit]
    for w in rows:
        lines.append(f"  rank {w['rank']} waited {w['extra'] * 1e3:.3f} ms more on {w['waited_on']} "
                     f"({w['seconds'] * 1e3:.3f} ms in all)")
    return lines


__all__ = ["add_whatif_args", "perturbation_from_args", "whatif_lines"]
