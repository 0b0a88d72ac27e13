"""Token dispatch and combine over the expert-parallel group: `all_to_all_single` with variable splits.

Each rank sends every expert-parallel peer the token rows routed to that peer's experts; how many rows go
where changes every microbatch (dropless routing), so a small all-to-all of per-expert counts runs first and
both sides know their splits before the rows move. The exchange is an autograd function: its backward is the
same all-to-all with the splits swapped (the rows' gradients go home). gloo (CPU) and NCCL both take uneven
splits in `all_to_all_single` (checked on torch 2.13's CPU build with gloo).

`issue` starts the rows' exchange asynchronously (`async_op=True`) and hands back the work: DualPipeV's
overlapped F&B issues the forward chunk's dispatch, runs the backward chunk, and only then waits
(executor.runtime). With `--trace` every exchange is recorded as an "all_to_all" collective from its issue to
its completion (a callback on the work's future stamps the completion on gloo; NCCL is synchronised first).
A failed exchange (a peer that died inside it) raises `ExchangeError`, which the runtime names in the rank's
failure line ("during the expert all-to-all of F(stage 0, mb 0)"); its message keeps the backend's words, so the
launcher still tells a lost peer from a cause (executor.failure_report).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter_ns

import torch
import torch.distributed as dist

_observer = None  # callable(kind, t0_ns, t1_ns, nbytes), or None: nothing timed


class ExchangeError(RuntimeError):
    """An expert all-to-all failed (its message: which one, then the backend's)."""


def _failed(what: str, group, exc: Exception) -> ExchangeError:
    ranks = dist.get_process_group_ranks(group)
    return ExchangeError(f"the {what} over ep ranks {ranks} failed: {exc}")


def set_exchange_observer(observer) -> None:
    """Call `observer("all_to_all", t0_ns, t1_ns, nbytes)` for every exchange (None: stop)."""
    global _observer
    _observer = observer


@dataclass
class Pending:
    """An exchange in flight: `wait()` before reading the rows it fills."""

    work: object | None = None
    group: object | None = None  # the ep process group, for the failure's message
    started: int = 0  # perf_counter_ns at the issue
    nbytes: int = 0  # bytes this rank sends
    done: list[int] = field(default_factory=list)  # completion stamp, from the future's callback

    def wait(self) -> None:
        if self.work is None:
            return
        work, self.work = self.work, None
        try:
            work.wait()
        except RuntimeError as exc:
            raise _failed("token all-to-all", self.group, exc) from exc
        if _observer is not None:
            end = self.done[0] if self.done else perf_counter_ns()
            _observer("all_to_all", self.started, max(end, self.started), self.nbytes)


def exchange_counts(counts: torch.Tensor, group) -> torch.Tensor:
    """Per-expert row counts (E, this rank's rows for every expert) -> (ep, E / ep): what each peer sends to each
    of my local experts. Experts are placed in order: rank x of the group holds experts x E / ep onward."""
    ep = dist.get_world_size(group)
    out = torch.empty_like(counts)
    try:
        dist.all_to_all_single(out, counts, group=group)
    except RuntimeError as exc:
        raise _failed("all-to-all of token counts", group, exc) from exc
    return out.view(ep, -1)


def _start(out: torch.Tensor, rows: torch.Tensor, out_splits: list[int], in_splits: list[int], group,
           pending: Pending) -> None:
    if rows.is_cuda:
        torch.cuda.synchronize(rows.device)  # the rows are computed before NCCL reads them
    pending.started, pending.group = perf_counter_ns(), group
    pending.nbytes = rows.numel() * rows.element_size()  # bytes
    pending.work = dist.all_to_all_single(out, rows, out_splits, in_splits, group=group, async_op=True)
    if _observer is not None and not rows.is_cuda:
        stamp = pending.done.append
        pending.work.get_future().add_done_callback(lambda _f: stamp(perf_counter_ns()))


class _Exchange(torch.autograd.Function):
    """Rows out by `in_splits`, rows in by `out_splits`; the backward sends the gradients back the other way."""

    @staticmethod
    def forward(ctx, rows, in_splits, out_splits, group, pending):
        ctx.splits, ctx.group = (in_splits, out_splits), group
        out = rows.new_empty((sum(out_splits), *rows.shape[1:]))
        _start(out, rows.contiguous(), out_splits, in_splits, group, pending)
        return out

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        pending = Pending()
        _start(back, grad.contiguous(), in_splits, out_splits, ctx.group, pending)
        pending.wait()
        return back, None, None, None, None


def issue(rows: torch.Tensor, in_splits: list[int], out_splits: list[int], group) -> tuple[torch.Tensor, Pending]:
    """Start the exchange; the returned rows are valid after `pending.wait()`."""
    pending = Pending()
    out = _Exchange.apply(rows, in_splits, out_splits, group, pending)
    return out, pending


__all__ = ["ExchangeError", "Pending", "exchange_counts", "issue", "set_exchange_observer"]
