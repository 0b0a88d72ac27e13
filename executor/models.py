"""The models the executor trains: the lecture's deep MLP and a small GPT, cut into stages by layers.

The full model is built from the seed once, identically on every rank, and each stage keeps its
slice; the single-process reference builds the same model, so parameters match by construction.
Parameter names are the full model's (`pieces.3.fc1.weight`) on every stage.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from executor.experts import MoeMLP, Steps, drive
from pipesim.model.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class MLPLayer(nn.Module):
    """Linear(h, h) + GELU: one layer of the lecture's deep MLP."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, h) -> (b, h)
        return F.gelu(self.fc(x))


class Embed(nn.Module):
    """Token plus learned position embeddings (first GPT stage only)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (b, t) int64 -> (b, t, h)
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(pos)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4h MLP (or, on a layer with experts, an MoE MLP:
    executor.experts; `steps` then yields its all-to-alls in flight).

    Under TP (Megatron) a rank holds heads/tp heads: `qkv` column-parallel (its q, k and v rows of
    those heads), `proj` row-parallel; `fc1` column-, `fc2` row-parallel. The forward reads the local
    width off `qkv`'s output, so one code path serves the full and the sharded block.
    """

    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        h = cfg.hidden
        self.head_dim = h // cfg.heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.moe = MoeMLP(h, cfg.moe) if cfg.moe is not None and cfg.moe.is_moe_layer(layer) else None
        if self.moe is None:
            self.fc1 = nn.Linear(h, 4 * h)
            self.fc2 = nn.Linear(4 * h, h)
        self.recompute_attention = False  # selective recomputation: the core keeps only q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, t, h) -> (b, t, h)
        if self.moe is not None:
            return drive(self.steps(x))
        x = self.attend(x)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def steps(self, x: torch.Tensor) -> Steps:
        """The block as a generator yielding its MoE MLP's all-to-alls in flight (none for a dense block)."""
        x = self.attend(x)
        if self.moe is None:
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x + (yield from self.moe.steps(self.ln2(x)))

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """x plus the attention's output."""
        qkv = self.qkv(self.ln1(x))  # (b, t, 3 hl); hl = h, or h / tp for this rank's heads
        b, t, width = qkv.shape  # b: all rows of the microbatch, also under sequence parallelism
        hl, hs = width // 3, self.head_dim
        q, k, v = (z.view(b, t, hl // hs, hs).transpose(1, 2) for z in qkv.split(hl, dim=2))  # (b, nh, t, hs)
        if self.recompute_attention:
            y = checkpoint(attention_core, q, k, v, use_reentrant=False)
        else:
            y = attention_core(q, k, v)
        y = y.transpose(1, 2).reshape(b, t, hl)
        return x + self.proj(y)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax(QK^T / sqrt(d)) V, (b, nh, t, hs) each: what selective recomputation re-runs."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Head(nn.Module):
    """Final LayerNorm and the vocabulary projection (last GPT stage only)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, t, h) -> (b, t, vocab)
        return self.out(self.ln(x))


class FullModel(nn.Module):
    """The whole network as a list of pieces; a stage is a contiguous run of pieces."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.kind = cfg.kind
        if cfg.kind == "mlp":
            pieces = [MLPLayer(cfg.hidden) for _ in range(cfg.layers)]
        else:
            pieces = [Embed(cfg)] + [Block(cfg, layer) for layer in range(cfg.layers)] + [Head(cfg)]
        self.pieces = nn.ModuleList(pieces)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for piece in self.pieces:
            x = piece(x)
        return x


class StageModule(nn.Module):
    """A stage's pieces, keyed by their index in the full model so parameter names stay global."""

    def __init__(self, pieces: dict[int, nn.Module]) -> None:
        super().__init__()
        self.pieces = nn.ModuleDict({str(i): p for i, p in pieces.items()})
        self.checkpointed: set[str] = set()  # full recomputation: pieces that keep only their input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for key, piece in self.pieces.items():
            if key in self.checkpointed:
                x = checkpoint(piece, x, use_reentrant=False)  # backward re-runs it (TP collectives too)
            else:
                x = piece(x)
        return x

    def steps(self, x: torch.Tensor) -> Steps:
        """The stage as a generator yielding the all-to-alls in flight of its MoE blocks, or of any piece with such a
        `steps(x)` generator (a user's layer: examples/moe_layers.py); DualPipeV's overlapped F&B waits for them
        later. No recomputation here: `RunConfig.check` refuses it with experts."""
        for piece in self.pieces.values():
            x = (yield from piece.steps(x)) if callable(getattr(piece, "steps", None)) else piece(x)
        return x


def set_recompute(stage: StageModule, mode: str) -> None:
    """Activation recomputation, Megatron's meanings, with torch.utils.checkpoint (non-reentrant).

    full: every transformer (or MLP) layer keeps only its input; its backward first re-runs its
    forward. selective: only each block's attention core (QK^T, softmax, attention over V) is
    re-run. The embedding and the head are never recomputed. Gradients are unchanged.
    """
    stage.checkpointed = ({key for key, piece in stage.pieces.items() if isinstance(piece, Block | MLPLayer)}
                          if mode == "full" else set())
    for piece in stage.pieces.values():
        if isinstance(piece, Block):
            piece.recompute_attention = mode == "selective"


def build_full(cfg: ModelConfig) -> FullModel:
    """The full model from `cfg.seed`; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = FullModel(cfg)
    return model.to(DTYPES[cfg.dtype])


def piece_ranges(cfg: ModelConfig, layers_per_stage: list[int]) -> list[range]:
    """Which pieces of the full model each stage holds (GPT: embedding on the first, head on the last)."""
    ranges, start = [], 0
    extra = 1 if cfg.kind == "gpt" else 0  # the embedding piece shifts block indices by one
    for s, n in enumerate(layers_per_stage):
        lo = start + extra if s > 0 else 0
        hi = start + n + extra
        if cfg.kind == "gpt" and s == len(layers_per_stage) - 1:
            hi += 1  # the head
        ranges.append(range(lo, hi))
        start += n
    return ranges


def build_stages(cfg: ModelConfig, layers_per_stage: list[int], wanted: list[int]) -> dict[int, StageModule]:
    """Stage modules for the stages in `wanted`, cut from one full model built from the seed."""
    full = build_full(cfg)
    ranges = piece_ranges(cfg, layers_per_stage)
    return {s: StageModule({i: full.pieces[i] for i in ranges[s]}) for s in wanted}


def loss_fn(cfg: ModelConfig, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """MSE to a synthetic target (mlp) or next-token cross-entropy (gpt); mean over the microbatch."""
    if cfg.kind == "mlp":
        return F.mse_loss(out.float(), target.float())
    return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), target.reshape(-1))


def synthetic_batch(cfg: ModelConfig, step: int,
                    device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: inputs and targets drawn from (seed, step), the same on every rank."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step + 1)
    if cfg.kind == "mlp":
        x = torch.randn(cfg.batch, cfg.hidden, generator=gen, dtype=torch.float32)
        y = torch.randn(cfg.batch, cfg.hidden, generator=gen, dtype=torch.float32)
        return x.to(device, DTYPES[cfg.dtype]), y.to(device, DTYPES[cfg.dtype])
    tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq + 1), generator=gen)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def boundary_shape(cfg: ModelConfig, microbatch_size: int) -> tuple[int, ...]:
    """Shape of the activation (and its gradient) between two stages; known ahead, so no handshake."""
    if cfg.kind == "mlp":
        return (microbatch_size, cfg.hidden)
    return (microbatch_size, cfg.seq, cfg.hidden)


def group_rows_by_rank(full: nn.Linear, stacked: int, tp: int) -> nn.Linear:
    """A copy of `full` whose output rows [A; B; C] (`stacked` blocks) are reordered [A0 B0 C0 | A1 B1 C1 | ...].

    Then the contiguous 1/tp row slice a column-parallel layer takes is rank r's share of every
    block: for `qkv`, the q, k and v rows of rank r's heads. `params.full_parameters` undoes it.
    """
    out = nn.Linear(full.in_features, full.out_features, bias=full.bias is not None,
                    device=full.weight.device, dtype=full.weight.dtype)
    with torch.no_grad():
        for mine, theirs in zip(out.parameters(), full.parameters(), strict=True):
            n = theirs.shape[0] // (stacked * tp)
            mine.copy_(theirs.reshape(stacked, tp, n, *theirs.shape[1:]).transpose(0, 1).reshape(theirs.shape))
    return out


def apply_tensor_parallel(stage: StageModule, cfg: ModelConfig, group, *, sequence_parallel: bool = False) -> None:
    """Megatron sharding: mlp layer pairs column/row; GPT blocks' attention by heads (qkv column, proj row)
    and MLP (fc1 column, fc2 row): one all_reduce per pair forward and one backward.

    With `sequence_parallel` the activations between blocks are split by rows (dim 0: samples of
    the microbatch) over the TP group; norms run on the shard, attention on all rows of its heads.
    """
    import torch.distributed as dist

    from executor.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    if cfg.kind == "mlp":
        layers = list(stage.pieces.values())
        for a, b in zip(layers[0::2], layers[1::2], strict=True):
            a.fc = ColumnParallelLinear(a.fc, group, sequence_parallel=sequence_parallel)
            b.fc = RowParallelLinear(b.fc, group, sequence_parallel=sequence_parallel)
        return
    tp = dist.get_world_size(group)
    for piece in stage.pieces.values():
        if isinstance(piece, Block):
            piece.qkv = ColumnParallelLinear(group_rows_by_rank(piece.qkv, 3, tp), group,
                                             sequence_parallel=sequence_parallel)
            piece.qkv.stacked = 3  # q, k, v blocks: read by params.full_parameters
            piece.proj = RowParallelLinear(piece.proj, group, sequence_parallel=sequence_parallel)
            if piece.moe is None:  # an MoE MLP runs on the rank's own rows (sequence parallel; its experts: ep)
                piece.fc1 = ColumnParallelLinear(piece.fc1, group, sequence_parallel=sequence_parallel)
                piece.fc2 = RowParallelLinear(piece.fc2, group, sequence_parallel=sequence_parallel)


def replicated_parameters(stages) -> list[nn.Parameter]:
    """Parameters outside the tensor-parallel layers (held whole on every TP rank), in a fixed order."""
    from executor.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    sharded = {id(p) for st in stages for mod in st.modules()
               if isinstance(mod, ColumnParallelLinear | RowParallelLinear) for p in mod.parameters()}
    return [p for st in stages for p in st.parameters() if id(p) not in sharded]
