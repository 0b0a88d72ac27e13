"""`pipesim run`'s launcher: torchrun on this node (`--standalone`, free rendezvous port) running `-m executor`.

The exit code of torchrun is passed through; OMP_NUM_THREADS defaults to 1 per rank on CPU so the
ranks do not fight over cores.
"""

from __future__ import annotations

import os
import subprocess
import sys

from executor.config import RunConfig, chain_argv


def torchrun_command(cfgs: RunConfig | list[RunConfig], nproc: int) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m executor ...` (`--then` between runs)."""
    chain = [cfgs] if isinstance(cfgs, RunConfig) else list(cfgs)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "executor", *chain_argv(chain)]


def launch(cfgs: RunConfig | list[RunConfig], nproc: int) -> int:
    """Run torchrun and wait; returns its exit code (non-zero when any rank failed)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return subprocess.run(torchrun_command(cfgs, nproc), env=env, check=False).returncode
    except KeyboardInterrupt:
        return 130
