"""Megatron-core's --first-last-layers-bf16: FP8 (or NVFP4) training with the model's first and last layers in bf16.

Megatron-core enters Transformer Engine's FP8 autocast per layer (megatron/core/fp8_utils.py @ d98e8a64
`get_fp8_context(config, layer_no)`): a layer whose *global* index is below --num-layers-at-start-in-bf16 or at or
above num_layers - --num-layers-at-end-in-bf16 (`is_first_last_bf16_layer`, both 1 by default) gets no autocast, and
under --fp8-param-gather no `fp8_model_init` either. So such a layer runs its linears' GEMMs in bf16 with no casts,
saves its inputs in bf16, keeps no FP8 weight copies, and its parameters stay bf16 (gathered in bf16). The
multi-token-prediction modules take the global FP8 context (multi_token_prediction.py: 'MTP only use global fp8
context'), and the head is bf16 either way. Megatron-core's checks, kept here with its messages' sense
(transformer_config.py): not under delayed scaling ('Delayed scaling does not support first / last layer in BF16'),
and each count at most num_layers // pipeline size. The NVFP4 path reads the same switches (fp4_utils.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.fp8 import Fp8Options
from pipesim.model.layer_kinds import StageLayers

FIRST_LAST_FLAG = "--first-last-layers-bf16"  # Megatron-core's flags (and pipesim's)
START_FLAG = "--num-layers-at-start-in-bf16"
END_FLAG = "--num-layers-at-end-in-bf16"


@dataclass(frozen=True)
class Bf16Layers:
    """How many of the model's first and last layers train in bf16 under an FP8 recipe (Megatron-core's defaults)."""

    start: int = 1  # --num-layers-at-start-in-bf16
    end: int = 1  # --num-layers-at-end-in-bf16

    def __post_init__(self) -> None:
        for flag, value in ((START_FLAG, self.start), (END_FLAG, self.end)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise PipesimError(f"{flag} must be a non-negative integer, got {value!r}")

    def check_recipe(self, fp8: Fp8Options | None) -> None:
        """PipesimError unless the job's linears train in FP8 through Transformer Engine, by a recipe that allows it."""
        if fp8 is None:
            raise PipesimError(f"{FIRST_LAST_FLAG} keeps an FP8 run's first and last layers in bf16: it needs "
                               "--fp8-format (or --fp4-format)")
        if fp8.recipe == "delayed":  # transformer_config.py raises the same
            raise PipesimError(f"{FIRST_LAST_FLAG} does not go with --fp8-recipe delayed, Megatron-core's default "
                               "(Megatron-core: 'Delayed scaling does not support first / last layer in BF16'): give "
                               "another --fp8-recipe")
        if fp8.impl != "te":
            raise PipesimError(f"{FIRST_LAST_FLAG} is Megatron-core's per-layer FP8 autocast: not with --fp8-impl "
                               f"{fp8.impl} (torchtitan's float8 converter keeps layers out of FP8 by its filter_fqns)")

    def check(self, model: ModelConfig, pp: int) -> None:
        """PipesimError unless `model` is a transformer and each count is at most its layers per pipeline rank
        (Megatron-core's bound: num_layers // pipeline_model_parallel_size)."""
        if model.kind != "gpt":
            raise PipesimError(f"{FIRST_LAST_FLAG} needs a transformer (--model gpt or --model-config), "
                               "not --model mlp")
        most = model.layers // pp
        for flag, value in ((START_FLAG, self.start), (END_FLAG, self.end)):
            if value > most:
                raise PipesimError(f"{flag} {value} is more than the {most} layers per pipeline rank "
                                   f"({model.layers} layers over {pp} ranks; Megatron-core's bound)")

    def is_bf16(self, layer: int, layers: int) -> bool:
        """Whether the layer of global index `layer` (of `layers`) runs in bf16 (`is_first_last_bf16_layer`)."""
        return layer < self.start or layer >= layers - self.end

    def indices(self, layers: int) -> tuple[int, ...]:
        """The global indices of the bf16 layers of a model of `layers` layers, in order."""
        return tuple(k for k in range(layers) if self.is_bf16(k, layers))

    def in_chunk(self, model: ModelConfig, first: int, n: int) -> StageLayers:
        """The bf16 layers among the `n` layers from global index `first` (a chunk's), by kind."""
        return StageLayers.at(model, (k for k in self.indices(model.layers) if first <= k < first + n))

    def flags(self) -> list[str]:
        """The command-line flags that give these counts: Megatron-core's, its defaults left out."""
        return [FIRST_LAST_FLAG] + [f for flag, value in ((START_FLAG, self.start), (END_FLAG, self.end))
                                    if value != 1 for f in (flag, str(value))]

    def report(self) -> dict[str, object]:
        """The options as --json reports them, in the flags' own words."""
        return {"first_last_layers_bf16": True, "num_layers_at_start_in_bf16": self.start,
                "num_layers_at_end_in_bf16": self.end}


__all__ = ["END_FLAG", "FIRST_LAST_FLAG", "START_FLAG", "Bf16Layers"]
