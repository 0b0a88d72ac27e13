"""The executor tests' model flags and `--then` chains, and the comparison of a saved run with the reference
(the runs themselves: tests/launch_shared.py, one torchrun launch per world size)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from executor.reference import train_reference
from pipesim.model.config import ModelConfig

TINY_MLP = ["--model", "mlp", "--hidden", "16", "--layers", "4", "--batch", "8"]
TINY_GPT = ["--model", "gpt", "--hidden", "16", "--heads", "2", "--seq", "8", "--vocab", "32", "--layers", "4",
            "--batch", "8"]


def chain(*runs: list[str]) -> list[str]:
    """Several configurations for one launch (`A --then B --then C`): torchrun's start-up is paid once."""
    argv = list(runs[0])
    for run in runs[1:]:
        argv += ["--then", *run]
    return argv


def model_of(args: list[str]) -> ModelConfig:
    """The ModelConfig the executor builds from these flags."""
    flags = dict(zip(args[0::2], args[1::2], strict=False))
    kw = {k: int(flags[f"--{k}"]) for k in ("hidden", "layers", "heads", "seq", "vocab", "batch")
          if f"--{k}" in flags}
    return ModelConfig(kind=flags.get("--model", "mlp"), **kw)


def load_run(save_dir: Path, name: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and full-model parameters of one run; replicas (DP) must agree exactly."""
    result = json.loads((save_dir / name / "result.json").read_text())
    params: dict[str, torch.Tensor] = {}
    for path in sorted((save_dir / name).glob("rank*.pt")):
        for key, value in torch.load(path).items():
            if key in params:
                torch.testing.assert_close(value, params[key], rtol=0, atol=0, msg=f"replicas differ on {key}")
            params[key] = value
    return result["losses"], params


@functools.cache
def _reference(model: ModelConfig, steps: int, optimizer: str, lr: float, balance_sequences: int | None,
               capacity_parts: int):
    # one per model, however many schedules
    return train_reference(model, steps, optimizer=optimizer, lr=lr, balance_sequences=balance_sequences,
                           capacity_parts=capacity_parts)


def assert_matches_reference(save_dir: Path, name: str, model: ModelConfig, steps: int, *, optimizer: str = "sgd",
                             lr: float = 0.01, balance_sequences: int | None = None, capacity_parts: int = 1) -> None:
    """`balance_sequences`: a load-balancing (aux_loss) group's sequences, the run's microbatch per replica;
    `capacity_parts`: the run's tp with sequence parallelism, whose ranks count an expert's capacity apart."""
    losses, params = load_run(save_dir, name)
    ref = _reference(model, steps, optimizer, lr, balance_sequences, capacity_parts)
    assert len(losses) == steps
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref.losses), rtol=1e-5, atol=1e-6,
                               msg=lambda m: f"{name}: losses differ\n{m}")
    assert params.keys() == ref.params.keys(), f"{name}: parameter sets differ"
    for key, value in ref.params.items():
        torch.testing.assert_close(params[key], value, rtol=1e-5, atol=1e-6, msg=lambda m, k=key: f"{name} {k}: {m}")


class OpCount(TorchDispatchMode):
    """Non-view aten ops, the count of the simulator's framework ops (GPT_BLOCK_OPS: a dense block's F is 10)."""

    VIEWS = {"view", "_unsafe_view", "t", "transpose", "expand", "split", "split_with_sizes", "slice", "select",
             "unsqueeze", "squeeze", "permute", "detach", "alias", "as_strided", "unbind"}

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += func.overloadpacket.__name__ not in self.VIEWS
        return func(*args, **(kwargs or {}))
