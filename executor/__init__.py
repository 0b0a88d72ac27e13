"""The executor: runs pipesim's schedule objects for real under torchrun.

A per-rank interpreter walks that rank's lowered program (`add_p2p(schedule).programs[rank]`);
no schedule logic lives here. Launch with `pipesim run ...` or
`torchrun --nproc-per-node N -m executor --config JSON` (see docs/executor.md).
"""

from __future__ import annotations

__all__ = ["RunConfig"]

from executor.run_config import RunConfig
