"""`python -m executor --config JSON|FILE`: train pipesim schedules for real, one process per rank.

The worker reads its configuration as one argument: the JSON of a list of `RunConfig`s (a chain of
runs sharing one process group), spelled by `RunConfig.to_dict`. `pipesim run` writes it and starts
torchrun; it also takes torchrun's multi-node flags:

  pipesim run 1f1b --nproc 2 --microbatches 8 --model mlp --steps 4          # torchrun --standalone
  pipesim run interleaved-1f1b --nproc 8 --nnodes 2 --rdzv-endpoint HOST:29500 \\
      --virtual 2 --microbatches 16 --dp 2 --tp 2 --model gpt               # the same on every node
  pipesim run 1f1b --nproc 8 --microbatches 8 --print-config > run.json
  torchrun --nnodes 2 --nproc-per-node 4 ... -m executor --config run.json   # your own launcher

Configuration errors print one line and exit 2 before any process group is created.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from datetime import timedelta
from pathlib import Path

from executor import rank_status
from executor.config_json import config_argument
from executor.faults import die
from executor.progress_bar import Progress
from executor.run_config import RunConfig, configs_from_json
from pipesim.errors import PipesimError
from pipesim.outputs import write_text

USAGE = "usage: python -m executor --config JSON|FILE (the run configurations `pipesim run --print-config` writes)"


def read_configs(argv: list[str]) -> list[RunConfig]:
    """The chain of runs from `--config JSON` or `--config FILE`; PipesimError (one line) otherwise."""
    return configs_from_json(config_argument(argv, USAGE))


def _single_process_env() -> None:
    """Let `python -m executor` run without torchrun as a world of one."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    _single_process_env()
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    # Ctrl-C or a launcher's SIGINT ends a rank at once, like SIGTERM: no KeyboardInterrupt traceback per
    # rank, and no wait for a blocked receive to return to Python first
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    status = rank_status.open_from_env(rank)
    try:
        cfgs = read_configs(argv)
        plan = [(cfg, cfg.check(world)) for cfg in cfgs]
    except PipesimError as exc:
        if rank == 0:
            print(f"executor: error: {exc}", file=sys.stderr)
        return 2
    import torch  # torch and the modules built on it load after the checks: a bad config exits in a blink
    import torch.distributed as dist

    first = cfgs[0]
    backend = first.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if status is not None:
        status.phase(-1, "the rendezvous (process-group start-up)", rank_status.WAITING)
    dist.init_process_group(backend, timeout=timedelta(seconds=first.pg_timeout))
    try:
        run_chain(plan, world, rank, device, backend)
        if status is not None:
            status.phase(-1, "finished", rank_status.DONE)
    finally:
        dist.destroy_process_group()
    return 0


def run_chain(plan: list[tuple[RunConfig, list]], world: int, rank: int, device, backend: str) -> None:
    """Train each checked configuration in the process group that is already up (tests/launch_shared.py
    runs several test modules' chains in one launch this way); a failure ends the rank through `die`."""
    from executor.api import free_runtimes  # local imports: torch loads after the configuration checks (see main)
    from executor.mesh import build_mesh_for

    for cfg, schedules in plan:  # every rank builds every configuration's groups, in the same order
        mesh = build_mesh_for(cfg.job_for(world).dims)
        results = []
        for sched in schedules:
            try:
                results.append(_run_one(cfg, sched, mesh, device, backend))
            except Exception as exc:  # noqa: BLE001 - setup or result writing; training names its action
                die(rank, f"{sched.name} (setup or results)", exc)
        if rank == 0 and cfg.json:
            _write_json(cfg.json, results[0] if len(results) == 1 else {"runs": results})
    free_runtimes()  # before main's destroy_process_group (executor.api.free_runtimes says why)


def _write_json(target: str, data: dict) -> None:
    text = json.dumps(data, indent=2)
    if target == "-":
        print(text)
    else:
        write_text(target, text + "\n")  # atomic: a temp file in the same folder, then a rename


def _run_one(cfg: RunConfig, sched, mesh, device, backend: str) -> dict | None:
    """Train one schedule; rank 0 returns the result dict (and writes trace and saved results)."""
    import torch  # torch-backed modules load after the configuration checks (see main)

    from executor import timing
    from executor.api import execute

    label = sched.name
    status = rank_status.current()
    if status is not None:
        status.set_label(label)
        status.phase(-1, "setup (building the stages)")
    workload = None
    if cfg.factory:  # the user's model: pieces from the factory, boundary shapes inferred
        from executor.user_model import workload_of

        workload = workload_of(cfg)
    progress = Progress(label, cfg.steps) if (mesh.rank == 0 and not cfg.quiet) else None
    done = execute(cfg, sched, mesh, device, workload, progress,
                   on_trained=lambda: status.phase(cfg.steps - 1, "gathering the results", rank_status.WAITING)
                   if status is not None else None)
    rt, logs = done.runtime, done.logs
    if progress is not None:
        progress.close()
    params = rt.named_parameters() if cfg.save_dir else None
    if cfg.save_dir:
        out = Path(cfg.save_dir) / label
        out.mkdir(parents=True, exist_ok=True)
        torch.save(params, out / f"rank{mesh.rank}.pt")
    if mesh.rank != 0:
        return None
    losses = _losses(logs, mesh, rt.sp)
    times = timing.step_times(logs)
    result = {
        "schedule": label, "world_size": mesh.world, "dp": mesh.dp, "pp": mesh.pp, "tp": mesh.tp,
        "stages": sched.num_stages, "microbatches": sched.num_microbatches, "backend": backend,
        "device": str(device),
        "model": {"factory": cfg.factory, "batch": cfg.model.batch} if cfg.factory else cfg.model.to_dict(),
        "layers_per_stage": rt.workload.layers_per_stage(sched.model_stages), "steps": cfg.steps, "warmup": cfg.warmup,
        "microbatch_size": rt.mb_size, "sequence_parallel": rt.sp,
        "param_elements_per_rank": [lg.param_elements for lg in logs],
        "step_time": timing.median_step_time(times, cfg.warmup), "step_times": times, "losses": losses,
    }
    if cfg.slow_ranks:  # what-if: the ranks whose compute was stretched (a slowed run's trace says so too)
        result["slow"] = [{"rank": r, "factor": f} for r, f in zip(cfg.slow_ranks, cfg.slow_factors, strict=True)]
    if cfg.trace:
        meta = {k: v for k, v in result.items() if k not in ("losses",)}
        if sched.overlaps:  # OVERLAP_F_B pairs: run back to back here, drawn as one bar each
            meta["overlaps"] = sched.overlap_labels()
        timing.write_trace(timing.to_timeline(logs, label, meta), cfg.trace)
    if cfg.save_dir:
        write_text(Path(cfg.save_dir) / label / "result.json", json.dumps(result, indent=2) + "\n")
    return result


def _losses(logs, mesh, sp: bool) -> list[float]:
    """Per-step loss averaged over DP replicas (taken from TP rank 0 of each replica's last stage; summed over
    the pipeline ranks holding a last stage, DualPipe's two chains' ends, each of which scaled by 1/m)."""
    by_replica: dict[tuple[int, int, int], list[list[float]]] = {}
    for lg in logs:  # sequence parallel: TP ranks hold different rows, so all count
        c = mesh.dims.coords(lg.rank)
        if lg.losses and (sp or c.tp == 0):
            by_replica.setdefault((c.dp, c.cp, c.tp), []).append(lg.losses)
    per_replica = [[sum(step) for step in zip(*ends, strict=True)] for _, ends in sorted(by_replica.items())]
    steps = len(per_replica[0]) if per_replica else 0
    return [sum(r[i] for r in per_replica) / len(per_replica) for i in range(steps)]


def _exit_now(code: int) -> None:
    """Leave without interpreter teardown: torch's exit handlers took ~3 s per rank after training ended
    (measured on a 2-core box), which every launch paid; all output is written and flushed by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
