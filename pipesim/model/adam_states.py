"""Megatron-core's precision-aware optimizer (`--use-precision-aware-optimizer`): Adam's moments and master weights in
fewer bytes than float32.

Megatron-core (NVIDIA/Megatron-LM core_v0.15.3) hands the dtypes to Transformer Engine's FusedAdam
(megatron/core/optimizer/__init__.py): `--exp-avg-dtype` and `--exp-avg-sq-dtype` (fp32, fp16, bf16 or fp8) are
the moments' bytes per parameter. The master weights are TE's (`master_weights=True`, `master_weight_dtype`) when
`--main-params-dtype` is fp16 or the model runs without FP8 or with delayed scaling
(optimizer_config.py `use_precision_aware_optimizer_no_fp8_or_ds_fp8`), and TE keeps of a float32 master only the
16 bits a bfloat16 parameter does not already hold (`store_param_remainders`, Megatron's default since TE 2.1): 2
bytes. Otherwise Megatron-core keeps them in float32: 4 bytes. Megatron asserts the distributed optimizer (ZeRO 1 or
2 here) and Adam; pipesim refuses the dtype flags without the optimizer flag, as they do nothing there. The MoE
ModelZoo's recipes (yanring/Megatron-MoE-ModelZoo: DeepSeek-V3, Qwen3) set bf16 moments.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError

STATE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}  # a moment's bytes per parameter, by its dtype
MOMENT_DTYPES = tuple(STATE_BYTES)
MASTER_DTYPES = ("fp32", "fp16")


@dataclass(frozen=True)
class AdamStates:
    """The precision-aware optimizer's dtypes (Megatron-core's flags of these names)."""

    main_params: str = "fp32"  # --main-params-dtype
    exp_avg: str = "fp32"  # --exp-avg-dtype
    exp_avg_sq: str = "fp32"  # --exp-avg-sq-dtype

    def __post_init__(self) -> None:
        if self.main_params not in MASTER_DTYPES:
            raise PipesimError(f"--main-params-dtype must be one of {', '.join(MASTER_DTYPES)}, got "
                               f"{self.main_params!r}")
        for flag, value in (("--exp-avg-dtype", self.exp_avg), ("--exp-avg-sq-dtype", self.exp_avg_sq)):
            if value not in MOMENT_DTYPES:
                raise PipesimError(f"{flag} must be one of {', '.join(MOMENT_DTYPES)}, got {value!r}")

    def master_bytes(self, *, dtype: str, fp8_recipe: str | None) -> int:
        """Bytes per parameter of the master weights (the module docstring's rule)."""
        if self.main_params == "fp16":
            return 2
        te_managed = fp8_recipe is None or fp8_recipe == "delayed"
        return 2 if te_managed and dtype == "bfloat16" else 4

    def tag(self, *, dtype: str, fp8_recipe: str | None) -> str:
        """The bytes of master, first and second moment, as pipesim.model.memory.precision reads them."""
        return (f"adam-{self.master_bytes(dtype=dtype, fp8_recipe=fp8_recipe)}-{STATE_BYTES[self.exp_avg]}-"
                f"{STATE_BYTES[self.exp_avg_sq]}")

    def flags(self) -> list[str]:
        out = ["--use-precision-aware-optimizer"]
        for flag, value in (("--main-params-dtype", self.main_params), ("--exp-avg-dtype", self.exp_avg),
                            ("--exp-avg-sq-dtype", self.exp_avg_sq)):
            out += [flag, value] if value != "fp32" else []
        return out


def check_adam_states(states: AdamStates | None, *, zero: int) -> None:
    """One line unless the precision-aware optimizer can run: the distributed optimizer (the model's 16 bits are
    pipesim.job.Job.check_gradients')."""
    if states is not None and zero not in (1, 2):
        raise PipesimError(f"--use-precision-aware-optimizer needs the distributed optimizer (--zero 1 or 2), got "
                           f"--zero {zero} (Megatron-core's optimizer_config.py asserts it)")


__all__ = ["MASTER_DTYPES", "MOMENT_DTYPES", "STATE_BYTES", "AdamStates", "check_adam_states"]
