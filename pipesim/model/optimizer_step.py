"""The mixed-precision optimizer step as the passes Megatron-LM makes over HBM: bytes per parameter of each.

Megatron-LM's mixed-precision optimizer (megatron/optimizer/optimizer.py: Float16OptimizerWithFloat16Params.step,
MixedPrecisionOptimizer.step in later versions) does not run Adam alone. It copies the model's 16-bit gradients
into float32 main gradients ("optimizer-copy-to-main-grad"; a no-op alias when they are float32 already),
unscales them and checks for inf/nan under fp16's loss scaling ("optimizer-unscale-and-check-inf"; bf16 has no
grad scaler), takes their norm for clipping (clip_grad_norm_fp32, --clip-grad defaults to 1.0; the rescale pass
after it runs only when the norm exceeds the threshold, a property of the data: not counted), steps apex's
FusedAdam over the float32 main parameters, and copies them back into the 16-bit model parameters
("optimizer-copy-main-to-model-params"). The next step begins by zeroing the gradient buffer (train_step's
zero_grad_buffer). Each is a multi-tensor kernel streaming its tensors through HBM once.

float32 training has no main copy: one Adam pass over the parameters (`optimizer_step_bytes`' 16 + 12 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.model.memory import Precision, check_zero

FP32 = 4  # bytes of a float32 main gradient / main parameter / moment


@dataclass(frozen=True)
class OptimizerPass:
    """One pass of the step: bytes it reads and writes per parameter, over the parameters the rank updates
    (`owned`: its ceil(P / dp) shard under ZeRO 1-3) or over the gradient buffer it holds (the zeroing)."""

    name: str
    read: int  # bytes per parameter
    write: int  # bytes per parameter
    owned: bool = True

    @property
    def bytes_per_param(self) -> int:
        return self.read + self.write


def optimizer_passes(precision: Precision, *, loss_scaling: bool, clip_grad: bool = True) -> tuple[
        OptimizerPass, ...]:
    """The step's passes for `precision` (pipesim.model.memory.PRECISIONS); `loss_scaling`: fp16's grad scaler."""
    moments = precision.optimizer_bytes - precision.master_bytes  # Adam's m and v
    if not precision.master_bytes:  # the parameters are the master copy: Adam reads p, g, m, v and writes p, m, v
        return (OptimizerPass("Adam", precision.param_bytes + precision.grad_bytes + moments,
                              precision.param_bytes + moments),)
    passes = []
    if precision.grad_bytes < FP32:
        passes.append(OptimizerPass("copy gradients to main gradients", precision.grad_bytes, FP32))
    if loss_scaling:
        passes.append(OptimizerPass("unscale and check for inf/nan", FP32, FP32))
    if clip_grad:
        passes.append(OptimizerPass("gradient norm", FP32, 0))
    passes.append(OptimizerPass("Adam", precision.optimizer_bytes + FP32, precision.optimizer_bytes))
    passes.append(OptimizerPass("copy main parameters to model parameters", precision.master_bytes,
                                precision.param_bytes))
    passes.append(OptimizerPass("zero the gradient buffer", 0, precision.grad_bytes, owned=False))
    return tuple(passes)


def pass_bytes(passes: tuple[OptimizerPass, ...], params: int, *, dp: int, zero: int) -> tuple[int, ...]:
    """HBM bytes of each pass on a rank holding `params` parameters: the owned ones are all of them under ZeRO 0,
    ceil(P / dp) under ZeRO 1-3; the gradient buffer is sharded from ZeRO 2 on."""
    check_zero(zero, dp)
    shard = -(-params // dp)
    owned = params if zero == 0 else shard
    held = params if zero < 2 else shard
    return tuple((owned if p.owned else held) * p.bytes_per_param for p in passes)


__all__ = ["OptimizerPass", "optimizer_passes", "pass_bytes"]
