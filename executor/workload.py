"""What a Runtime trains: the stage modules, the loss, each step's batch and the boundary tensors.

`BuiltinWorkload` is pipesim's own MLP and GPT (`executor.models`, from a `RunConfig`); `PiecesWorkload`
is any model given as a list of pieces (a user's layers, optionally with an embedding and a head)
cut into stages, with a loss and a batch source: the library API (`executor.api`) and `pipesim run
--model MODULE:FACTORY` build one. Boundary shapes come from running a microbatch through the stages
once on the meta device (shape inference), so nobody states them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from executor.models import DTYPES, Prepare, StageModule, boundary_shape, build_stages, loss_fn, synthetic_batch
from executor.run_config import RunConfig
from pipesim.errors import PipesimError
from pipesim.model.config import split_layers

Boundary = tuple[tuple[int, ...], torch.dtype]  # shape and dtype of the tensor stage s sends to stage s + 1


class BuiltinWorkload:
    """pipesim's MLP or GPT, exactly as the executor has always built them."""

    tensor_parallel = True  # executor.models knows how to shard these

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.batch_rows = cfg.model.batch  # rows of the global batch
        self.loss = partial(loss_fn, cfg.model)

    def layers_per_stage(self, num_stages: int) -> list[int]:
        return self.cfg.layers_per_stage(num_stages)

    def stage_modules(self, num_stages: int, wanted: list[int], prepare: Prepare | None = None,
                      ep: tuple[int, int] | None = None) -> dict[int, nn.Module]:
        """The stages' modules; a transformer's pieces each `prepare`d as it is built (the MLP's tensor parallelism
        pairs layers, so its stages are prepared whole, by the caller); `ep` (the rank's ep coordinate, ep): its MoE
        MLPs draw only that rank's experts."""
        piecewise = prepare if self.cfg.model.kind == "gpt" else None
        return build_stages(self.cfg.model, self.layers_per_stage(num_stages), wanted, piecewise, ep)

    def batch(self, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return synthetic_batch(self.cfg.model, step, device)

    def boundaries(self, num_stages: int, rows: int, seq_shards: int = 1) -> list[Boundary]:
        shape, dtype = boundary_shape(self.cfg.model, rows, seq_shards), DTYPES[self.cfg.model.dtype]
        return [(shape, dtype)] * (num_stages - 1)


@dataclass
class PiecesWorkload:
    """A model as pieces (embedding?, layers..., head?) cut by layers; loss(out, target); batch(step) -> (x, y).

    `split` is layers per stage (None: even, earlier stages take the remainder); the embedding goes
    to the first stage and the head to the last. Parameter names are `pieces.<index>.<name>`, the
    names of `full_model()`, so a single-process reference compares name by name.
    """

    pieces: list[nn.Module]
    layers: int  # how many of the pieces are layers (the rest: embedding first, head last)
    has_embedding: bool
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch_source: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    batch_rows: int  # rows of the global batch
    split: tuple[int, ...] | None = None
    tensor_parallel = False

    def layers_per_stage(self, num_stages: int) -> list[int]:
        return split_layers(self.layers, num_stages, list(self.split) if self.split else None)

    def ranges(self, num_stages: int) -> list[range]:
        """Which pieces each stage holds."""
        extra = int(self.has_embedding)
        out, start = [], 0
        for s, n in enumerate(self.layers_per_stage(num_stages)):
            lo = start + extra if s > 0 else 0
            hi = start + n + extra
            if s == num_stages - 1:
                hi = len(self.pieces)  # the head, if any
            out.append(range(lo, hi))
            start += n
        return out

    def stage_modules(self, num_stages: int, wanted: list[int], prepare: Prepare | None = None,
                      ep: tuple[int, int] | None = None) -> dict[int, nn.Module]:
        """The stages' modules, unprepared (`prepare` and `ep` are for pipesim's own models: the caller prepares
        these)."""
        ranges = self.ranges(num_stages)
        return {s: StageModule({i: self.pieces[i] for i in ranges[s]}) for s in wanted}

    def full_model(self) -> nn.Module:
        """All pieces in one module (the single-process reference), names as on the stages."""
        return StageModule(dict(enumerate(self.pieces)))

    def batch(self, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.batch_source(step)
        if x.shape[0] != self.batch_rows:
            raise PipesimError(f"step {step}'s batch has {x.shape[0]} rows, the first had {self.batch_rows}")
        return x.to(device), y.to(device)

    def boundaries(self, num_stages: int, rows: int, seq_shards: int = 1) -> list[Boundary]:
        if seq_shards != 1:  # RunConfig.check refuses sequence parallelism for a user's model
            raise PipesimError("a user's model runs without sequence parallelism")
        x, _ = self.batch_source(0)
        shapes = infer_boundaries([self.stage_modules(num_stages, [s])[s] for s in range(num_stages)], x[:rows])
        return shapes[:-1]


def infer_boundaries(stages: list[nn.Module], example: torch.Tensor) -> list[Boundary]:
    """(shape, dtype) of each stage's output for `example` as its first stage's input, run once on the meta
    device (copies of the stages: no real allocation, the modules untouched); on CPU where an op has no
    meta kernel."""
    try:
        return _run_through(stages, example, torch.device("meta"))
    except PipesimError:
        raise
    except Exception:  # noqa: BLE001 - an op without a meta kernel: the real thing, on CPU
        return _run_through(stages, example, torch.device("cpu"))


def _run_through(stages: list[nn.Module], example: torch.Tensor, device: torch.device) -> list[Boundary]:
    out: list[Boundary] = []
    x = example.to(device) if device.type == "meta" else example
    with torch.no_grad():
        for s, module in enumerate(stages):
            shape = tuple(x.shape)
            try:
                x = (copy.deepcopy(module).to(device) if device.type == "meta" else module)(x)
            except Exception as exc:
                if device.type == "meta":
                    raise
                raise PipesimError(f"shape inference: stage {s} on an input of shape {list(shape)} raised "
                                   f"{type(exc).__name__}: {exc}") from None
            if not isinstance(x, torch.Tensor):
                raise PipesimError(f"stage {s} returned {type(x).__name__}; each stage must return one tensor")
            out.append((tuple(x.shape), x.dtype))
    return out
