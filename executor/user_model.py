"""A user's model from `--model MODULE:FACTORY`: called, checked, trained (a PiecesWorkload) and counted.

The torch-free half (parsing the spec, importing the factory, the cost table) is `pipesim.cost.user_model_costs`.
Counting runs each piece once forward and backward on the meta device (no real allocation) under
torch's FlopCounterMode: F is the forward's FLOPs; I the FLOPs of the gradient with respect to the
piece's input alone (autograd prunes what only the weights need); W the rest of the full backward
(what the executor's split W computes: stage.py runs no work twice). A piece whose input needs no
gradient (the data) has I = 0 and W = its whole backward; a piece whose backward cannot run on meta
takes the usual rule, I = W = F. FlopCounterMode counts matrix products and convolutions (mm, addmm,
bmm, convolution, attention); elementwise ops count 0 FLOPs, as in pipesim's own models.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from executor.experts import MoeMLP
from executor.run_config import RunConfig
from executor.workload import PiecesWorkload, infer_boundaries
from pipesim.cost.user_model_costs import ModelParts, PieceCounts, UserModel, load_factory, model_parts
from pipesim.errors import PipesimError

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def call_factory(spec: str, seed: int = 0, device: torch.device | str | None = None) -> ModelParts:
    """The factory's ModelParts, built from `seed` (the same on every rank), types checked; one line when wrong.

    `device="meta"` builds it without allocating (for counting)."""
    factory = load_factory(spec)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if device is not None:
                with torch.device(device):
                    result = factory()
            else:
                result = factory()
    except PipesimError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: reported in one line
        raise PipesimError(f"--model {spec}: the factory raised {type(exc).__name__}: {exc}") from None
    parts = model_parts(result, spec)
    layers = list(parts.layers) if isinstance(parts.layers, list | tuple | nn.ModuleList | nn.Sequential) else None
    if not layers or not all(isinstance(m, nn.Module) for m in layers):
        raise PipesimError(f"--model {spec}: layers must be a non-empty list of torch.nn.Module, got "
                           f"{type(parts.layers).__name__}")
    for name in ("embedding", "head"):
        value = getattr(parts, name)
        if value is not None and not isinstance(value, nn.Module):
            raise PipesimError(f"--model {spec}: {name} must be a torch.nn.Module or None, got {type(value).__name__}")
    for name in ("example_input", "example_target"):
        value = getattr(parts, name)
        if value is not None and not isinstance(value, torch.Tensor):
            raise PipesimError(f"--model {spec}: {name} must be a torch.Tensor, got {type(value).__name__}")
        if isinstance(value, torch.Tensor) and value.dim() < 1:
            raise PipesimError(f"--model {spec}: {name} needs a batch dimension, got a scalar")
    if parts.example_input is None:
        raise PipesimError(f"--model {spec}: example_input is required (a batch for the first piece)")
    if parts.loss is not None and not callable(parts.loss):
        raise PipesimError(f"--model {spec}: loss must be a function (output, target) -> scalar")
    return ModelParts(layers, parts.example_input, parts.embedding, parts.head, parts.loss, parts.example_target)


def pieces_of(parts: ModelParts) -> tuple[list[nn.Module], bool]:
    """(embedding?, layers..., head?) in order, and whether the first is an embedding."""
    pieces = ([parts.embedding] if parts.embedding is not None else []) + list(parts.layers)
    return pieces + ([parts.head] if parts.head is not None else []), parts.embedding is not None


def like(example: torch.Tensor, rows: int, gen: torch.Generator) -> torch.Tensor:
    """A batch of `rows` shaped like `example` past its first dimension: normal noise, or integers in
    [0, example.max() + 1) for an integer example (token ids)."""
    shape = (rows, *example.shape[1:])
    if example.is_floating_point():
        return torch.randn(shape, generator=gen).to(example.dtype)
    high = max(2, int(example.max()) + 1)
    return torch.randint(high, shape, generator=gen, dtype=example.dtype)


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The default loss: mean squared error, in float32."""
    return F.mse_loss(out.float(), target.float())


def workload_from_parts(parts: ModelParts, *, batch: int, seed: int, split: tuple[int, ...] | None,
                        spec: str = "model") -> PiecesWorkload:
    """Pieces, loss and synthetic data drawn from (seed, step), the same on every rank and in a reference."""
    pieces, has_embedding = pieces_of(parts)
    out_shape = infer_boundaries([nn.Sequential(*pieces)], parts.example_input[:1])[-1][0]
    if parts.example_target is None and parts.loss is not None:
        raise PipesimError(f"--model {spec}: a loss of your own needs example_target (what its targets look like)")

    def batch_source(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step + 1)
        x = like(parts.example_input, batch, gen)
        y = (like(parts.example_target, batch, gen) if parts.example_target is not None
             else torch.randn((batch, *out_shape[1:]), generator=gen))
        return x, y

    return PiecesWorkload(pieces, len(parts.layers), has_embedding, parts.loss or mse, batch_source, batch, split)


def workload_of(cfg: RunConfig) -> PiecesWorkload:
    """`pipesim run --model MODULE:FACTORY`'s workload: --batch rows a step, --layer-split, --seed."""
    parts = call_factory(cfg.factory, cfg.model.seed)
    return workload_from_parts(parts, batch=cfg.model.batch, seed=cfg.model.seed, split=cfg.layer_split,
                               spec=cfg.factory)


def check_run(cfg: RunConfig, stage_counts: list[int]) -> None:
    """Before anything starts: the factory loads and returns the right things, the split fits every
    schedule's stages, a microbatch passes through the stages (shape inference) on meta, and with --ep the
    factory's MoE MLPs exist and split evenly."""
    work = workload_of(cfg)
    for n in stage_counts:
        work.boundaries(n, cfg.model.batch // (cfg.job.dp * cfg.microbatches))
    ep = cfg.job.dims.ep
    if ep > 1:  # expert parallelism shards the factory's MoE MLPs (executor.experts, examples/moe_layers.py)
        counts = [m.num_experts for piece in work.pieces for m in piece.modules() if isinstance(m, MoeMLP)]
        if not counts:
            raise PipesimError(f"--ep {ep} shards MoE layers (executor.experts.MoeMLP); --model {cfg.factory} has none")
        if any(n % ep for n in counts):
            bad = next(n for n in counts if n % ep)
            raise PipesimError(f"--ep {ep} does not divide the {bad} experts of an MoE layer of --model {cfg.factory}")


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops that do work (views and detach excluded): the cost model's framework ops."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func not in (torch.ops.aten.detach.default,):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _measure(fn: Callable[[], object]) -> tuple[float, int]:
    """(FLOPs, ops) of running `fn`."""
    ops = _OpCounter()
    with FlopCounterMode(display=False) as flops, ops:
        fn()
    return float(flops.get_total_flops()), ops.count


def count_piece(piece: nn.Module, x: torch.Tensor, *, loss=None, target=None) -> tuple[PieceCounts, torch.Tensor]:
    """One piece's counts on input `x` (meta); its output (detached, meta) for the next piece."""
    params = [p for p in piece.parameters() if p.requires_grad]
    pids = {id(p) for p in params}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t  # a weight saved transposed is a view of it
        if id(base) not in pids:
            saved[id(t)] = t.numel() * t.element_size()
        return t

    out_box: list[torch.Tensor] = []

    def forward() -> None:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = piece(x)
            out_box.append(y)
            if loss is not None:
                out_box.append(loss(y, target))

    f_flops, f_ops = _measure(forward)
    y = out_box[0]
    root = out_box[-1]
    grad = torch.ones_like(root)
    dx = x.requires_grad
    in_bytes, out_bytes = x.numel() * x.element_size(), y.numel() * y.element_size()
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    measured = True
    try:
        i_flops, i_ops = _measure(lambda: torch.autograd.grad(root, [x], grad, retain_graph=True)) if dx else (0.0, 0)
        wanted = ([x] if dx else []) + params
        t_flops, t_ops = _measure(lambda: torch.autograd.grad(root, wanted, grad)) if wanted else (0.0, 0)
        w_flops, w_ops = max(0.0, t_flops - i_flops), max(0, t_ops - i_ops)
    except (NotImplementedError, RuntimeError):  # an op without a meta backward: the usual 1:1 rule
        measured = False
        i_flops, i_ops = (f_flops, f_ops) if dx else (0.0, 0)
        w_flops, w_ops = (f_flops, f_ops) if params else (0.0, 0)
    traffic = param_bytes + 2 * (in_bytes + out_bytes)  # bytes: as pipesim's MLP estimate (weights + 4 b h d)
    moved = (traffic, traffic if dx else 0.0, param_bytes + in_bytes + out_bytes if params else 0.0)
    counts = PieceCounts((f_flops, i_flops, w_flops), moved, (f_ops, i_ops, w_ops), float(sum(saved.values())),
                         sum(p.numel() for p in params), out_bytes, measured)
    return counts, y.detach()


def count_user_model(spec: str, *, batch: int, microbatches: int, dp: int = 1, seed: int = 0) -> UserModel:
    """Each piece's FLOPs, bytes and ops on one microbatch (batch / (dp x microbatches) rows), on meta."""
    if batch % (dp * microbatches):
        raise PipesimError(f"--batch {batch} does not split into dp({dp}) x {microbatches} microbatches evenly")
    rows = batch // (dp * microbatches)
    try:  # built on meta: no parameter is allocated
        parts = call_factory(spec, seed, device="meta")
    except PipesimError:
        parts = call_factory(spec, seed)  # a factory that needs real tensors (e.g. reads a value)
    pieces, has_embedding = pieces_of(parts)

    def empty_like(example: torch.Tensor) -> torch.Tensor:
        return torch.empty((rows, *example.shape[1:]), dtype=example.dtype, device="meta")

    x = empty_like(parts.example_input)
    metas = [copy.deepcopy(piece).to("meta") for piece in pieces]
    if parts.example_target is not None:
        target = empty_like(parts.example_target)
    else:  # the default target is shaped like the output
        target = torch.empty(infer_boundaries([nn.Sequential(*metas)], x)[-1][0], device="meta")
    counted = []
    for i, meta in enumerate(metas):
        x = x.requires_grad_(i > 0 and x.is_floating_point())
        last = i == len(metas) - 1
        counts, x = count_piece(meta, x, loss=(parts.loss or mse) if last else None, target=target if last else None)
        counted.append(counts)
    dtype = next((p.dtype for m in pieces for p in m.parameters()), torch.float32)
    return UserModel(spec, tuple(counted), len(parts.layers), has_embedding, DTYPE_NAMES.get(dtype, "float32"), rows)


def train_single(work: PiecesWorkload, steps: int, *, optimizer: str = "sgd",
                 lr: float = 0.01) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The single-process reference: the whole model on the whole batch; (losses, final parameters by name)."""
    model = work.full_model()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=lr) if optimizer == "sgd" else torch.optim.Adam(params, lr=lr)
    losses = []
    for step in range(steps):
        x, y = work.batch(step, torch.device("cpu"))
        loss = work.loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


__all__ = ["call_factory", "check_run", "count_piece", "count_user_model", "like", "mse", "pieces_of",
           "train_single", "workload_from_parts", "workload_of"]
