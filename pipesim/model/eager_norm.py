"""RMSNorm run as eager PyTorch ops (`--eager-rmsnorm`): the kernels a fused norm's one becomes.

torchtitan's own RMSNorm until it took torch.nn.RMSNorm (torchtitan @ 9dec370 torchtitan/models/norms.py:
`self._norm(x.float()).type_as(x) * self.weight`, `_norm(x) = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) +
eps)`), Hugging Face's LlamaRMSNorm (the same ops) and torch.nn.RMSNorm before torch 2.9 (composite until
pytorch/pytorch#153666's fused kernel, "around 9x speedup vs unfused implementation") run one kernel per op, in float32
after the cast. Per element of the normalised tensor (d the dtype's bytes), forward: the cast d + 4, pow 8, mean 4,
the product with rsqrt 8, the cast back 4 + d, the weight's product 2 d: 36 bytes at d = 2 against a fused kernel's
2 d = 4. Backward, autograd through the same ops: the weight product's input gradient 2 d and weight gradient 2 d,
the cast back's 4 + d, the rsqrt product's two gradients 8 and 8, mean's 4, pow's 12, their sum 12, the first cast's
4 + d: 64 bytes at d = 2 against 3 d = 6. The rsqrt, the eps add and the row reductions' outputs are one value per
row and not counted. Inductor (`--compile`) fuses them back into one kernel each way.
"""

from __future__ import annotations

from pipesim.model.kernel_types import Kernel, MemoryBound, PieceKernels


def _forward(d: int) -> tuple[tuple[str, int], ...]:
    return (("cast to float32", d + 4), ("pow", 8), ("mean", 4), ("x * rsqrt", 8), ("cast back", 4 + d),
            ("weight product", 2 * d))


def _backward(d: int) -> tuple[tuple[str, int], ...]:
    return (("weight product input gradient", 2 * d), ("weight gradient", 2 * d), ("cast back gradient", 4 + d),
            ("x * rsqrt gradient", 8), ("rsqrt gradient", 8), ("mean gradient", 4), ("pow gradient", 12),
            ("gradient sum", 12), ("cast gradient", 4 + d))


def eager_rmsnorm_kernels(kernel: Kernel, d: int) -> list[Kernel]:
    """The eager kernels of one fused RMSNorm kernel (forward: 2 d bytes per element, backward: 3 d), or the kernel
    itself when it is not an RMSNorm."""
    if not isinstance(kernel, MemoryBound):
        return [kernel]
    if kernel.name.endswith("RMSNorm"):
        n, ops = kernel.nbytes // (2 * d), _forward(d)
    elif kernel.name.endswith("RMSNorm backward"):
        n, ops = kernel.nbytes // (3 * d), _backward(d)
    else:
        return [kernel]
    return [MemoryBound(f"{kernel.name}: {op}", per * n) for op, per in ops]


def with_eager_rmsnorm(kernels: PieceKernels, d: int) -> PieceKernels:
    """A piece's kernels with every RMSNorm kernel (its recomputation's too) as eager PyTorch runs it."""
    return PieceKernels(*(tuple(x for k in phase for x in eager_rmsnorm_kernels(k, d)) for phase in kernels.phases()))


__all__ = ["eager_rmsnorm_kernels", "with_eager_rmsnorm"]
