"""How the simulated framework communicates, where frameworks offer a choice (issue 15, mechanisms 2 and 3).

- `scatter_gather`: Megatron-LM's `scatter_gather_tensors_in_pipeline` (on by default there; off with
  `--no-scatter-gather-tensors-in-pipeline`). With tp > 1 and no sequence parallelism each of a stage's t
  ranks sends 1/t of the boundary over its own link (its own NIC across nodes, rail-optimised), and the
  receiving stage's t ranks all-gather it inside their node. pipesim's executor does not, so it is opt-in.
- `overlap_grad_reduce`: Megatron-LM's `--overlap-grad-reduce` (off by default there; torch DDP always
  overlaps): a stage's gradients are reduced in buckets of `ddp_bucket_size` parameters, in reverse layer
  order, as its last backward passes them, instead of in one collective after it.
- `blocking_p2p`: Megatron-LM's pipeline messages without `--overlap-p2p-communication` (its default):
  p2p_communication.py posts each batch of isend/irecv with `batch_isend_irecv`, waits on every request and
  calls `torch.cuda.synchronize()`, so a SEND holds its rank until its bytes have arrived. pipesim's
  executor (and torch.distributed.pipelining) wait on their sends only later, so it is opt-in.
- `overlap_p2p_comm`: Megatron-core's `--overlap-p2p-communication` (on by default in megatron/training/arguments.py
  since core_v0.6, `--no-overlap-p2p-communication` turns it off), which only its interleaved schedule honours:
  there the steady state's sends are posted before the next chunk's compute and waited on after it
  (p2p_communication.py `wait_on_reqs=(not overlap_p2p_comm)`), so with `blocking_p2p` a schedule of more stages
  than ranks (v > 1) does not hold its ranks on its sends in the steady state. Its warm-up (the forwards before a
  rank's first 1F1B pair) and its flush (the backwards after its last one) still send with
  send_forward_recv_forward / send_backward_recv_backward and wait on them (schedules.py
  forward_backward_pipelining_with_interleaving, since NVIDIA/Megatron-LM 4295be1a6c, 2024-11-01) unless
  `overlap_p2p_warmup_flush`, Megatron-core's `--overlap-p2p-communication-warmup-flush` (off by default; it needs
  --overlap-p2p-communication, as model_parallel_config.py raises), lifts those too (pipesim.sim.program).
- `overlap_param_gather`: Megatron-core's `--overlap-param-gather` (needs the distributed optimizer and
  --overlap-grad-reduce, as megatron/training/arguments.py asserts): the updated parameters' all-gather of ZeRO 1/2
  is not run after the optimizer but dispatched at the next step's start, each chunk's forward waiting for its own
  (distrib_optimizer.py step_with_ready_grads: "the first all-gather is launched asynchronously in the next
  optimizer.zero_grad() call and subsequent all-gathers are launched in the forward pre-hook"); pipesim gates a
  chunk's first forward on its whole gather (a chunk's first bucket in Megatron), the ZeRO 3 prefetch's rule.
- `moe_dispatcher`: how a mixture-of-experts layer's tokens reach their experts. "alltoall" is Megatron-core's
  `--moe-token-dispatcher-type alltoall` (NCCL all-to-all of each token's k copies); "deepep" its `flex`
  dispatcher with the DeepEP backend (`--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep`;
  before Megatron-core 0.16 `--moe-enable-deepep`), whose kernels hold `deepep_sms` SMs while they run
  (`--moe-deepep-num-sms`, default 20 in megatron/training/arguments.py); "hybridep" the flex dispatcher on Hybrid-EP
  (`--moe-flex-dispatcher-backend hybridep`), `hybridep_sms` SMs (`--moe-hybridep-num-sms`; None: Hybrid-EP's own
  default). Timing: pipesim.comm.all_to_all.
- `moe_shared_expert_overlap`: Megatron-core's `--moe-shared-expert-overlap` (alltoall dispatcher only, as
  transformer_config.py raises): the shared experts run on a side stream beside the dispatcher's all-to-alls
  (pipesim.cost.shared_overlap), hiding as much of each exchange as their kernels last.

The defaults are today's behaviour, bit for bit. Mechanics: docs/simulator.md ("Communication options").
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.model.moe import MOE_DISPATCHERS

# Megatron-LM megatron/core/distributed/distributed_data_parallel_config.py, `bucket_size`: "If unspecified,
# MCore uses a default value of max(40000000, 1000000 * dp_size) parameters".
MIN_DEFAULT_BUCKET_PARAMS = 40_000_000  # parameters
DEFAULT_BUCKET_PARAMS_PER_DP_RANK = 1_000_000  # parameters per data-parallel rank
DEFAULT_DEEPEP_SMS = 20  # Megatron-LM megatron/training/arguments.py, --moe-deepep-num-sms (default 20)


@dataclass(frozen=True)
class CommOptions:
    """Communication choices of the simulated framework; the default is pipesim's own (executor) behaviour."""

    scatter_gather: bool = False  # pipeline messages split over the tp ranks, all-gathered at the receiver
    overlap_grad_reduce: bool = False  # DP gradient reduction in buckets, overlapped with the last backward
    ddp_bucket_size: int | None = None  # parameters per bucket; None: Megatron's max(40M, 1M x dp)
    blocking_p2p: bool = False  # a SEND holds its rank until its transfer ends (Megatron's p2p_communication)
    moe_dispatcher: str = "alltoall"  # "alltoall" (NCCL, k copies per token), "deepep" or "hybridep" (flex)
    deepep_sms: int = DEFAULT_DEEPEP_SMS  # SMs DeepEP's kernels hold while they run (deepep only)
    hybridep_sms: int | None = None  # SMs Hybrid-EP's kernels hold (hybridep only; None: its own 24, 8 across domains)
    overlap_p2p_comm: bool = False  # with blocking_p2p: an interleaved schedule's sends do not block (Megatron-core)
    overlap_param_gather: bool = False  # ZeRO 1/2's parameter all-gather prefetched before each chunk's forward
    # with overlap_p2p_comm: the interleaved schedule's warm-up and flush sends do not block either (Megatron-core)
    overlap_p2p_warmup_flush: bool = False
    # the shared experts on a side stream beside the alltoall dispatcher's exchanges (Megatron-core)
    moe_shared_expert_overlap: bool = False

    def __post_init__(self) -> None:
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise PipesimError(f"unknown MoE token dispatcher {self.moe_dispatcher!r}; choose "
                               f"{' or '.join(MOE_DISPATCHERS)}")
        for backend, name, sms, default in (("deepep", "DeepEP", self.deepep_sms, DEFAULT_DEEPEP_SMS),
                                            ("hybridep", "Hybrid-EP", self.hybridep_sms, None)):
            flag = f"--moe-{backend}-num-sms"
            optional = default is None  # Hybrid-EP's None: its own default
            if not (optional and sms is None) and (not isinstance(sms, int) or isinstance(sms, bool) or sms < 1):
                raise PipesimError(f"{flag} must be a positive integer, got {sms!r}")
            if sms != default and self.moe_dispatcher != backend:
                raise PipesimError(f"{flag} needs the {name} dispatcher (--moe-token-dispatcher-type flex "
                                   f"--moe-flex-dispatcher-backend {backend})")
        if self.moe_shared_expert_overlap and self.moe_dispatcher != "alltoall":  # transformer_config.py raises
            raise PipesimError("--moe-shared-expert-overlap only works with the alltoall token dispatcher (as "
                               "Megatron-core raises)")
        if self.overlap_p2p_comm and not self.blocking_p2p:  # it lifts held sends: without them it changes nothing
            raise PipesimError("--overlap-p2p-communication lets an interleaved schedule's sends go without holding "
                               "their rank: it needs --blocking-p2p (or --framework megatron-core), where they hold it")
        if self.overlap_p2p_warmup_flush and not self.overlap_p2p_comm:  # model_parallel_config.py raises
            raise PipesimError("--overlap-p2p-communication-warmup-flush needs --overlap-p2p-communication (as "
                               "Megatron-core)")
        if self.overlap_param_gather and not self.overlap_grad_reduce:  # megatron/training/arguments.py asserts it
            raise PipesimError("--overlap-param-gather needs --overlap-grad-reduce (as Megatron-LM)")
        size = self.ddp_bucket_size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise PipesimError(f"--ddp-bucket-size must be a positive number of parameters, got {size!r}")
        if size is not None and not self.overlap_grad_reduce:
            raise PipesimError("--ddp-bucket-size needs --overlap-grad-reduce (without it the gradients are "
                               "reduced in one collective after the last backward)")

    def bucket_params(self, dp: int) -> int:
        """Parameters per gradient bucket: the flag's, or Megatron's default for `dp` replicas."""
        if self.ddp_bucket_size is not None:
            return self.ddp_bucket_size
        return max(MIN_DEFAULT_BUCKET_PARAMS, DEFAULT_BUCKET_PARAMS_PER_DP_RANK * dp)

    def flags(self) -> list[str]:
        """The command-line flags that give these options (for exported commands)."""
        out = ["--scatter-gather"] if self.scatter_gather else []
        if self.overlap_grad_reduce:
            out.append("--overlap-grad-reduce")
        if self.ddp_bucket_size is not None:
            out += ["--ddp-bucket-size", str(self.ddp_bucket_size)]
        if self.blocking_p2p:
            out.append("--blocking-p2p")
        if self.overlap_p2p_comm:
            out.append("--overlap-p2p-communication")
        if self.overlap_p2p_warmup_flush:
            out.append("--overlap-p2p-communication-warmup-flush")
        if self.overlap_param_gather:
            out.append("--overlap-param-gather")
        if self.moe_shared_expert_overlap:
            out.append("--moe-shared-expert-overlap")
        return out + self.dispatcher_flags()

    def blocks_sends(self, interleaved: bool) -> bool:
        """Whether a SEND holds its rank: blocking_p2p, unless Megatron's p2p overlap lifts it on an interleaved
        schedule (more stages than ranks)."""
        return self.blocking_p2p and not (self.overlap_p2p_comm and interleaved)

    def blocks_edge_sends(self, interleaved: bool) -> bool:
        """Whether the warm-up's and the flush's SENDs hold their rank where the steady state's do not: Megatron-core's
        interleaved schedule under --overlap-p2p-communication without --overlap-p2p-communication-warmup-flush."""
        return self.blocking_p2p and self.overlap_p2p_comm and interleaved and not self.overlap_p2p_warmup_flush

    def dispatcher_flags(self) -> list[str]:
        """Megatron-core's flags for the MoE token dispatcher (pipesim spells them the same); [] at the default."""
        if self.moe_dispatcher == "alltoall":
            return []
        out = ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", self.moe_dispatcher]
        if self.moe_dispatcher == "hybridep":
            return out + (["--moe-hybridep-num-sms", str(self.hybridep_sms)] if self.hybridep_sms is not None else [])
        return out + (["--moe-deepep-num-sms", str(self.deepep_sms)] if self.deepep_sms != DEFAULT_DEEPEP_SMS else [])

    def report(self) -> dict:
        """The options as --json reports them."""
        return {"scatter_gather": self.scatter_gather, "overlap_grad_reduce": self.overlap_grad_reduce,
                "ddp_bucket_size": self.ddp_bucket_size, "blocking_p2p": self.blocking_p2p,
                "moe_dispatcher": self.moe_dispatcher, "deepep_sms": self.deepep_sms, "hybridep_sms": self.hybridep_sms,
                "overlap_p2p_comm": self.overlap_p2p_comm, "overlap_param_gather": self.overlap_param_gather,
                "overlap_p2p_warmup_flush": self.overlap_p2p_warmup_flush,
                **({"moe_shared_expert_overlap": True} if self.moe_shared_expert_overlap else {})}


def bucket_fractions(params: int, bucket: int) -> tuple[float, ...]:
    """Cumulative fraction of a stage's `params` reduced by the end of each bucket of `bucket` parameters,
    in the order backward fills them (reverse layer order); the last is exactly 1.0. (1.0,) when the stage
    fits one bucket (or holds no parameters)."""
    if bucket < 1:
        raise PipesimError(f"a gradient bucket holds at least one parameter, got {bucket}")
    if params <= bucket:
        return (1.0,)
    full = -(-params // bucket) - 1  # buckets of exactly `bucket` parameters before the remainder
    return tuple((k + 1) * bucket / params for k in range(full)) + (1.0,)


__all__ = ["DEFAULT_BUCKET_PARAMS_PER_DP_RANK", "DEFAULT_DEEPEP_SMS", "MIN_DEFAULT_BUCKET_PARAMS", "MOE_DISPATCHERS",
           "CommOptions", "bucket_fractions"]
