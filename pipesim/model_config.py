"""The model both the cost model and the executor build: the lecture's deep MLP or a small GPT.

One config so that simulated and executed runs describe the same network.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pipesim.errors import PipesimError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the model; `layers` are split across stages (uneven splits allowed)."""

    kind: str = "mlp"  # "mlp" (the lecture's deep MLP) or "gpt" (embedding, blocks, head)
    hidden: int = 1024  # width of the MLP / d_model of the transformer
    layers: int = 8  # MLP layers or transformer blocks
    heads: int = 8  # attention heads (gpt only)
    seq: int = 128  # sequence length (gpt only)
    vocab: int = 1024  # vocabulary size (gpt only)
    batch: int = 64  # global batch per step (split into microbatches)
    dtype: str = "float32"  # parameter and activation dtype
    seed: int = 0  # parameters and synthetic data come from this seed

    def __post_init__(self) -> None:
        if self.kind not in ("mlp", "gpt"):
            raise PipesimError(f"unknown --model {self.kind!r}; choose mlp or gpt")
        for name in ("hidden", "layers", "heads", "seq", "vocab", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PipesimError(f"--{name} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPE_BYTES:
            raise PipesimError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
        if self.kind == "gpt" and self.hidden % self.heads:
            raise PipesimError(f"--hidden {self.hidden} must be divisible by --heads {self.heads}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def microbatch_size(self, microbatches: int) -> int:
        """Samples per microbatch; the batch must split evenly."""
        if self.batch % microbatches:
            raise PipesimError(f"--batch {self.batch} does not split into {microbatches} microbatches evenly")
        return self.batch // microbatches

    def to_dict(self) -> dict:
        return asdict(self)


def split_layers(layers: int, stages: int, weights: list[int] | None = None) -> list[int]:
    """Layers per stage: even split (earlier stages take the remainder), or explicit `weights`.

    `weights` (e.g. [3, 2, 2, 1]) must sum to `layers`.
    """
    if weights is not None:
        if len(weights) != stages or sum(weights) != layers or min(weights) < 1:
            raise PipesimError(
                f"layer split {weights} must have {stages} positive entries summing to {layers} layers"
            )
        return list(weights)
    if layers < stages:
        raise PipesimError(f"--layers {layers} is fewer than the {stages} stages; each stage needs a layer")
    base, extra = divmod(layers, stages)
    return [base + (1 if s < extra else 0) for s in range(stages)]
