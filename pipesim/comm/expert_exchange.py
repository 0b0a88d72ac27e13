"""One expert-parallel all-to-all inside a compute action, as the cost model hands it to the simulator.

A mixture-of-experts layer sends each token's k copies to the ranks holding their experts (dispatch)
and brings the outputs back (combine); its backward moves the gradients the other way. The cost model
says what moves (tokens, width, k, experts, the load on the slowest rank, how many layers do it back to
back); the simulator times it over the action's expert-parallel group on the machine's links
(`exchange_timing`, pipesim.comm.all_to_all, with the job's dispatcher: NCCL, DeepEP or Hybrid-EP) and draws it as
its own bar. It blocks its rank: Megatron's 1F1B runs the all-to-all between the GEMMs that need its tokens (hiding
it under another microbatch is a schedule's doing, DualPipe's overlapped F&B pairs, where the SMs the kernel holds are
what the hiding costs). With Megatron-core's --moe-shared-expert-overlap the shared experts run on a side stream
beside the exchanges (`beside`, `carries`: pipesim.cost.shared_overlap), and only what they leave of each is exposed
(`exposed_exchange_seconds`).
"""

from __future__ import annotations

from typing import NamedTuple

from pipesim.comm.all_to_all import DEEPEP_SMS, combine_time, dispatch_time
from pipesim.hardware.machine import Hardware
from pipesim.model.moe import group_node_limit


class ExpertExchange(NamedTuple):
    """`count` back-to-back all-to-alls of one kind over the action's ep group (one per MoE layer)."""

    what: str  # "dispatch", "combine", "combine backward", "dispatch backward" (recomputed: "recompute: ...")
    tokens: int  # tokens this rank routes (before the k copies)
    hidden: int  # elements per token
    top_k: int  # experts per token
    experts: int  # routed experts of the layer
    dtype_bytes: int  # bytes per element on the wire
    load: float = 1.0  # the most-loaded rank's received tokens over the mean
    count: int = 1  # layers doing it back to back in this action
    groups: int = 1  # group-limited routing: the experts' groups (MoeConfig.groups)
    group_topk: int = 0  # groups a token's experts come from (0: not group-limited)
    beside: float = 0.0  # seconds per layer of side-stream compute running beside this exchange (shared experts)
    carries: bool = False  # what the previous exchange's side-stream compute outlasted it by runs beside this one

    @property
    def sent_bytes(self) -> int:
        """Bytes this rank sends: each token's k copies (before any deduplication per destination)."""
        return self.tokens * self.top_k * self.hidden * self.dtype_bytes


def exchange_timing(hw: Hardware, devices: list[int], x: ExpertExchange, *, kernel: str = "nccl",
                    deepep_sms: int = DEEPEP_SMS, hybridep_sms: int | None = None) -> tuple[float, int]:
    """(seconds, SMs held) of `x.count` all-to-alls over `devices` (the ep group, global device ids), the slowest
    rank's, with `kernel` "nccl" (Megatron-core's alltoall dispatcher: k copies per token), "deepep" (its flex
    dispatcher on DeepEP, whose kernels hold `deepep_sms` SMs) or "hybridep" (on Hybrid-EP, `hybridep_sms` SMs, None:
    Hybrid-EP's own default; pipesim.comm.all_to_all). (0.0, 0) with one rank."""
    if len(devices) < 2:
        return 0.0, 0
    timed = combine_time if "combine" in x.what else dispatch_time
    one = timed(hw, devices, x.tokens, x.hidden, x.top_k, x.experts, dtype_bytes=x.dtype_bytes, imbalance=x.load,
                node_limit=node_limit(hw, devices, x), kernel=kernel)
    if kernel == "deepep":
        return x.count * one.seconds, deepep_sms
    return x.count * one.seconds, hybridep_sms if kernel == "hybridep" and hybridep_sms else one.sms


def exposed_exchange_seconds(exchanges: tuple[ExpertExchange, ...], seconds: list[float]) -> float:
    """The exchanges' seconds (`seconds[i]`: exchange i's, all its `count` layers) less the side-stream compute beside
    each, layer by layer: an exchange of t per layer beside s (plus what the previous one left, where it `carries`)
    exposes max(0, t - s), and leaves max(0, s - t) to the next. The plain sum when nothing runs beside."""
    if not any(x.beside for x in exchanges):
        return sum(seconds)
    total, spare = 0.0, 0.0
    for x, t in zip(exchanges, seconds, strict=True):
        per = t / x.count if x.count else 0.0  # one layer's
        side = x.beside + (spare if x.carries else 0.0)
        total += x.count * max(0.0, per - side)
        spare = max(0.0, side - per)
    return total


def node_limit(hw: Hardware, devices: list[int], x: ExpertExchange) -> int | None:
    """The nodes a token reaches under the exchange's group-limited routing over `devices` (group_node_limit)."""
    return group_node_limit(x.groups, x.group_topk, len({d // hw.devices_per_node for d in devices}))


def exchange_seconds(hw: Hardware, devices: list[int], x: ExpertExchange, *, kernel: str = "nccl") -> float:
    """Seconds of `x.count` all-to-alls over `devices` (`exchange_timing`'s)."""
    return exchange_timing(hw, devices, x, kernel=kernel)[0]


__all__ = ["ExpertExchange", "exchange_seconds", "exchange_timing", "exposed_exchange_seconds", "node_limit"]
