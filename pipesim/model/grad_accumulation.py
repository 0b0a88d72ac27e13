"""Each microbatch's gradients added into the step's gradient buffer: inside the wgrad GEMM, or a separate add.

Megatron-LM's DDP keeps every parameter's gradient for the whole step in a `main_grad` buffer and,
after each microbatch's backward, a hook adds the fresh gradient into it
(`param.main_grad.add_(param.grad.data)`, megatron/core/distributed/distributed_data_parallel.py;
the 2021 LocalDDP's `_make_param_hook` did the same): a memory-bound kernel that reads the
gradient (d bytes) and reads and writes the buffer (2 g bytes) per parameter, every microbatch.
With `--gradient-accumulation-fusion` (Megatron's default once apex's fused_weight_gradient_mlp_cuda
is installed) the linear layers' weight-gradient GEMM accumulates straight into main_grad
(`wgrad_gemm_accum_fp32` / `_fp16`: the GEMM's epilogue reads and writes C in the buffer's dtype,
2 g bytes per weight instead of writing d) and the hook skips them; biases, norms and embedding
tables still take the hook's add. Megatron's 2021 code (NAR21's runs) had no fusion: its
ColumnParallelLinear was F.linear under autograd (bigscience-workshop/Megatron-DeepSpeed @ 119a0d2,
megatron/mpu/layers.py), so every weight took the separate add.

g is the training precision's gradient bytes (pipesim.model.memory.PRECISIONS: 2 for 16-bit mixed
precision, Megatron's fp16 default; 4 with `--accumulate-allreduce-grads-in-fp32`, which Megatron's
bf16 turns on by itself).
"""

from __future__ import annotations

from dataclasses import replace

from pipesim.model.kernel_types import Gemm, Kernel, MemoryBound, PieceKernels

WGRAD = " wgrad"  # suffix of a linear layer's weight-gradient GEMM (pipesim.model.layer_kernels)


def weight_gradient_params(kernels: PieceKernels) -> int:
    """Parameters of the piece's linear weights: the output elements of its weight-gradient GEMMs."""
    return sum(k.batch * k.m * k.n for k in kernels.W if isinstance(k, Gemm) and k.name.endswith(WGRAD))


def accumulate_gradients(kernels: PieceKernels, params: int, *, dtype_bytes: int, grad_bytes: int,
                         fused: bool) -> PieceKernels:
    """The piece's kernels with its gradient accumulation in W.

    params: all the piece's parameters on this rank (pipesim.model.param_counts). fused: each wgrad GEMM
    reads and writes C in the buffer (c_bytes = 2 g) and one add covers the other parameters
    ((d + 2 g) bytes each); separate: one add per linear weight ((d + 2 g) m n bytes) after its
    GEMM, and one for the other parameters.
    """
    weights = weight_gradient_params(kernels)
    others = params - weights
    if others < 0:
        raise ValueError(f"a piece with {params} parameters has {weights} in its weight-gradient GEMMs")
    per_param = dtype_bytes + 2 * grad_bytes  # bytes: read the gradient, read and write main_grad
    w: list[Kernel] = []
    for k in kernels.W:
        is_wgrad = isinstance(k, Gemm) and k.name.endswith(WGRAD)
        if is_wgrad and fused:
            w.append(replace(k, c_bytes=2 * grad_bytes))
            continue
        w.append(k)
        if is_wgrad:
            w.append(MemoryBound(f"{k.name[:-len(WGRAD)]} main_grad add", per_param * k.batch * k.m * k.n))
    if others:
        w.append(MemoryBound("main_grad add (biases, norms, tables)", per_param * others))
    return PieceKernels(kernels.F, kernels.I, tuple(w))


__all__ = ["accumulate_gradients", "weight_gradient_params"]
