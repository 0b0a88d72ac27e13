"""A user's own model (`--model MODULE:FACTORY` or `FILE.py:FACTORY`): the torch-free half.

The factory returns `ModelParts`: the model's layers (and optionally an embedding and a head) plus an
example input. `executor.user_model` (torch) calls it, trains it and counts each piece's FLOPs and bytes
(`PieceCounts`, torch's FlopCounterMode on the meta device); here those counts become the simulator's
cost table on a given hardware (the same roofline rule as pipesim's own models,
`Hardware.compute_time`), and the per-stage work the calibration fit inverts. See docs/your_model.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipesim.cost.model_costs import DEFAULT_JOB, ParallelCosts
from pipesim.cost.step_costs import step_costs
from pipesim.cost.table import CostTable, StageCosts
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.job import Job
from pipesim.model.config import split_layers

if TYPE_CHECKING:  # the torch-free half names torch's types without importing torch
    from torch import Tensor
    from torch.nn import Module

FORMS = "MODULE:FACTORY (e.g. examples.conv_net:make) or FILE.py:FACTORY"


@dataclass
class ModelParts:
    """What a factory returns (a dict with these keys does as well).

    layers: the modules cut into stages, in order; example_input: a batch for the first piece (its
    first dimension is the batch: its other dimensions and dtype shape every batch); embedding /
    head: optional first / last pieces that go with the first / last stage without counting as
    layers; loss(output, target): default mean squared error; example_target: a target batch
    (default: normal noise shaped like the output).
    """

    layers: Sequence[Module]
    example_input: Tensor
    embedding: Module | None = None
    head: Module | None = None
    loss: Callable[[Tensor, Tensor], Tensor] | None = None
    example_target: Tensor | None = None


def is_factory_spec(text: str | None) -> bool:
    """A `--model` value naming a factory rather than pipesim's mlp or gpt."""
    return bool(text) and ":" in text


def load_factory(spec: str):
    """The callable `spec` names; PipesimError (one line) when the module, file or attribute is missing."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr or not attr.isidentifier():
        raise PipesimError(f"--model {spec}: expected {FORMS}")
    if target.endswith(".py") or os.sep in target:
        path = Path(target)
        if not path.is_file():
            raise PipesimError(f"--model {spec}: no such file {target}")
        name = f"pipesim_user_model_{abs(hash(str(path.resolve())))}"
        module = sys.modules.get(name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            try:
                loader_spec.loader.exec_module(module)
            except Exception as exc:  # noqa: BLE001 - the user's code: reported in one line
                del sys.modules[name]
                raise PipesimError(f"--model {spec}: importing {target} raised {type(exc).__name__}: {exc}") from None
    else:
        if os.getcwd() not in sys.path:  # as `python -m` would: the current directory first
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise PipesimError(f"--model {spec}: no module named {exc.name!r}") from None
        except Exception as exc:  # noqa: BLE001
            raise PipesimError(f"--model {spec}: importing {target} raised {type(exc).__name__}: {exc}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise PipesimError(f"--model {spec}: {target} has no attribute {attr!r}")
    if not callable(factory):
        raise PipesimError(f"--model {spec}: {attr} is a {type(factory).__name__}, not a function")
    return factory


def model_parts(result: object, spec: str) -> ModelParts:
    """A factory's result as ModelParts (from ModelParts or a dict); the types are checked by the caller."""
    if isinstance(result, ModelParts):
        return result
    if isinstance(result, dict):
        unknown = sorted(set(result) - set(ModelParts.__dataclass_fields__))
        if unknown or "layers" not in result or "example_input" not in result:
            raise PipesimError(f"--model {spec}: the factory's dict needs keys layers and example_input (optional: "
                               f"embedding, head, loss, example_target); got {', '.join(sorted(result))}")
        return ModelParts(**result)
    raise PipesimError(f"--model {spec}: the factory returned a {type(result).__name__}; expected "
                       "pipesim.cost.user_model_costs.ModelParts(layers=[...], example_input=tensor) or a dict "
                       "with those keys")


@dataclass(frozen=True)
class PieceCounts:
    """One piece (layer, embedding or head) on one microbatch: what the cost model needs."""

    flops: tuple[float, float, float]  # FLOPs of F, I, W
    moved: tuple[float, float, float]  # bytes of memory traffic in F, I, W (estimate, see counts_of)
    ops: tuple[float, float, float]  # framework (aten, non-view) ops in F, I, W
    activation_bytes: float  # bytes saved for backward (parameters excluded)
    param_count: int
    output_bytes: int  # bytes of the piece's output (the boundary when a stage ends here)
    split_measured: bool = True  # False: backward could not run on meta, I = W = F (the 1:1 rule)


@dataclass(frozen=True)
class UserModel:
    """A user's model, counted: its pieces in order, how many are layers, whether the first is an embedding."""

    spec: str
    pieces: tuple[PieceCounts, ...]
    layers: int
    has_embedding: bool
    dtype: str  # "float32" | "bfloat16" | "float16": the pieces' parameter dtype
    microbatch_rows: int

    def ranges(self, split: list[int]) -> list[range]:
        """Which pieces each stage holds (as executor.workload.PiecesWorkload.ranges)."""
        extra, out, start = int(self.has_embedding), [], 0
        for s, n in enumerate(split):
            lo = start + extra if s > 0 else 0
            hi = len(self.pieces) if s == len(split) - 1 else start + n + extra
            out.append(range(lo, hi))
            start += n
        return out

    def stage_sums(self, num_stages: int, layer_split: list[int] | None = None) -> list[dict]:
        """Per stage: summed flops, moved, ops (F, I, W), activation bytes, parameters, boundary bytes."""
        split = split_layers(self.layers, num_stages, layer_split)
        out = []
        for rng in self.ranges(split):
            ps = [self.pieces[i] for i in rng]
            out.append({
                "flops": tuple(sum(p.flops[k] for p in ps) for k in range(3)),
                "moved": tuple(sum(p.moved[k] for p in ps) for k in range(3)),
                "ops": tuple(sum(p.ops[k] for p in ps) for k in range(3)),
                "act": sum(p.activation_bytes for p in ps), "params": sum(p.param_count for p in ps),
                "boundary": self.pieces[rng.stop - 1].output_bytes if rng.stop else 0, "layers": split[len(out)],
            })
        return out

    def stage_work(self, num_stages: int) -> list[tuple[tuple, tuple, tuple]]:
        """((F, I, W) FLOPs, bytes, ops) per stage, as `pipesim.cost.stage_work.stage_work` gives them for
        pipesim's models: what the calibration fit (`calibration.measured.action_samples`) inverts."""
        return [(s["flops"], s["moved"], s["ops"]) for s in self.stage_sums(num_stages)]


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def user_model_costs(model: UserModel, num_stages: int, hw: Hardware, job: Job = DEFAULT_JOB, *,
                     layer_split: list[int] | None = None) -> ParallelCosts:
    """Per-stage seconds of the counted model on `hw` (the loop of `pipesim.cost.model_costs.model_costs`);
    of the job only its data parallelism applies (a user's module runs whole on each rank)."""
    dp = job.dims.dp
    stages, grads, counts = [], [], []
    d = DTYPE_BYTES[model.dtype]
    sums = model.stage_sums(num_stages, layer_split)
    for s, st in enumerate(sums):
        fwd, inp, wgt = (hw.compute_time(st["flops"][k], st["moved"][k], model.dtype, kind, st["ops"][k])
                         for k, kind in enumerate("FIW"))
        if s == 0:  # no gradient leaves the first stage: a split I has nothing to send, W runs the whole backward
            inp, wgt = 0.0, inp + wgt
        param_bytes = round(st["params"] * d)
        counts.append(round(st["params"]))
        last = s == num_stages - 1
        stages.append(StageCosts(forward=fwd, backward_input=inp, backward_weight=wgt,
                                 boundary_bytes=0 if last else st["boundary"], activation_bytes=round(st["act"]),
                                 param_bytes=param_bytes, flops_forward=st["flops"][0], weight_ops=st["ops"][2],
                                 backward_ops=st["ops"][1] + st["ops"][2]))
        grads.append(param_bytes if dp > 1 else 0)
    precision = "fp32" if model.dtype == "float32" else "mixed"
    step = None if hw.host is not None else step_costs(counts, job, hw=hw, precision=precision,
                                                       loss_scaling=model.dtype == "float16")
    return ParallelCosts(table=CostTable(tuple(stages)), job=job, tp_collectives={}, dp_grad_bytes=tuple(grads),
                         layers_per_stage=tuple(s["layers"] for s in sums), dtype_bytes=d,
                         param_counts=tuple(counts), precision=precision, step=step)


__all__ = ["FORMS", "ModelParts", "PieceCounts", "UserModel", "is_factory_spec", "load_factory", "model_parts",
           "user_model_costs"]
