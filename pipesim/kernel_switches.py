"""The GPU kernel path's switches of a job: which fused kernels, overlaps and linears a layer runs with (Megatron-LM's
flags of these names; the defaults are Megatron's), and how they are typed back into an exported command. A field of
`pipesim.job.Job`; the kernel path (pipesim.cost.kernel_costs) and the TP collectives' hiding read them."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipesim.comm.ub_overlap import UbConfig
from pipesim.model.cuda_graphs import CudaGraphs


@dataclass(frozen=True)
class KernelSwitches:
    """How the GPU kernel path runs a layer (Megatron-LM's flags of these names; the defaults are Megatron's)."""

    fusion: bool = True  # fused elementwise kernels (--no-kernel-fusion: eager PyTorch's one kernel per op)
    tp_comm_overlap: bool = True  # backward TP collectives under the wgrad GEMM (--no-async-tensor-model-parallel-...)
    grad_accum_fusion: bool = True  # wgrad GEMMs accumulate into main_grad (--no-gradient-accumulation-fusion)
    grad_fp32: bool | None = None  # float32 main gradients; None: the dtype's default (float32 for bfloat16)
    # --tp-comm-overlap: the dense linears' sp collectives inside their GEMMs by TE's userbuffers (its methods)
    ub: UbConfig | None = None
    ce_fusion: bool = False  # --cross-entropy-loss-fusion: Megatron-core's fused vocab-parallel cross-entropy
    ce_impl: str = "native"  # --cross-entropy-fusion-impl: "native" (Megatron-core's) or "te" (Transformer Engine's)
    eager_rmsnorm: bool = False  # --eager-rmsnorm: RMSNorm as eager PyTorch's ops (pipesim.model.eager_norm)
    # --dtensor-tp: tensor parallelism as torch DTensor's parallel styles (torchtitan): each block's all-gathered input
    # saved for its weight gradients, gathered in FP8 under tensorwise FP8 (pipesim.model.layer_collectives)
    dtensor_tp: bool = False
    # --cuda-graph-impl / --cuda-graph-scope: Megatron-core's CUDA graphs (pipesim.model.cuda_graphs); None: eager
    cuda_graphs: CudaGraphs | None = None
    te_linear: bool = False  # --transformer-impl transformer_engine: TE's linears (a biased QKV's bias in its GEMM)

    @property
    def cross_entropy(self) -> str:
        """The cross-entropy the head runs (pipesim.model.piece_kernels.CE_FUSIONS)."""
        return self.ce_impl if self.ce_fusion else "unfused"

    def flags(self, *, gpu: bool = True) -> list[str]:
        """The command-line flags that give these switches (for exported commands); `gpu` False (hardware without a
        GPU device family) leaves out the kernel path's, which such hardware refuses typed
        (pipesim.commands.model_switches.KERNEL_PATH_ONLY)."""
        if not gpu:
            return replace(self, fusion=True, grad_accum_fusion=True, ce_fusion=False, cuda_graphs=None,
                           te_linear=False, eager_rmsnorm=False).flags()
        out = [] if self.fusion else ["--no-kernel-fusion"]
        if self.ub is not None:
            out += self.ub.flags()
        if not self.tp_comm_overlap:
            out.append("--no-async-tensor-model-parallel-allreduce")
        if not self.grad_accum_fusion:
            out.append("--no-gradient-accumulation-fusion")
        if self.grad_fp32 is True:
            out.append("--accumulate-allreduce-grads-in-fp32")
        elif self.grad_fp32 is False:
            out.append("--grad-reduce-in-bf16")
        out += ["--transformer-impl", "transformer_engine"] if self.te_linear else []
        return (out + self.ce_flags() + (["--eager-rmsnorm"] if self.eager_rmsnorm else [])
                + (["--dtensor-tp"] if self.dtensor_tp else [])
                + (self.cuda_graphs.flags() if self.cuda_graphs is not None else []))

    def ce_flags(self) -> list[str]:
        """Megatron-core's flags (and pipesim's) of the cross-entropy: the one spelling of every export."""
        if not self.ce_fusion:
            return []
        return ["--cross-entropy-loss-fusion"] + (["--cross-entropy-fusion-impl", self.ce_impl]
                                                  if self.ce_impl != "native" else [])


__all__ = ["KernelSwitches"]
