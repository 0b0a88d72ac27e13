"""This rank's pipeline messages: whom each SEND and RECV of its program talks to, how large it is, and how it is
posted and waited.

The runtime (executor.runtime) turns each SEND and RECV action into a call here. A RECV blocks until its buffer
(executor.p2p, allocated once) is filled; a SEND is an isend whose handle is kept and waited at the end of the
step (`wait_sends`; with `--trace` on gloo, by send_watch's threads, which stamp each completion). On NCCL a SEND
directly followed by a RECV is deferred and posted with that RECV in one `batch_isend_irecv` (`fuse_sends`).
Message shapes come from the model (one per boundary between stages), so no shape goes over the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist

from executor.mesh import Mesh
from executor.p2p import P2P
from executor.send_watch import SendWatcher
from pipesim.ir.schedule import Action, Kind, Schedule

Boundary = tuple[tuple[int, ...], torch.dtype]  # shape and dtype of the activation a stage sends on


class PipelineTransfers:
    """Receive buffers, the posted sends of the step, and (NCCL) the sends waiting for the next receive."""

    def __init__(self, schedule: Schedule, me: int, mesh: Mesh, model_boundaries: list[Boundary],
                 device: torch.device, *, trace: bool) -> None:
        """`schedule`: the lowered schedule (with its SENDs and RECVs); `me`: this rank's pipeline rank;
        `model_boundaries[k]`: what model stage k sends on, for this rank's rows of a microbatch; `trace`: stamp
        each send's completion (gloo only)."""
        self.schedule, self.me, self.mesh = schedule, me, mesh
        self.boundaries: list[Boundary | None] = [
            None if schedule.chain_last(s) else model_boundaries[schedule.model_stage(s)]
            for s in range(schedule.num_stages - 1)]  # out of stage s; None: the end of a chain sends nothing
        gloo = dist.get_backend() == "gloo"
        self.p2p = P2P(schedule, me, self.boundaries, device, use_tags=gloo)
        self.pending: list = []  # (work, tensor) of posted isends
        self.deferred: list = []  # NCCL: (P2POp, tensor) of sends fused with the next receive
        # trace on gloo: stamp each send's completion (a thread per peer waits them; see send_watch)
        self.watcher = SendWatcher() if trace and gloo else None

    def peer_of(self, action: Action) -> int:
        """Global rank on the other end of a P2P action."""
        return self.mesh.pp_peer(self.schedule.rank_of(action.peer_stage))

    def transfer_bytes(self, action: Action) -> int:
        """Bytes of a SEND or RECV: the activation out of the lower stage (its gradient is as large)."""
        shape, dtype = self.boundaries[min(action.stage, action.peer_stage)]
        return torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()  # bytes

    def fuse_sends(self, program: tuple[Action, ...], ops: list[Callable], outs: dict, gins: dict) -> None:
        """NCCL: a SEND directly followed by a RECV goes out in one batch_isend_irecv with it.

        NCCL serializes a rank pair's P2P on one stream, so two ranks that each send before receiving
        from the other would deadlock; a fused group cannot (torch's Schedule1F1B fuses the same way).
        `outs` and `gins` are where the runtime leaves activations and input gradients to send.
        """
        for idx, a in enumerate(program):
            if a.kind not in (Kind.SEND_F, Kind.SEND_B):
                continue
            nxt = next((b for b in program[idx + 1:] if b.kind not in (Kind.SEND_F, Kind.SEND_B)), None)
            if nxt is not None and nxt.kind in (Kind.RECV_F, Kind.RECV_B):
                source = outs if a.kind == Kind.SEND_F else gins
                ops[idx] = partial(self._defer, source, (a.stage, a.microbatch), self.peer_of(a))

    def _defer(self, source: dict, key: tuple[int, int], dst: int) -> None:
        tensor = source.pop(key)
        self.deferred.append((dist.P2POp(dist.isend, tensor, dst), tensor))

    def recv(self, buf: torch.Tensor, src: int, tag: int, into: dict, key: tuple[int, int], leaf: bool) -> None:
        """Receive into `buf` (with the deferred sends, if any), then hand it on as `into[key]`."""
        if self.deferred:
            works = dist.batch_isend_irecv([op for op, _ in self.deferred] + [dist.P2POp(dist.irecv, buf, src)])
            self.pending.extend(zip(works[:-1], [t for _, t in self.deferred], strict=True))
            self.deferred.clear()
            works[-1].wait()
        else:
            self.p2p.recv(buf, src, tag).wait()
        into[key] = buf.detach().requires_grad_() if leaf else buf

    def send(self, tensor: torch.Tensor, dst: int, tag: int, step: int, idx: int) -> None:
        """Post an isend of `tensor`; `step` and `idx` (the action's index) label its completion stamp."""
        work = self.p2p.send(tensor, dst, tag)
        self.pending.append((work, tensor))
        if self.watcher is not None:
            self.watcher.watch(work, dst, step, idx)

    def wait_sends(self) -> None:
        """The end of a step: every posted send complete."""
        if self.watcher is not None:
            self.watcher.drain()
        else:
            for work, _ in self.pending:
                work.wait()
        self.pending.clear()

    def close(self) -> list[tuple[int, int, int]] | None:
        """After the last step: the send watcher's completion stamps (step, action index, ns); None without one."""
        if self.watcher is None:
            return None
        self.watcher.close()
        return self.watcher.done


__all__ = ["Boundary", "PipelineTransfers"]
