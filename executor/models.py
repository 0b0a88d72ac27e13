"""The models the executor trains: the lecture's deep MLP and a transformer, cut into stages by layers.

The transformer is executor.transformer's blocks between an embedding and a head, whatever structure the ModelConfig
gives them (the GPT of Megatron's papers by default).

Each piece (a layer; a transformer's embedding, block or head) is drawn from its own seed, so a rank builds only
the pieces of its stages and they are the full model's; the single-process reference builds every piece the same
way, so parameters match by construction.
Parameter names are the full model's (`pieces.3.fc1.weight`) on every stage.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from executor.experts import Steps
from executor.mlp import fc1_rows
from executor.transformer import Block, make_norm, qkv_rows
from pipesim.model.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Prepare = Callable[[nn.Module], nn.Module]  # a piece, sharded and moved where it runs
SEQUENCE_DIM = 1  # a transformer's activations are (b, s, h): sequence parallelism splits s
EMBEDDING_WEIGHT = "pieces.0.tok.weight"  # the token embedding's name in the full model (piece 0), a tied head's too


class MLPLayer(nn.Module):
    """Linear(h, h) + GELU: one layer of the lecture's deep MLP."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, h) -> (b, h)
        return F.gelu(self.fc(x))


def embedding_scale(cfg: ModelConfig) -> float | None:
    """Gemma's factor on the token embeddings, sqrt(hidden) rounded to float32 and then to the model's dtype as
    transformers' Gemma3TextScaledWordEmbedding rounds it (its float32 buffer cast to the weight's dtype), so that
    x * factor is its product bit for bit; None without (`ModelConfig.embedding_scale`)."""
    if not cfg.embedding_scale:
        return None
    return torch.tensor(cfg.hidden ** 0.5).to(DTYPES[cfg.dtype]).item()


class Embed(nn.Module):
    """Token embeddings (times Gemma's sqrt(hidden) when the model scales them), plus a learned position table unless
    the blocks rotate (first GPT stage only)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden) if cfg.positions == "learned" else None
        self.scale = embedding_scale(cfg)
        self.first_position = 0  # of the tokens it gets: a sequence-parallel rank's shard starts further on

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (b, t) int64 -> (b, t, h)
        tok = self.tok(idx) if self.scale is None else self.tok(idx) * self.scale
        if self.pos is None:
            return tok
        pos = torch.arange(self.first_position, self.first_position + idx.shape[1], device=idx.device)
        return tok + self.pos(pos)


class Head(nn.Module):
    """Final norm and the vocabulary projection (last GPT stage only); with tied embeddings the projection's weight is
    the token embedding's (FullModel ties them), a copy of it on a rank that does not hold the embedding."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln = make_norm(cfg.norm, cfg.hidden, cfg.norm_eps)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.out.tied_head = cfg.tied_embeddings  # its weight saved under EMBEDDING_WEIGHT (params.module_parameters)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, t, h) -> (b, t, vocab)
        return self.out(self.ln(x))


class FullModel(nn.Module):
    """The whole network as a list of pieces; a stage is a contiguous run of pieces."""

    def __init__(self, pieces: list[nn.Module]) -> None:
        super().__init__()
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
        self.prepared = False  # its pieces already sharded and on their device (build_stages' `prepare`)

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
        later. A piece full recomputation checkpoints runs as `forward` does, its all-to-alls waited on at once
        (nothing of it overlaps), and again in its backward."""
        for key, piece in self.pieces.items():
            if key in self.checkpointed:
                x = checkpoint(piece, x, use_reentrant=False)
            elif callable(getattr(piece, "steps", None)):
                x = yield from piece.steps(x)
            else:
                x = piece(x)
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


def piece_count(cfg: ModelConfig) -> int:
    """Pieces of the full model: the MLP's layers, or a transformer's embedding, blocks and head."""
    return cfg.layers if cfg.kind == "mlp" else cfg.layers + 2


def piece_seed(seed: int, index: int) -> int:
    """The seed piece `index` is drawn from: each piece its own, so that a rank builds only the pieces it holds and
    they are the full model's, bit for bit."""
    return seed * 7_919 + index


def build_piece(cfg: ModelConfig, index: int, ep: tuple[int, int] | None = None) -> nn.Module:
    """Piece `index` of the full model, drawn from its own seed (the global RNG is left as it was), in cfg's dtype;
    `ep` (the rank's ep coordinate, ep): a block's MoE MLP draws only that rank's experts."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(piece_seed(cfg.seed, index))
        if cfg.kind == "mlp":
            piece = MLPLayer(cfg.hidden)
        elif index == 0:
            piece = Embed(cfg)
        elif index == cfg.layers + 1:
            piece = Head(cfg)
        else:
            piece = Block(cfg, index - 1, ep=ep)
    return piece.to(DTYPES[cfg.dtype])


def build_pieces(cfg: ModelConfig, indices: list[int], prepare: Prepare | None = None,
                 ep: tuple[int, int] | None = None) -> dict[int, nn.Module]:
    """The pieces at `indices` and nothing else (a rank's stages: a 70B model is never built whole on one rank), each
    passed through `prepare` (sharded, moved to its device) before the next is built, so a rank holds one unsharded
    piece at a time. A head tied to the embedding shares its Parameter when both are built, else starts from a copy
    of its values."""
    pieces: dict[int, nn.Module] = {}
    for i in sorted(indices):
        piece = build_piece(cfg, i, ep)
        if cfg.kind == "gpt" and cfg.tied_embeddings and i == cfg.layers + 1:
            embed = pieces.get(0)
            piece.out.weight = embed.tok.weight if embed is not None else \
                nn.Parameter(build_piece(cfg, 0).tok.weight.detach().clone())
        pieces[i] = prepare(piece) if prepare is not None else piece
    return pieces


def build_full(cfg: ModelConfig) -> FullModel:
    """The full model from `cfg.seed` (the single-process reference's)."""
    pieces = build_pieces(cfg, list(range(piece_count(cfg))))
    return FullModel([pieces[i] for i in range(piece_count(cfg))])


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


def build_stages(cfg: ModelConfig, layers_per_stage: list[int], wanted: list[int],
                 prepare: Prepare | None = None, ep: tuple[int, int] | None = None) -> dict[int, StageModule]:
    """Stage modules for the stages in `wanted`: their pieces of the full model, built alone from their seeds (and
    each prepared as it is built: the modules say so)."""
    ranges = piece_ranges(cfg, layers_per_stage)
    pieces = build_pieces(cfg, sorted({i for s in wanted for i in ranges[s]}), prepare, ep)
    stages = {s: StageModule({i: pieces[i] for i in ranges[s]}) for s in wanted}
    for stage in stages.values():
        stage.prepared = prepare is not None
    return stages


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


def boundary_shape(cfg: ModelConfig, microbatch_size: int, seq_shards: int = 1) -> tuple[int, ...]:
    """Shape of the activation (and its gradient) between two stages, its sequence split over `seq_shards`
    sequence-parallel ranks; known ahead, so no handshake."""
    if cfg.kind == "mlp":
        return (microbatch_size, cfg.hidden)
    return (microbatch_size, cfg.seq // seq_shards, cfg.hidden)


def group_rows_by_rank(full: nn.Linear, blocks: tuple[int, ...], tp: int) -> nn.Linear:
    """A copy of `full` whose output rows [A; B; C] (blocks of `blocks` rows) are reordered [A0 B0 C0 | A1 B1 C1 | ...].

    Then the contiguous 1/tp row slice a column-parallel layer takes is rank r's share of every block: for `qkv`, the
    q, k and v rows of rank r's query and key/value heads; for SwiGLU's `fc1`, its gate and up rows.
    `params.ungroup_rows_by_rank` undoes it.
    """
    out = nn.Linear(full.in_features, full.out_features, bias=full.bias is not None,
                    device=full.weight.device, dtype=full.weight.dtype)
    with torch.no_grad():
        for mine, theirs in zip(out.parameters(), full.parameters(), strict=True):
            parts = [part.reshape(tp, rows // tp, *theirs.shape[1:]) for part, rows
                     in zip(theirs.split(list(blocks)), blocks, strict=True)]  # (tp, rows / tp, ...) each
            mine.copy_(torch.cat(parts, dim=1).reshape(theirs.shape))
    return out


def _column(linear: nn.Linear, blocks: tuple[int, ...], group, tp: int, sequence_parallel: bool) -> nn.Module:
    """A column-parallel shard of `linear` (a transformer's: sequence-parallel on the sequence, dim 1), its rows
    grouped by rank first when it stacks several blocks."""
    from executor.tensor_parallel import ColumnParallelLinear

    layer = ColumnParallelLinear(group_rows_by_rank(linear, blocks, tp) if len(blocks) > 1 else linear, group,
                                 sequence_parallel=sequence_parallel, sp_dim=SEQUENCE_DIM)
    layer.blocks = blocks  # read by params.full_parameters
    return layer


def apply_tensor_parallel(stage: StageModule, cfg: ModelConfig, group, *, sequence_parallel: bool = False) -> None:
    """Megatron sharding: mlp layer pairs column/row; GPT blocks' attention by heads (qkv column, proj row)
    and MLP (fc1 column, fc2 row): one all_reduce per pair forward and one backward.

    With `sequence_parallel` the activations between blocks are split over the TP group: a transformer's by its
    sequence (dim 1 of (b, s, h), Megatron's split; the embedding adds the positions of its shard), the MLP's by rows
    (dim 0 of (b, h)); norms run on the shard, attention on the whole sequence of its heads.
    """
    from executor.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    if cfg.kind == "mlp":
        layers = list(stage.pieces.values())
        for a, b in zip(layers[0::2], layers[1::2], strict=True):
            a.fc = ColumnParallelLinear(a.fc, group, sequence_parallel=sequence_parallel)
            b.fc = RowParallelLinear(b.fc, group, sequence_parallel=sequence_parallel)
        return
    for piece in stage.pieces.values():
        shard_piece(piece, cfg, group, sequence_parallel=sequence_parallel)


def shard_piece(piece: nn.Module, cfg: ModelConfig, group, *, sequence_parallel: bool = False) -> None:
    """One transformer piece's Megatron sharding over `group` (apply_tensor_parallel's, a piece at a time)."""
    import torch.distributed as dist

    from executor.tensor_parallel import RowParallelLinear

    tp = dist.get_world_size(group)
    if isinstance(piece, Embed) and sequence_parallel:
        piece.first_position = dist.get_rank(group) * cfg.seq // tp
    if isinstance(piece, Block):
        piece.first_head = dist.get_rank(group) * cfg.heads // tp  # its sinks: its own heads'
        piece.qkv = _column(piece.qkv, qkv_rows(cfg), group, tp, sequence_parallel)
        piece.proj = RowParallelLinear(piece.proj, group, sequence_parallel=sequence_parallel, sp_dim=SEQUENCE_DIM)
        if piece.moe is None:  # an MoE MLP runs on the rank's own rows (sequence parallel; its experts: ep)
            piece.fc1 = _column(piece.fc1, fc1_rows(cfg.activation, cfg.ffn_size), group, tp, sequence_parallel)
            piece.fc2 = RowParallelLinear(piece.fc2, group, sequence_parallel=sequence_parallel,
                                          sp_dim=SEQUENCE_DIM)


def head_parameters(stages) -> list[nn.Parameter]:
    """The QK-norms' weights (and biases) and the attention sinks: whole on every TP rank but applied to its own heads
    only, so each rank's gradient is a partial sum to add over tp with or without sequence parallelism (Megatron-core
    all-reduces the norms' over tp too: finalize_model_grads' _allreduce_layernorm_grads; it shards the sinks by head,
    which the sum over whole copies equals)."""
    out: list[nn.Parameter] = []
    for block in (mod for st in stages for mod in st.modules() if isinstance(mod, Block)):
        for norm in (block.q_norm, block.k_norm):
            out += norm.parameters() if norm is not None else []
        out += [block.sinks] if block.sinks is not None else []
    return out


def replicated_parameters(stages) -> list[nn.Parameter]:
    """Parameters outside the tensor-parallel layers (held whole on every TP rank), in a fixed order."""
    from executor.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    sharded = {id(p) for st in stages for mod in st.modules()
               if isinstance(mod, ColumnParallelLinear | RowParallelLinear) for p in mod.parameters()}
    whole = {id(p): p for st in stages for p in st.parameters() if id(p) not in sharded}  # a tied one once
    return list(whole.values())
