"""The kernel types a piece of a model is timed by, and the GEMMs of its linear layers.

A kernel is typed by how pipesim.cost.kernel_costs times it: a GEMM (its m, n, k and batch), a flash-attention
kernel (forward or backward), or a memory-bound kernel (the bytes it reads and writes). `PieceKernels` holds one
piece's kernels per F, I and W; a linear layer's forward, input-gradient and weight-gradient GEMMs follow from its
(name, in, out, tokens) on one rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.device.kernels import band_pairs


@dataclass(frozen=True)
class Gemm:
    """C (m x n) = A (m x k) @ B (k x n), `batch` times in one kernel."""

    name: str  # e.g. "QKV", "QKV dgrad", "QKV wgrad", "Q K^T"
    m: int
    n: int
    k: int
    batch: int = 1
    c_bytes: int = 0  # bytes per C element of an accumulating epilogue (read + write); 0: written once
    dtype: str | None = None  # the GEMM's operand dtype; None: the model's ("float8": pipesim.model.fp8_kernels)

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class FlashAttention:
    """One fused attention kernel over `heads` query heads of `seq` local queries against `kv_seq` keys."""

    name: str
    batch: int
    seq: int  # local queries (s / cp)
    heads: int  # query heads on this rank (heads / t)
    head_dim: int
    kv_seq: int  # keys each query meets (s)
    kv_heads: int  # key/value heads on this rank (GQA)
    backward: bool
    v_head_dim: int | None = None  # value (and output) width per head; None: head_dim (latent attention: narrower)
    window: int | None = None  # keys a query sees under a causal sliding window; None: every key (kv_seq)

    @property
    def value_dim(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def flops(self) -> int:
        """The full-square count of pipesim.model.flops (forward 4 b s_q s_k h / t; backward 2.5x). With a value
        head v other than the query/key head q: forward 2 b s_q s_k a (q + v), backward 2 b s_q s_k a (3 q + 2 v).
        A sliding window: s_q s_k is twice its band's pairs (pipesim.model.flops.attention_core_flops)."""
        if self.window is not None:  # the band, twice (as standard attention: no latent attention has a window)
            fwd = 8 * self.batch * band_pairs(self.seq, self.window) * self.heads * self.head_dim
            return fwd * 10 // 4 if self.backward else fwd
        if self.value_dim != self.head_dim:
            pairs = 2 * self.batch * self.seq * self.kv_seq * self.heads
            return pairs * (3 * self.head_dim + 2 * self.value_dim if self.backward else self.head_dim + self.value_dim)
        fwd = 4 * self.batch * self.seq * self.kv_seq * self.heads * self.head_dim
        return fwd * 10 // 4 if self.backward else fwd


@dataclass(frozen=True)
class MemoryBound:
    """A streaming kernel: `nbytes` read and written once through HBM."""

    name: str
    nbytes: int  # bytes


Kernel = Gemm | FlashAttention | MemoryBound


@dataclass(frozen=True)
class PieceKernels:
    """The kernels of one piece (layer, embedding, head) for one microbatch: forward, input and weight gradient."""

    F: tuple[Kernel, ...]
    I: tuple[Kernel, ...]  # noqa: E741 (the action's name in the IR)
    W: tuple[Kernel, ...]

    def phase(self, name: str) -> tuple[Kernel, ...]:
        """The kernels of phase `name` ("F", "I" or "W")."""
        return {"F": self.F, "I": self.I, "W": self.W}[name]

    def phases(self) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...], tuple[Kernel, ...]]:
        """F's, I's and W's kernels, in that order."""
        return self.F, self.I, self.W

    def flops(self, phase: str) -> int:
        """GEMM and attention FLOPs of one phase ("F", "I" or "W")."""
        return sum(k.flops for k in self.phase(phase) if not isinstance(k, MemoryBound))

    def memory_bytes(self, phase: str) -> int:
        return sum(k.nbytes for k in self.phase(phase) if isinstance(k, MemoryBound))


Linear = tuple[str, int, int, int]  # (name, in_features, out_features, tokens it multiplies) on one rank


def forward_gemms(linears: list[Linear]) -> list[Gemm]:
    return [Gemm(name, tokens, out, inp) for name, inp, out, tokens in linears]


def dgrad_gemms(linears: list[Linear]) -> list[Gemm]:
    """dX = dY W^T, in backward order."""
    return [Gemm(f"{name} dgrad", tokens, inp, out) for name, inp, out, tokens in reversed(linears)]


def wgrad_gemms(linears: list[Linear]) -> list[Gemm]:
    """dW = X^T dY (k = tokens), in backward order."""
    return [Gemm(f"{name} wgrad", inp, out, tokens) for name, inp, out, tokens in reversed(linears)]


def with_tokens(linears: list[tuple[str, int, int]], tokens: int) -> list[Linear]:
    return [(name, inp, out, tokens) for name, inp, out in linears]


__all__ = ["FlashAttention", "Gemm", "Kernel", "Linear", "MemoryBound", "PieceKernels", "dgrad_gemms", "forward_gemms",
           "wgrad_gemms", "with_tokens"]
