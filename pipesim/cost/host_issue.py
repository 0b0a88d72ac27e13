"""How long the host takes to launch a stage's mixture-of-experts layers, and what its waits cost the GPU.

An action whose layers wait on the GPU (pipesim.model.host_ops) lasts at least as long as its host takes to launch
them and to return from its waits, `issue` = n LAUNCH_SECONDS + s SYNC_ROUND_TRIP per layer: the simulator floors its
seconds there (pipesim.sim.program). Each wait also leaves the GPU idle from its last queued kernel's end until the
host has seen it and its next launch lands: `waits` = s SYNC_GAP per layer, added to the GPU's seconds. An action
lasts max(G + waits, issue).

- LAUNCH_SECONDS: 7 us per launched op, the floor of any op in an eager PyTorch program on H100, "empirically
  obtained by minimizing the runtime over a set of examples on H100 GPUs" (meta-pytorch/autoparallel PR #146,
  2025-09-10, autoparallel/cost_models/compute_estimation.py's kernel_launch_overhead); PyTorch's issue #41383
  measured 6.8 us per op with autograd recording (5 us without) on a 2020 host. It includes the driver's launch,
  about 3 us alone (meta-pytorch/tritonbench PR #1017: cuLaunchKernel 3.0 us on GB200). A GEMM's launch costs the
  host more (cuBLAS picks its algorithm): NVIDIA's own CPU-overhead microbenchmark (NVIDIA/dgxc-benchmarking
  v26.06.01 microbenchmarks/cpu_overhead, tiny torch.matmul back to back) prints 11-18 us per launch in its sample
  output, on a platform it does not name; pipesim charges every launch the 7 us.
- A hardware file's `host_launch` replaces LAUNCH_SECONDS for its hosts: the Grace CPU of a GB200 or GB300 tray
  (pipesim/presets/gb200-nvl72.toml) takes 2.75 times as long per op as an H100 DGX's Xeon.
- SYNC_ROUND_TRIP: 10 us from a kernel's end to the host's return from the wait, the least of 2,000 measured 4-byte
  device-to-host copies with a stream synchronize on an RTX 5090 (kekzl/imp issue #1654: minimum 9.2-9.7 us,
  median 31-32 us). No H100 host figure is published; the minimum is the one a busy-waiting host (DeepEP's spin)
  comes closest to.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.model.config import ModelConfig
from pipesim.model.host_ops import moe_layer_host_ops
from pipesim.model.options import LayerOptions

LAUNCH_SECONDS = 7e-6  # seconds per op the host launches (autoparallel PR #146, H100)
SYNC_ROUND_TRIP = 10e-6  # seconds from the GPU's last kernel to the waiting host's return (kekzl/imp #1654)


def sync_gap(launch: float = LAUNCH_SECONDS) -> float:
    """Seconds the GPU idles per wait: the round trip, then one launch by a host taking `launch` seconds per op."""
    return SYNC_ROUND_TRIP + launch


SYNC_GAP = sync_gap()  # an x86 host's


@dataclass(frozen=True)
class HostIssue:
    """Per F, I, W of one microbatch on one stage: the host's launch seconds and the GPU's idle seconds at waits."""

    issue: tuple[float, float, float]  # seconds
    waits: tuple[float, float, float]  # seconds


NO_HOST_ISSUE = HostIssue((0.0, 0.0, 0.0), (0.0, 0.0, 0.0))


def stage_host_issue(model: ModelConfig, opts: LayerOptions, moe_layers: int,
                     launch: float | None = None) -> HostIssue:
    """The stage's `HostIssue` from its `moe_layers` MoE layers (dense layers' hosts run ahead: none), its host
    taking `launch` seconds per op (a hardware file's `host_launch`; None: LAUNCH_SECONDS)."""
    if not moe_layers:
        return NO_HOST_ISSUE
    launch = LAUNCH_SECONDS if launch is None else launch
    ops = moe_layer_host_ops(model, opts)
    launches = (ops.launches_f, ops.launches_i, ops.launches_w)
    syncs = (ops.syncs_f, ops.syncs_i, 0)
    return HostIssue(tuple(moe_layers * (n * launch + s * SYNC_ROUND_TRIP)
                           for n, s in zip(launches, syncs, strict=True)),
                     tuple(moe_layers * s * sync_gap(launch) for s in syncs))


__all__ = ["LAUNCH_SECONDS", "NO_HOST_ISSUE", "SYNC_GAP", "SYNC_ROUND_TRIP", "HostIssue", "stage_host_issue",
           "sync_gap"]
