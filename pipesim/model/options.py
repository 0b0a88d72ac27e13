"""How a transformer layer is run: tensor/sequence/context parallelism, recomputation, attention kernel.

The per-layer cost functions (parameters, activations, FLOPs, collectives) all take one of these,
so a flag on the command line changes every number that depends on it, and the checks that make
the sizes divide live in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.cuda_graphs import CudaGraphs
from pipesim.model.fp8 import Fp8Options
from pipesim.model.gdn_mixer import check_gdn_split
from pipesim.model.layer_parts import BLOCK, MAMBA, check_part
from pipesim.model.linear_attention import GDN, check_mixer
from pipesim.model.mamba_mixer import check_mamba_split
from pipesim.model.moe import MOE_DISPATCHERS
from pipesim.model.op_recompute import OP, check_op_recompute
from pipesim.model.recompute_modules import canonical_modules, check_modules, effective_modules

# Megatron's --recompute-granularity (none: keep everything), and torchtitan's per-op checkpointing
# (pipesim.model.op_recompute)
RECOMPUTE = ("none", "selective", "full", "op")
# materialised s x s scores, or a fused kernel keeping only softmax statistics: "flash" the device's fastest
# (cuDNN or FlashAttention-3 on Hopper, FlashAttention-2 on Ampere), "flash2" FlashAttention-2 itself (PyTorch
# SDPA's flash backend): the same FLOPs and memory, timed on the family's FlashAttention-2 figures
ATTENTION = ("eager", "flash", "flash2")
FUSED_ATTENTION = ("flash", "flash2")
# Megatron-core's --cp-comm-type: p2p, ring attention (K/V blocks passed round, each hop under the attention of the
# block held); all_gather, K/V gathered whole before the attention and dK/dV reduce-scattered after it; a2a,
# DeepSpeed-Ulysses' all-to-alls from sequence shards to head shards around a full-sequence attention
CP_COMM_TYPES = ("p2p", "all_gather", "a2a")
TRANSFORMER_IMPLS = ("local", "transformer_engine")  # Megatron-core's --transformer-impl (its inference one aside)


@dataclass(frozen=True)
class LayerOptions:
    """Parallelism and memory-saving choices of one transformer layer (validated on construction)."""

    tp: int = 1  # tensor-parallel ranks (Megatron: heads, MLP columns and the vocabulary split tp ways)
    sp: bool = False  # sequence parallelism: norm/dropout activations split over tp too (Korthikanti 2022)
    cp: int = 1  # context-parallel ranks: each holds seq / cp tokens; ring attention passes K/V around
    recompute: str = "none"  # "none", "selective" (attention core) or "full" (keep the layer input only)
    attention: str = "eager"  # "eager", "flash" or "flash2" (ATTENTION)
    ep: int = 1  # expert-parallel ranks: a MoE layer's experts sharded ep ways (Megatron-core's EP)
    etp: int = 1  # tensor parallelism inside each expert (Megatron-core's expert TP; a dense model ignores it)
    fp8: Fp8Options | None = None  # FP8 linears through Transformer Engine (pipesim.model.fp8); None: the dtype's
    # with "selective": Megatron-core's --recompute-modules (pipesim.model.recompute_modules); () is its default,
    # core_attn alone (kept canonical: Megatron's order, the default as ())
    recompute_modules: tuple[str, ...] = ()
    # a MoE layer's token dispatcher (pipesim.model.moe.MOE_DISPATCHERS): "alltoall" sorts the received tokens
    # by local expert and back (Megatron-core's permutation 2), "deepep" receives them in its own layout
    moe_dispatcher: str = "alltoall"
    cp_comm: str = "p2p"  # how context parallelism moves K/V (CP_COMM_TYPES)
    eager_rmsnorm: bool = False  # RMSNorm as eager PyTorch's ops (pipesim.model.eager_norm), not one fused kernel
    # tensor parallelism as torch DTensor's styles (torchtitan): under sp each block's gathered input is what its
    # column-parallel matmuls save (no re-gather in backward), and tensorwise FP8 gathers it in FP8
    dtensor_tp: bool = False
    # a MoE layer's CUDA graphs (Megatron-core's --cuda-graph-impl / --cuda-graph-scope): fewer host launches
    # (pipesim.model.host_ops); None: eager
    cuda_graphs: CudaGraphs | None = None
    # Megatron-core's --activation-func-fp8-input-store: the fused SwiGLU saves its input for the backward as FP8
    # (pipesim.model.activations, pipesim.model.layer_kernels)
    act_fp8_store: bool = False
    # the sliding window of the layer being costed (the model's window_size on its windowed layers, which the stage's
    # costs pick: pipesim.model.attention_window); None: full attention
    window: int | None = None
    # the layer being costed is one of the model's NoPE layers (ModelConfig.nope_every): no RoPE kernel
    nope: bool = False
    # Transformer Engine's linears (--transformer-impl transformer_engine): a biased QKV's bias in its GEMM's epilogue
    # and its gradient in the weight-gradient GEMM, not kernels of their own (pipesim.model.layer_kernels)
    te_linear: bool = False
    # the part of a layer being costed (pipesim.model.layer_parts): "block" a transformer layer, or one of a hybrid
    # model's sublayers, "attention", "mlp" (dense or the experts) or "mamba" (pipesim.model.layer_kinds picks it)
    part: str = BLOCK
    # what the layer attends with (pipesim.model.linear_attention): "attention" (softmax), or "gdn", a linear-attention
    # layer's Gated DeltaNet mixer (Qwen3-Next, Qwen3.5; pipesim.model.layer_kinds picks it)
    mixer: str = "attention"

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "ep", "etp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PipesimError(f"{name} must be a positive integer, got {value!r}")
        check_choices(self.sp, self.recompute, self.attention)
        if self.fp8 is not None and not isinstance(self.fp8, Fp8Options):
            raise PipesimError(f"fp8 must be Fp8Options or None, got {type(self.fp8).__name__}")
        if self.cuda_graphs is not None and not isinstance(self.cuda_graphs, CudaGraphs):
            raise PipesimError(f"cuda_graphs must be CudaGraphs or None, got {type(self.cuda_graphs).__name__}")
        object.__setattr__(self, "recompute_modules", canonical_modules(self.recompute, self.recompute_modules))
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise PipesimError(f"unknown MoE token dispatcher {self.moe_dispatcher!r}; choose "
                               f"{' or '.join(MOE_DISPATCHERS)}")
        discarded = [m for m in ("moe_act", "layernorm") if m in self.recompute_modules]
        if discarded and self.fp8 is not None and self.fp8.recipe == "delayed":  # transformer_config.py raises too
            raise PipesimError(f"--recompute-modules {discarded[0]} with FP8: delayed scaling does not support "
                               "moe_act and layernorm recompute (Megatron-core)")
        check_cp_comm(self.cp_comm)
        check_part(self.part)
        check_mixer(self.mixer)
        if self.mixer == GDN and self.part != BLOCK:
            raise PipesimError("a Gated DeltaNet layer is costed whole (part block), not by sublayer")
        if self.window is not None and (not isinstance(self.window, int) or isinstance(self.window, bool)
                                        or self.window < 1):
            raise PipesimError(f"window must be a positive integer or None, got {self.window!r}")
        if self.cp > 1 and not self.fused_attention:
            raise PipesimError(f"--cp {self.cp} needs --attention flash (ring attention runs the fused kernel)")

    @property
    def fused_attention(self) -> bool:
        """A flash kernel (either implementation): no s x s scores stored, the backward re-computes them."""
        return self.attention in FUSED_ATTENTION

    @property
    def modules(self) -> tuple[str, ...]:
        """The submodules selective recomputation re-runs (core_attn by default); () unless --recompute selective."""
        return effective_modules(self.recompute, self.recompute_modules)

    def recomputes(self, module: str) -> bool:
        """Whether selective recomputation re-runs Megatron-core's `module` (pipesim.model.recompute_modules)."""
        return module in self.modules

    def check(self, model: ModelConfig) -> None:
        """PipesimError (one line, with the numbers) unless `model` splits evenly under these options."""
        if model.kind != "gpt":
            raise PipesimError(f"transformer layer costs need --model gpt, got {model.kind!r}")
        check_tp_split(model, self.tp)
        check_modules(model, self.modules)
        if self.recompute == OP:
            check_op_recompute(model, tp=self.tp, cp=self.cp, attention=self.attention)
        if self.act_fp8_store:
            check_act_fp8_store(model, self.recompute)
        t = self.tp
        if self.window is not None and self.window != model.window_size:
            raise PipesimError(f"a layer's window {self.window} is not the model's sliding window "
                               f"({model.window_size})")
        if self.nope and not model.nope_every:
            raise PipesimError("a NoPE layer's options for a model without NoPE layers (nope_every)")
        self._check_sequence_mixer(model)
        if model.window_size is not None and self.cp > 1:  # no windowed ring attention is modelled
            raise PipesimError(f"--cp {self.cp} with sliding-window attention (a window of {model.window_size} keys) "
                               "is not modelled: give --cp 1")
        if self.cp > 1 and model.seq % (2 * self.cp):
            raise PipesimError(f"--seq {model.seq} is not divisible by 2 x cp({self.cp}) "
                               "(ring attention's load-balanced causal split)")
        if self.cp > 1 and self.cp_comm == "a2a":  # Transformer Engine splits both head counts over cp
            heads, kv = model.heads // t, (model.heads if model.mla is not None else model.num_kv_heads) // t
            if heads % self.cp or kv % self.cp:
                raise PipesimError(f"--cp-comm-type a2a splits each rank's attention heads over cp: {heads} query and "
                                   f"{kv} key/value heads per tp rank are not divisible by cp({self.cp})")
        if self.sp and (model.seq // self.cp) % t:
            raise PipesimError(f"--seq {model.seq} / cp({self.cp}) is not divisible by tp({t}) "
                               "(sequence parallelism splits the sequence over tp)")
        if model.moe is None:
            if self.ep > 1:
                raise PipesimError(f"--ep {self.ep} needs a mixture-of-experts model")
            return
        moe = model.moe
        if moe.experts % self.ep:
            raise PipesimError(f"--ep {self.ep} does not divide the {moe.experts} experts")
        if moe.expert_ffn % self.etp:
            raise PipesimError(f"--etp {self.etp} does not divide the expert width {moe.expert_ffn}")
        if t > 1 and self.ep > 1 and not self.sp:  # megatron/training/arguments.py asserts the same
            raise PipesimError(f"expert parallelism with tp({t}) needs --sequence-parallel (as Megatron-LM)")
        if self.etp not in (1, t):
            raise PipesimError(f"--etp {self.etp}: pipesim models expert tensor parallelism of 1 or --tp ({t})")
        if t > 1 and not self.sp and self.etp != t:
            raise PipesimError(f"--etp {self.etp} with tp({t}) and no sequence parallelism: the tp ranks hold the "
                               "same tokens, so the experts split as the MLP does (--etp equal to --tp)")

    def _check_sequence_mixer(self, model: ModelConfig) -> None:
        """A model with Mamba layers (a hybrid model's) or Gated DeltaNet layers (linear attention): its mixers split
        over tp as Megatron-core splits them; neither context parallelism (Megatron-core's context-parallel
        all-to-alls around the mixers) nor torchtitan's per-op recomputation modelled there. A Mamba part or a Gated
        DeltaNet mixer asked of a model without them: refused."""
        if self.part == MAMBA and model.hybrid is None:
            raise PipesimError("a Mamba layer's options for a model without Mamba layers (hybrid)")
        if self.mixer == GDN and model.linear_attention is None:
            raise PipesimError("a Gated DeltaNet layer's options for a model without linear attention")
        if model.hybrid is not None:
            check_mamba_split(model.hybrid.mamba, self.tp)
            what = "Mamba layers (a hybrid model)"
        elif model.linear_attention is not None:
            check_gdn_split(model.linear_attention.mixer, self.tp)
            what = "linear attention (Gated DeltaNet)"
        else:
            return
        if self.cp > 1:
            raise PipesimError(f"--cp {self.cp} with {what} is not modelled: give --cp 1")
        if self.recompute == OP:
            raise PipesimError(f"--recompute op (torchtitan's per-op checkpointing) with {what} is not modelled")

    def local_seq(self, model: ModelConfig) -> int:
        """Tokens of one sequence on this rank: seq / cp."""
        return model.seq // self.cp

    def seq_sharded(self, value: int) -> int:
        """A tensor's size where sequence parallelism splits it over tp (norms, dropout, residual)."""
        return value // self.tp if self.sp else value


ACT_FP8_STORE_FLAG = "--activation-func-fp8-input-store"  # Megatron-core's flag (and pipesim's)


def check_act_fp8_store(model: ModelConfig, recompute: str, *, fused: bool = True) -> None:
    """PipesimError unless --activation-func-fp8-input-store suits the layer: a transformer's SwiGLU MLP (Megatron-
    core's transformer_config.py: 'Storing activation input in FP8 is supported only for SwiGLU') run by the fused
    bias-SwiGLU (mlp.py stores in FP8 there only: not `fused` is --no-kernel-fusion) under Megatron's recomputation,
    not torchtitan's per-op policy."""
    if model.kind != "gpt":
        raise PipesimError(f"{ACT_FP8_STORE_FLAG} needs a transformer (--model gpt or --model-config), "
                           "not --model mlp")
    if not fused:
        raise PipesimError(f"{ACT_FP8_STORE_FLAG} is Megatron-core's fused SwiGLU (bias_activation_fusion): "
                           "not with --no-kernel-fusion")
    if model.activation != "swiglu":
        raise PipesimError(f"{ACT_FP8_STORE_FLAG} stores SwiGLU's input: the model's MLP runs "
                           f"{model.activation} (Megatron-core supports it only for SwiGLU)")
    if recompute == OP:
        raise PipesimError(f"{ACT_FP8_STORE_FLAG} is Megatron-core's fused SwiGLU: not with --recompute "
                           "op (torchtitan's per-op checkpointing)")


def check_choices(sp: bool, recompute: str, attention: str) -> None:
    """PipesimError unless sp is a bool and recompute and attention are known names (LayerOptions' and the Job's
    one spelling of these messages)."""
    if not isinstance(sp, bool):
        raise PipesimError(f"sequence parallelism must be true or false, got {sp!r}")
    if recompute not in RECOMPUTE:
        raise PipesimError(f"unknown --recompute {recompute!r}; choose {', '.join(RECOMPUTE)}")
    if attention not in ATTENTION:
        raise PipesimError(f"unknown --attention {attention!r}; choose {', '.join(ATTENTION)}")


def check_cp_comm(cp_comm: str) -> None:
    """PipesimError unless `cp_comm` is a known --cp-comm-type (LayerOptions' and the Job's one message)."""
    if cp_comm not in CP_COMM_TYPES:
        raise PipesimError(f"unknown --cp-comm-type {cp_comm!r}; choose {', '.join(CP_COMM_TYPES)}")


def check_tp_split(model: ModelConfig, tp: int) -> None:
    """PipesimError unless tp divides what Megatron splits over it: the hidden size, and a transformer's heads,
    kv heads and MLP width (the one place these messages are spelled)."""
    sizes = [("--hidden", model.hidden)]
    if model.kind == "gpt":
        sizes += [("--heads", model.heads), ("--kv-heads", model.num_kv_heads), ("--ffn-hidden", model.ffn_size)]
    for flag, value in sizes:
        if value % tp:
            raise PipesimError(f"{flag} {value} is not divisible by tp({tp})")


def vocab_shard(model: ModelConfig, tp: int) -> int:
    """Vocabulary rows on one tp rank: ceil(V / tp) (Megatron pads the vocabulary to divide)."""
    return -(-model.vocab // tp)


__all__ = ["ACT_FP8_STORE_FLAG", "ATTENTION", "CP_COMM_TYPES", "RECOMPUTE", "LayerOptions", "check_act_fp8_store",
           "check_choices", "check_cp_comm", "check_tp_split", "vocab_shard"]
