"""One Mamba-2 mixer as Megatron-core's hybrid model (Nemotron-H, Nemotron 3) trains it: its sizes, its parameters
on one tp rank, its kernels per F, I and W, and what it keeps for its backward.

Read from NVIDIA/Megatron-LM @ d98e8a64dd, megatron/core/ssm/mamba_mixer.py (MambaMixer), and from the kernels its
training path calls, state-spaces/mamba @ e9594ce (mamba_ssm/ops/triton/ssd_combined.py
MambaSplitConv1dScanCombinedFn, layernorm_gated.py; megatron/core/ssm/ops holds forward-only inference kernels).
With use_mamba_mem_eff_path (the default) the mixer runs: in_proj (TELayerNormColumnParallelLinear, its fused
norm the layer's pre-norm, the caller's) to zxBCdt = [z, x, B, C, dt]; mamba_split_conv1d_scan_combined (the
causal depthwise conv1d + SiLU on xBC, the SSD chunked scan, whose last kernel adds D x and gates by silu(z));
the RMSNorm over groups of d_inner / G (z=None: norm(y * silu(z)), norm_before_gate asserted False); out_proj
(TERowParallelLinear). Tensor parallelism splits heads, groups and the inner width (nheads % tp, ngroups % tp
asserted); every mixer parameter is split with them (`tensor_model_parallel`), none is replicated.

The scan's tensor-core work is written as the chunked algorithm's GEMMs, per chunk of Q tokens of each sequence:
forward C B^T per group (Q x Q by N), chunk states B^T X, (L o CB) X and C h per head; backward (the scan saves
no state: _mamba_chunk_scan_combined_bwd recomputes CB and the states) those two again, then dh = dY^T C,
dX = B dh + (L o CB)^T dY, dB = X dh^T, dC = dY h^T, dCB = dY X^T and ddA's dY X^T per head, dB and dC from dCB
per group: per chunk 6 G Q^2 N + H (10 Q N P + 6 Q^2 P) FLOPs against the forward's 2 G Q^2 N + H (4 Q N P +
2 Q^2 P), 2.7x for Nemotron-H. Q x Q products are counted full-square, as pipesim counts attention; the Triton
kernels skip the blocks above the diagonal in four ((L o CB) X, (L o CB)^T dY, dCB, ddA's). Byte formulas per
kernel: the comments of `_scan`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from pipesim.errors import PipesimError
from pipesim.model.kernel_types import (
    Gemm,
    Kernel,
    MemoryBound,
    PieceKernels,
    dgrad_gemms,
    forward_gemms,
    wgrad_gemms,
)
from pipesim.model.scan_mixer import positive, projections, scan_chunks
from pipesim.model.tensor_types import SavedTensor, WeightTensor

STAT_BYTES = 4  # float32: the norm's rstd, the scan's dt / dA cumsums and its inter-chunk states before the cast
BLOCK = "Mamba"  # SavedTensor.block of everything the mixer keeps


@dataclass(frozen=True)
class MambaMixer:
    """Sizes of a Mamba-2 mixer (Megatron-core's MambaMixer; Hugging Face nemotron_h's mamba_* keys)."""

    heads: int  # H: mamba_num_heads
    head_dim: int = 64  # P: mamba_head_dim
    state: int = 128  # N: ssm_state_size (Megatron's d_state)
    groups: int = 8  # G: n_groups (Megatron's ngroups)
    conv_kernel: int = 4  # d_conv
    chunk: int = 128  # the SSD scan's chunk_size

    def __post_init__(self) -> None:
        for f in fields(self):
            positive(f"the Mamba mixer's {f.name}", getattr(self, f.name))
        if self.heads % self.groups:  # MambaMixer: assert self.nheads % self.ngroups == 0
            raise PipesimError(f"the Mamba mixer's {self.heads} heads do not divide into its {self.groups} groups")

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """What conv1d runs over: x, B and C (Megatron's conv_dim)."""
        return self.d_inner + 2 * self.groups * self.state

    @property
    def in_proj_width(self) -> int:
        """in_proj's outputs: z, x, B, C and dt."""
        return 2 * self.d_inner + 2 * self.groups * self.state + self.heads


def check_mamba_split(mixer: MambaMixer, tp: int) -> None:
    """PipesimError unless tp splits the mixer as Megatron-core does: mamba_mixer.py asserts nheads % tp_size == 0
    (each rank at least one head) and ngroups % tp_size == 0 (each rank at least one group); d_inner and the conv
    channels follow."""
    positive("tp", tp)
    if mixer.heads % tp or mixer.groups % tp:
        raise PipesimError(f"tp {tp} does not split the Mamba mixer's {mixer.heads} heads and {mixer.groups} groups "
                           "(Megatron-core asserts heads % tp == 0 and groups % tp == 0)")


def mamba_tensors(mixer: MambaMixer, hidden: int, tp: int = 1) -> list[WeightTensor]:
    """The mixer's parameters as named WeightTensors, shapes on one tp rank as mamba_mixer.py builds them: in_proj
    [W / t, h] and out_proj [h, d_inner / t], both bias-free (`assert not bias`); conv1d_weight [C / t, 1, d_conv]
    and conv1d_bias [C / t] (`assert conv_bias`); dt_bias, A_log and D [H / t] each (D_has_hdim False); the gated
    norm's weight [d_inner / t] (mamba_ssm's RMSNorm: no bias). W = in_proj_width, C = conv_channels."""
    positive("hidden", hidden)
    check_mamba_split(mixer, tp)
    heads, inner = mixer.heads // tp, mixer.d_inner // tp
    return [WeightTensor("in_proj", (mixer.in_proj_width // tp, hidden)),
            WeightTensor("conv1d weight", (mixer.conv_channels // tp, 1, mixer.conv_kernel)),
            WeightTensor("conv1d bias", (mixer.conv_channels // tp,)),
            WeightTensor("dt_bias", (heads,)), WeightTensor("A_log", (heads,)), WeightTensor("D", (heads,)),
            WeightTensor("gated norm weight", (inner,)),
            WeightTensor("out_proj", (hidden, inner))]


def mamba_params(mixer: MambaMixer, hidden: int, tp: int = 1) -> int:
    """The mixer's trainable parameters on one tp rank (`mamba_tensors`'): h W + C (d_conv + 1) + 3 H + d_inner +
    d_inner h, over t, every one split (Megatron marks conv1d, dt_bias, A_log, D and the norm's weight
    tensor_model_parallel). NOT the layer's pre-norm (in_proj's fused norm, whole on every rank: the caller's)."""
    positive("hidden", hidden)
    check_mamba_split(mixer, tp)
    m = mixer
    return (hidden * m.in_proj_width + m.conv_channels * (m.conv_kernel + 1) + 3 * m.heads + m.d_inner
            + m.d_inner * hidden) // tp


def _scan(mixer: MambaMixer, tokens: int, tp: int, batch: int, d: int) -> tuple[list[Kernel], list[Kernel]]:
    """The conv and the SSD scan (mamba_split_conv1d_scan_combined): its (forward, backward) kernels on one rank.

    Elements on one rank: e = t d_inner / tp (x, z, y), c = t C / tp (the conv's channels), Hl = H / tp; chunk-laid
    float32 arrays (dt after softplus, dA's cumsum) hold ct = chunks x Q padded tokens per head; S = chunks Hl P N
    inter-chunk state elements, S0 = batch Hl P N final ones (float32)."""
    m, q = mixer, mixer.chunk
    nc = scan_chunks(m.chunk, tokens, batch)
    hl, gl, p, n = m.heads // tp, m.groups // tp, m.head_dim, m.state
    e, c, ct = tokens * m.d_inner // tp, tokens * m.conv_channels // tp, nc * q
    s, s0 = nc * hl * p * n, batch * hl * p * n
    bh, bg = nc * hl, nc * gl  # GEMM batches: one per chunk and local head / group
    conv = MemoryBound("Mamba conv1d + SiLU", 2 * c * d)  # causal_conv1d_fwd: read xBC, write silu(conv)
    cumsum = MemoryBound("SSD dt softplus + cumsum", hl * (tokens * d + 2 * STAT_BYTES * ct))  # dt in; dt, dA out
    cb = Gemm("SSD C B^T", q, q, n, bg)  # _bmm_chunk_fwd, float32 out
    states = Gemm("SSD chunk states B^T X", n, p, q, bh)  # _chunk_state_fwd, float32 out
    fwd: list[Kernel] = [
        conv, cumsum, states,
        # _state_passing_fwd: read the float32 states, write them in the dtype (state_dtype: params_dtype) + final
        MemoryBound("SSD state passing", s * (STAT_BYTES + d) + STAT_BYTES * s0),
        cb,
        Gemm("SSD (L o CB) X", q, p, q, bh), Gemm("SSD C h (output from states)", q, p, n, bh),  # _chunk_scan_fwd
        # its epilogue: + D x, times silu(z); reads z and writes out_x (y + D x, kept for the backward) besides out
        MemoryBound("SSD D skip + z gate", 2 * e * d)]
    bwd: list[Kernel] = [
        MemoryBound("Mamba conv1d + SiLU (recompute)", 2 * c * d),  # x, B, C again from the saved zxBCdt
        # dt.clone() (read, write dt), then _chunk_cumsum_fwd again
        MemoryBound("SSD dt softplus + cumsum (recompute)", cumsum.nbytes + 2 * tokens * hl * d),
        Gemm("SSD C B^T (recompute)", q, q, n, bg), Gemm("SSD chunk states B^T X (recompute)", n, p, q, bh),
        # _state_passing_fwd again, its output left in float32 (no out_dtype)
        MemoryBound("SSD state passing (recompute)", 2 * STAT_BYTES * s + STAT_BYTES * s0),
        MemoryBound("SSD z gate backward", 6 * e * d),  # _chunk_scan_bwd_dz: read x, z, out_x, dout; write dz, dy
        Gemm("SSD state gradients dY^T C", p, n, q, bh),  # _chunk_scan_bwd_dstates, float32 out
        # _state_passing_bwd: read dstates and states (float32), write both in the dtype
        MemoryBound("SSD state passing backward", s * (2 * STAT_BYTES + 2 * d)),
        Gemm("SSD dX from states B dh", q, p, n, bh), Gemm("SSD dX (L o CB)^T dY", q, p, q, bh),  # one kernel
        Gemm("SSD dB X dh^T", q, n, p, bh), Gemm("SSD dC dY h^T", q, n, p, bh),  # _chunk_state_bwd_db, _bwd_dC
        Gemm("SSD dCB dY X^T", q, q, p, bh),  # _chunk_scan_bwd_dcb
        Gemm("SSD dB from dCB", q, n, q, bg), Gemm("SSD dC from dCB", q, n, q, bg),  # _bmm_chunk_bwd twice
        Gemm("SSD ddA dY X^T", q, q, p, bh),  # _chunk_scan_bwd_ddAcs_stable
        # float32 per padded token and head: ddA_prev's flip, cumsum, flip (3 x read + write: 24 B), ddA's two adds
        # (24 B), _chunk_cumsum_bwd reading ddA and ddt (8 B); it reads dt and writes ddt in the dtype
        MemoryBound("SSD dA and dt backward", hl * (56 * ct + 2 * tokens * d)),
        MemoryBound("Mamba conv1d + SiLU backward", 3 * c * d)]  # causal_conv1d_bwd: read xBC, dxBC; write dxBC
    return fwd, bwd


def mamba_kernels(mixer: MambaMixer, hidden: int, tokens: int, tp: int, *, sp: bool, dtype_bytes: int,
                  batch: int) -> PieceKernels:
    """One mixer's kernels for one microbatch on one rank: F, I (input-gradient GEMMs and every elementwise and scan
    backward kernel, the scan's recomputation opening its backward), W (in_proj's and out_proj's weight gradients).

    `tokens` = b s / cp of the microbatch (all-gathered under sp: the GEMMs and everything between them see every
    token, so `sp` changes none of the mixer's kernels); `batch` = b sequences, each scanned in chunks of Q. Under
    cp Megatron's MambaContextParallel trades sequence for heads (all-to-all) around the conv and the scan: the
    whole sequence on H / (tp cp) heads, the same GEMM shapes summed. Memory-bound kernels move `dtype_bytes` per
    element (the norm's rstd float32): the norm F 2 e d + 4 t G / tp, B 3 e d + 4 t G / tp (pipesim's norm
    convention; its weight gradient's per-SM partial sums left out); with b > 1 Megatron's `rearrange(...)
    .contiguous()` copies zxBCdt and the scan output ([s, b] to [b, s] and back), and TE's dgrad copies zxBCdt's
    gradient back (each reads and writes every element once). Not here: the pre-norm, the residual add, the tp
    collectives and gradient accumulation (the caller's); the gradients of conv1d, dt_bias, A_log and D come out of
    their backward kernels (partial sums left out)."""
    check_mamba_split(mixer, tp)
    positive("hidden", hidden)
    positive("dtype_bytes", dtype_bytes)
    d = dtype_bytes
    in_proj, out_proj = projections(hidden, mixer.in_proj_width, mixer.d_inner, tokens, tp)
    scan_f, scan_b = _scan(mixer, tokens, tp, batch, d)
    e, w, gl = tokens * mixer.d_inner // tp, tokens * mixer.in_proj_width // tp, mixer.groups // tp
    norm = 2 * e * d + STAT_BYTES * tokens * gl  # read y, write its norm, one float32 rstd per token and group
    t_in = [MemoryBound("zxBCdt transpose", 2 * w * d)] if batch > 1 else []
    t_out = [MemoryBound("SSD output transpose", 2 * e * d)] if batch > 1 else []
    t_grad = [MemoryBound("zxBCdt gradient transpose", 2 * w * d)] if batch > 1 else []
    f = [*forward_gemms([in_proj]), *t_in, *scan_f, *t_out, MemoryBound("Mamba gated RMSNorm", norm),
         *forward_gemms([out_proj])]
    i = [*dgrad_gemms([out_proj]), MemoryBound("Mamba gated RMSNorm backward", norm + e * d), *scan_b, *t_grad,
         *dgrad_gemms([in_proj])]
    return PieceKernels(tuple(f), tuple(i), tuple(wgrad_gemms([in_proj, out_proj])))


def mamba_saved(mixer: MambaMixer, hidden: int, tokens: int, tp: int, *, sp: bool,
                dtype_bytes: int) -> list[SavedTensor]:
    """What the mixer keeps for its backward per microbatch on one rank: in_proj's input (the pre-norm's output; TE
    keeps the rank's shard under sp and gathers it again), MambaSplitConv1dScanCombinedFn's zxbcdt (in_proj's whole
    output: z, the conv's input xBC, dt) and out_x (y + D x before the gate; the conv output, the states and the
    cumsums are recomputed), the norm's input and its float32 rstd per token and group (LayerNormFn), and out_proj's
    input. Parameters the functions save are not activations. Not the layer's pre-norm input (the caller's)."""
    check_mamba_split(mixer, tp)
    positive("hidden", hidden)
    positive("tokens", tokens)
    positive("dtype_bytes", dtype_bytes)
    d, e = dtype_bytes, tokens * mixer.d_inner // tp
    gathered = d * tokens * hidden
    return [SavedTensor("in_proj input", gathered // tp if sp else gathered, block=BLOCK),
            SavedTensor("zxBCdt (in_proj output)", d * tokens * mixer.in_proj_width // tp, block=BLOCK),
            SavedTensor("SSD output before the gate (y + D x)", d * e, block=BLOCK),
            SavedTensor("gated RMSNorm input", d * e, block=BLOCK),
            SavedTensor("gated RMSNorm rstd", STAT_BYTES * tokens * (mixer.groups // tp), block=BLOCK),
            SavedTensor("out_proj input", d * e, block=BLOCK)]


def mamba_flops(mixer: MambaMixer, hidden: int, tokens: int, tp: int = 1, *, batch: int = 1) -> tuple[int, int, int]:
    """(F, I, W) FLOPs of the mixer's Gemm kernels on one rank (mamba_kernels' summed by phase). The linears
    2 t h W / t and 2 t d_inner h / t (Megatron's mamba_layer_flops terms, megatron/training/training.py) in each
    phase; the scan over K chunks (`batch` sequences of tokens / batch, each padded to whole chunks) F 2 K Q (Gl Q N
    + Hl P (2 N + Q)), I 2 K Q (3 Gl Q N + Hl P (5 N + 3 Q)), Gl = G / t and Hl = H / t."""
    check_mamba_split(mixer, tp)
    positive("hidden", hidden)
    m, q, n, p = mixer, mixer.chunk, mixer.state, mixer.head_dim
    k, gl, hl = scan_chunks(m.chunk, tokens, batch), m.groups // tp, m.heads // tp
    linears = 2 * tokens * hidden * (m.in_proj_width + m.d_inner) // tp
    scan_f = 2 * k * q * (gl * q * n + hl * p * (2 * n + q))
    scan_b = 2 * k * q * (3 * gl * q * n + hl * p * (5 * n + 3 * q))
    return linears + scan_f, linears + scan_b, linears


__all__ = ["MambaMixer", "check_mamba_split", "mamba_flops", "mamba_kernels", "mamba_params", "mamba_saved",
           "mamba_tensors"]
