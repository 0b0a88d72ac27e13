"""`pipesim run`'s launcher: torchrun running `-m executor --config JSON` on this node.

One node: `--standalone` (free rendezvous port). Several: torchrun's c10d rendezvous at a given
endpoint, the same command on every node. Ranks get `rank_environment()`: OMP_NUM_THREADS 1 (so
ranks do not fight over cores) and glibc malloc fixed to keep tensors of up to 32 MiB in the heap.
torchrun runs under `executor.supervisor` (signals forwarded, no orphan, one failure line); its
output and the ranks' status files live in a run directory that is removed when the run succeeds.
"""

from __future__ import annotations

import os
import sys

from executor.run_config import RunConfig, configs_to_json
from executor.supervisor import run_reported


def torchrun_command(cfgs: RunConfig | list[RunConfig], nproc: int, *, nnodes: int = 1,
                     rdzv_endpoint: str | None = None) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m executor --config JSON`.

    With `rdzv_endpoint` (HOST:PORT), `--nnodes K --rdzv-backend c10d --rdzv-endpoint HOST:PORT` replace
    `--standalone`: run the same command on each of the K nodes.
    """
    chain = [cfgs] if isinstance(cfgs, RunConfig) else list(cfgs)
    if rdzv_endpoint is None:
        where = ["--standalone"]
    else:
        where = ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint]
    return [sys.executable, "-m", "torch.distributed.run", *where, "--nproc-per-node", str(nproc),
            "-m", "executor", "--config", configs_to_json(chain)]


# glibc's default serves allocations above a threshold with mmap and moves that threshold as blocks
# are freed, so each process ends up in its own state: a rank whose weight gradients (4 MiB per layer
# of the lecture MLP) come from fresh mmaps pays page faults and zeroing on every backward. Measured
# on the 2-core dev VM, 3-rank naive, lecture MLP: stage 0's backward 9.0-9.8 ms -> 5.4-6.2 ms, the
# step 251-267 ms -> 199-228 ms. A fixed threshold (which also turns the moving one off) and a high
# trim threshold keep every rank in the same, faster state; PyTorch's CPU tuning guide makes the same
# point with jemalloc or tcmalloc.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def rank_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for torchrun and its ranks: `base` (default os.environ) plus defaults it lacks."""
    env = dict(os.environ if base is None else base)
    for key, value in {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **MALLOC_ENV}.items():
        env.setdefault(key, value)
    return env


def launch(cfgs: RunConfig | list[RunConfig], nproc: int, *, nnodes: int = 1, rdzv_endpoint: str | None = None,
           verbose: bool = False) -> int:
    """Run torchrun and wait; returns its exit code, or 128 + the signal that interrupted it.

    A failure or an interruption ends with one `pipesim: ...` line on stderr (naming the rank that
    failed first, and the log with torchrun's own output, which is kept).
    """
    chain = [cfgs] if isinstance(cfgs, RunConfig) else list(cfgs)
    return run_reported(torchrun_command(chain, nproc, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint),
                        rank_environment(), prefix="pipesim-run-", publish_status=True, verbose=verbose,
                        pg_timeout=chain[0].pg_timeout)
