"""The transformer layers bench/gpu_layers.py times on one GPU: the per-rank layer of published configurations.

Each is one tensor-parallel rank's layer (the shapes pipesim.model.layer_kernels gives for tp t), without the TP
collectives, so one GPU runs it. The GPT rows are Narayanan et al. 2021 Table 1 and Korthikanti et al. 2022 (their
microbatch sizes, eager attention); the Llama rows are Llama 3 70B and 405B at tp 8 with flash attention
(Dubey et al. 2024, Table 3's shapes). No torch here: bench/gpu_layers_compare.py reads these on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.model.config import ModelConfig
from pipesim.model.kernel_types import PieceKernels
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.options import LayerOptions

DTYPE = "bfloat16"  # the papers' A100 runs were fp16; on a Hopper GPU fp16 and bf16 have one tensor-core rate


@dataclass(frozen=True)
class LayerCase:
    """One rank's layer: the model, the microbatch size b and the layer options."""

    label: str
    model: ModelConfig
    b: int  # microbatch size
    opts: LayerOptions
    eager_layer: bool  # bench/gpu_layers.py also runs it as a real torch layer (GPT blocks only)

    def kernels(self, fused: bool) -> PieceKernels:
        return layer_kernels(self.model, self.b, self.opts, fused=fused)


def _gpt(label: str, hidden: int, heads: int, b: int, tp: int) -> LayerCase:
    model = ModelConfig(kind="gpt", hidden=hidden, layers=1, heads=heads, seq=2048, vocab=51200, batch=b, dtype=DTYPE)
    return LayerCase(label, model, b, LayerOptions(tp=tp, attention="eager"), True)


def _llama(label: str, hidden: int, heads: int, ffn: int) -> LayerCase:
    model = ModelConfig(kind="gpt", hidden=hidden, layers=1, heads=heads, seq=8192, vocab=128256, batch=1,
                        dtype=DTYPE, kv_heads=8, ffn_hidden=ffn, activation="swiglu", norm="rmsnorm", dropout=False,
                        biases=False, positions="rope")
    return LayerCase(label, model, 1, LayerOptions(tp=8, attention="flash"), False)


CASES: tuple[LayerCase, ...] = (
    _gpt("NAR21 1.7B (tp 1, b 16)", 2304, 24, 16, 1),
    _gpt("NAR21 3.6B (tp 2, b 16)", 3072, 32, 16, 2),
    _gpt("NAR21 7.5B (tp 4, b 16)", 4096, 32, 16, 4),
    _gpt("NAR21 18.4B (tp 8, b 8)", 6144, 48, 8, 8),
    _gpt("KOR22 22B (tp 8, b 4)", 6144, 64, 4, 8),
    _gpt("NAR21 39.1B (tp 8, b 4)", 8192, 64, 4, 8),
    _gpt("NAR21 76.1B (tp 8, b 2)", 10240, 80, 2, 8),
    _gpt("NAR21 145.6B (tp 8, b 2)", 12288, 96, 2, 8),
    _gpt("KOR22 175B (tp 8, b 1)", 12288, 96, 1, 8),
    _gpt("NAR21 310.1B (tp 8, b 1)", 16384, 128, 1, 8),
    _gpt("NAR21 529.6B (tp 8, b 1)", 20480, 128, 1, 8),
    _gpt("NAR21 1008B (tp 8, b 1)", 25600, 160, 1, 8),
    _llama("Llama 3 70B (tp 8, b 1)", 8192, 64, 28672),
    _llama("Llama 3 405B (tp 8, b 1)", 16384, 128, 53248),
)

TINY_CASES: tuple[LayerCase, ...] = (  # the same code paths on a CPU (tests/test_gpu_layers.py)
    LayerCase("tiny GPT", ModelConfig(kind="gpt", hidden=64, layers=1, heads=4, seq=32, vocab=128, batch=2), 2,
              LayerOptions(tp=2, attention="eager"), True),
    LayerCase("tiny Llama", ModelConfig(kind="gpt", hidden=64, layers=1, heads=4, seq=32, vocab=128, batch=1,
                                        kv_heads=2, ffn_hidden=96, activation="swiglu", norm="rmsnorm",
                                        dropout=False, biases=False, positions="rope"), 1,
              LayerOptions(tp=2, attention="flash"), False),
)


def timed_as_backward(kernel: str, family: str) -> bool:
    """Whether bench/gpu_memory_kernels.py times a memory-bound kernel as its op's backward: a kernel named
    "... backward", except an add's (the residual gradients' sum is an add, timed forward)."""
    return kernel.endswith(" backward") and family != "add"


__all__ = ["CASES", "DTYPE", "TINY_CASES", "LayerCase", "timed_as_backward"]
