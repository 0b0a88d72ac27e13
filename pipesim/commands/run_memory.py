"""Before `pipesim run` launches CPU ranks: a model whose weights alone cannot fit in this machine's memory is refused
in one line, instead of its ranks swapping, being killed, or reported hung while they build their stages.

The bound is a floor, so it never refuses a run that could fit: each rank holds at least its share of the parameters
(the model's over pp x tp, the experts' over ep as well), each with its gradient and the optimizer's states (torch's
SGD none, Adam two of the parameter's dtype); activations, buffers and the interpreter come on top and are not
counted. The machine's memory is its physical memory (os.sysconf), as `pipesim bench` bounds its buffers.
"""

from __future__ import annotations

import os

from executor.run_config import RunConfig
from pipesim.errors import PipesimError
from pipesim.model.config import DTYPE_BYTES
from pipesim.model.param_counts import model_params

GIB = 2**30  # bytes


def machine_memory() -> int | None:
    """Bytes of physical memory, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def state_floor(cfg: RunConfig, world: int) -> int:
    """Bytes one rank holds at least: its parameter share with gradients and optimizer states."""
    dims = cfg.job_for(world).dims
    experts = dims.ep if cfg.model.moe is not None else 1
    share = model_params(cfg.model) / (dims.pp * dims.tp * experts)
    copies = 2 + (2 if cfg.optimizer == "adam" else 0)  # parameter and gradient, Adam's exp_avg and exp_avg_sq
    return int(share * copies * DTYPE_BYTES[cfg.model.dtype])


def check_host_memory(cfg: RunConfig, world: int, nproc: int, memory: int | None = None) -> None:
    """Refuse `cfg` when its `nproc` local ranks' `state_floor` exceeds this machine's memory (CPU ranks: gloo)."""
    if cfg.factory or cfg.backend == "nccl":  # the user's layers are sized by their factory; GPUs by their own memory
        return
    memory = machine_memory() if memory is None else memory
    if memory is None:
        return
    each = state_floor(cfg, world)
    if each * nproc > memory:
        held = "parameters, gradients and Adam's two states" if cfg.optimizer == "adam" else "parameters and gradients"
        raise PipesimError(f"the model's {held} alone need "
                           f"{each / GIB:.1f} GiB on each of the {nproc} ranks here ({each * nproc / GIB:.1f} GiB), "
                           f"more than this machine's {memory / GIB:.1f} GiB: give a smaller model, or more --stages "
                           "or --tp")


__all__ = ["check_host_memory", "machine_memory", "state_floor"]
