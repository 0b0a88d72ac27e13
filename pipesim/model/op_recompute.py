"""torchtitan's per-op selective activation checkpointing (`--recompute op`; torchtitan's
`--activation-checkpoint.mode selective --activation-checkpoint.selective-ac-option op`).

Each transformer block runs under a checkpoint whose policy saves the outputs of the ops in `_save_list` (aten.mm,
the SDPA kernels, reduce_scatter, max) except every second mm, and recomputes everything else in the backward
(torchtitan/models/llama3/parallelize_llama.py @ e7c0cae and 9dec370, `_apply_ac_to_transformer_block`; the mm count
restarts for each block's checkpoint). A Llama block's mms run wq, wk, wv, wo, w1, w3, w2 (`w2(silu(w1(x)) *
w3(x))`): wq, wv, w1 and w2 are saved, wk, wo and w3 re-run, with every norm, RoPE, the SwiGLU product and the
residual adds. The checkpoint keeps the block's input.

Under FP8 (torchao's float8 linears, `--fp8-format` with torchtitan) the policy sees the same mms: torchao's
`matmul_with_hp_or_float8_args` (torchao/float8/float8_linear.py) calls `torch.mm` on its float8 tensor subclass,
and the checkpoint's dispatch mode runs before the subclass turns the call into `_scaled_mm`. So the same outputs
are saved (in the dtype: the mm writes it), and wk, wo and w3 re-run as float8 GEMMs with their inputs' casts
(pipesim.model.fp8_kernels); the amax results the list also saves (`aten.max`, one scalar per cast) are not counted.

Modelled for what these rules pin down: a dense SwiGLU block with a fused attention kernel on one tp and cp rank.
Elsewhere the policy also replays collectives (tensor and context parallelism's all-gathers are not saved); those
are refused.
"""

from __future__ import annotations

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig

OP = "op"
STAT_BYTES = 4  # the SDPA kernel's logsumexp per (token, head), float32


def check_op_recompute(model: ModelConfig, *, tp: int, cp: int, attention: str) -> None:
    """One line unless `--recompute op` is modelled for this layer (the module docstring says why)."""
    unmodelled = ((model.moe is not None, "a mixture-of-experts layer"),
                  (model.mla is not None, "latent attention"),
                  (model.activation != "swiglu", f"a {model.activation} MLP (torchtitan's blocks are SwiGLU)"),
                  (attention == "eager", "--attention eager (the policy saves the fused SDPA kernels' outputs)"),
                  (tp > 1, f"--tp {tp} (the policy replays the tensor-parallel collectives)"),
                  (cp > 1, f"--cp {cp} (the policy replays the K/V exchanges)"))
    for refused, why in unmodelled:
        if refused:
            raise PipesimError(f"--recompute op (torchtitan's per-op checkpointing) is not modelled with {why}")


def op_saved(model: ModelConfig, tokens: int) -> list[tuple[str, int]]:
    """(name, bytes) of what the policy keeps of one block for `tokens` tokens: its input, wq's, wv's, w1's and w2's
    outputs, and the SDPA kernel's output and logsumexp."""
    d, h, f = model.dtype_bytes, model.hidden, model.ffn_size
    hq, hkv = model.attention_width, model.kv_width
    return [("layer input", d * tokens * h), ("Q (wq output)", d * tokens * hq), ("V (wv output)", d * tokens * hkv),
            ("attention output (SDPA)", d * tokens * hq), ("attention logsumexp", STAT_BYTES * tokens * model.heads),
            ("gate (w1 output)", d * tokens * f), ("MLP output (w2 output)", d * tokens * h)]


def op_rerun_linears(model: ModelConfig, tokens: int) -> list[tuple[str, int, int, int]]:
    """The linears the backward re-runs, as pipesim.model.kernel_types' Linear (name, in, out, tokens): wk, wo, w3."""
    h, f = model.hidden, model.ffn_size
    return [("K (recompute)", h, model.kv_width, tokens), ("projection (recompute)", model.attention_width, h, tokens),
            ("FC1 up half (recompute)", h, f, tokens)]


def op_rerun_flops(model: ModelConfig, tokens: int) -> int:
    """FLOPs of those re-run linears: 2 x tokens x in x out each."""
    return sum(2 * n * i * o for _, i, o, n in op_rerun_linears(model, tokens))


__all__ = ["OP", "check_op_recompute", "op_rerun_flops", "op_rerun_linears", "op_saved"]
