"""The model of pretrain_gpt.py's arguments as pipesim's flags, with Megatron-LM v0.15.3's defaults (megatron/
training/arguments.py validate_args): a GPT of LayerNorm, GeLU, learned positions, biases, dropout 0.1 and embedding
and output TIED; SwiGLU's width int(8h / 3 / 64) x 64 unless given; the vocabulary padded as
megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding pads it. What pipesim cannot represent is refused."""

from __future__ import annotations

from pipesim.commands.megatron_args import MegatronArgs
from pipesim.commands.structure_args import NORMALIZATIONS, POSITION_TYPES, SOFTMAX_TYPES
from pipesim.errors import PipesimError

DROPOUT = 0.1  # Megatron's --hidden-dropout and --attention-dropout default


def padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron's _vocab_size_with_padding: up to a multiple of --make-vocab-size-divisible-by x tp."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def swiglu_width(hidden: int) -> int:
    """Megatron's SwiGLU width when --ffn-hidden-size is not given: int((4h x 2 / 3) / 64) x 64."""
    return int((4 * hidden * 2 / 3) / 64) * 64


def model_flags(a: MegatronArgs, *, tp: int, seq: int, vocab_typed: bool) -> list[str]:
    """pipesim's model flags of the file (`vocab_typed`: the command line gives --vocab, so the file need not)."""
    w = a.where
    layers, hidden, heads = a.need("--num-layers"), a.need("--hidden-size"), a.need("--num-attention-heads")
    max_positions = a.need("--max-position-embeddings")
    if max_positions < seq:  # Megatron asserts it
        raise _error(w, f"--max-position-embeddings {max_positions} is below --seq-length {seq} (Megatron asserts "
                        "max_position_embeddings >= seq_length)")
    swiglu, relu2 = a.on("--swiglu"), a.on("--squared-relu")
    if swiglu and relu2:
        raise _error(w, "--swiglu and --squared-relu: give one activation")
    activation = "swiglu" if swiglu else "relu2" if relu2 else "gelu"
    ffn = a.number("--ffn-hidden-size", swiglu_width(hidden) if swiglu else 4 * hidden)
    out = ["--layers", str(layers), "--hidden", str(hidden), "--heads", str(heads), "--ffn-hidden", str(ffn),
           "--activation", activation]
    latent = a.on("--multi-latent-attention")  # its heads' widths are its own: --kv-channels and the groups unread
    groups, channels = a.number("--num-query-groups", 1), a.number("--kv-channels", None)  # checked either way
    if a.on("--group-query-attention") and not latent:
        out += ["--kv-heads", str(groups)]
    if channels is not None and not latent:
        out += ["--kv-channels", str(channels)]
    rope_type = a.one_of("--rope-type", {"rope": "rope", "yarn": "yarn", None: None}, None,
                         "Megatron's choices are rope and yarn")
    for flag in ("--rotary-scaling-factor", "--mscale", "--mscale-all-dim"):  # YaRN's: values Megatron parses
        a.number(flag, None, float)
    if latent:  # multi_latent_attention.py applies YaRN's mscale inside its own RoPE kernel and softmax scale
        out.append("--multi-latent-attention")
    elif rope_type == "yarn":
        raise _error(w, "--rope-type yarn on standard attention: pipesim reads YaRN's attention factor from a "
                        "--model-config (its rope_scaling), not from Megatron's flags")
    out += ["--normalization", a.one_of("--normalization", {k: k for k in NORMALIZATIONS}, "LayerNorm",
                                        " or ".join(NORMALIZATIONS))]
    positions = "rope" if a.on("--use-rotary-position-embeddings") else a.one_of(
        "--position-embedding-type", {k: k for k in POSITION_TYPES}, "learned_absolute",
        "pipesim models learned_absolute and rope positions")
    if positions == "learned_absolute" and max_positions != seq:  # its table is max_position_embeddings x hidden
        raise _error(w, f"--max-position-embeddings {max_positions} above --seq-length {seq} with learned positions: "
                        "pipesim's learned table holds --seq-length rows")
    out += ["--position-embedding-type", positions]
    if positions == "rope":  # with learned positions Megatron reads none of the rotary flags
        out += _rotary_flags(a)
    if a.on("--norm-epsilon"):
        out += ["--norm-epsilon", a.text("--norm-epsilon")]
    if a.on("--disable-bias-linear"):
        out.append("--disable-bias-linear")
    if a.on("--add-qkv-bias"):
        out.append("--add-qkv-bias")
    out.append("--untie-embeddings-and-output-weights" if a.on("--untie-embeddings-and-output-weights")
               else "--tie-embeddings-and-output-weights")
    hidden_p, attention_p = (a.number(f, DROPOUT, float) for f in ("--hidden-dropout", "--attention-dropout"))
    for flag, prob in (("--hidden-dropout", hidden_p), ("--attention-dropout", attention_p)):
        if not 0 <= prob < 1:  # nan fails both: torch's dropout takes 0 <= p <= 1, and p = 1 zeroes the stream
            raise _error(w, f"{flag} {prob:g}: a probability from 0 up to 1")
    if (hidden_p > 0) != (attention_p > 0):
        raise _error(w, f"--hidden-dropout {hidden_p:g} with --attention-dropout {attention_p:g}: pipesim's dropout "
                        "runs in all three places or none (give both above 0, or both 0)")
    out.append("--dropout" if hidden_p > 0 else "--no-dropout")
    if a.on("--qk-layernorm"):
        out.append("--qk-layernorm")
    out += _attention_flags(a)
    if not vocab_typed:
        out += ["--vocab", str(_vocab(a, tp))]
    return out + _expert_flags(a, ffn)


def _rotary_flags(a: MegatronArgs) -> list[str]:
    """Megatron's rotary flags as typed (pipesim has them by the same names: pipesim.commands.structure_args);
    --rope-scaling-factor only with --use-rope-scaling, the one that reads it."""
    out = [word for flag in ("--rotary-base", "--rotary-percent", "--rotary-seq-len-interpolation-factor")
           if a.on(flag) for word in (flag, a.text(flag))]
    if a.on("--use-rope-scaling"):
        out.append("--use-rope-scaling")
        if a.on("--rope-scaling-factor"):
            out += ["--rope-scaling-factor", a.text("--rope-scaling-factor")]
    return out


def _attention_flags(a: MegatronArgs) -> list[str]:
    """--softmax-type (vanilla or learnable: GPT-OSS's sinks), --window-size and --window-attn-skip-freq as typed; a
    skip pattern given as a list (Megatron's moe_freq_type) that no every-N-th rule says is refused."""
    softmax = a.one_of("--softmax-type", {k: k for k in SOFTMAX_TYPES}, "vanilla",
                       "pipesim models the vanilla softmax and the learnable one (a sink logit per head)")
    out = ["--softmax-type", softmax] if softmax != "vanilla" else []
    if a.on("--window-size"):
        out += ["--window-size", a.text("--window-size")]
    if a.on("--window-attn-skip-freq"):
        skip = a.text("--window-attn-skip-freq")
        if not skip.isdigit():
            raise _error(a.where, f"--window-attn-skip-freq {skip}: pipesim models full attention on every N-th layer "
                                  "(an integer N), not a per-layer list")
        out += ["--window-attn-skip-freq", skip]
    return out


def _vocab(a: MegatronArgs, tp: int) -> int:
    """--padded-vocab-size as given, else --vocab-size (one more with the NullTokenizer: its end-of-document token)
    padded as Megatron pads it."""
    padded = a.number("--padded-vocab-size", None)
    if padded is not None:
        if padded % tp:  # VocabParallelEmbedding splits the rows over the tp ranks
            raise _error(a.where, f"--padded-vocab-size {padded} is not a multiple of --tensor-model-parallel-size "
                                  f"{tp}")
        return padded
    vocab = a.number("--vocab-size", None)
    if vocab is None:
        raise _error(a.where, "the vocabulary comes from the tokenizer file; give --vocab-size in the file or --vocab "
                              "after it")
    if a.text("--tokenizer-type") == "NullTokenizer":
        vocab += 1
    return padded_vocab(vocab, a.number("--make-vocab-size-divisible-by", 128), tp)


def _expert_flags(a: MegatronArgs, ffn: int) -> list[str]:
    """The experts (--num-experts on): on the layers --moe-layer-freq gives (pipesim.model.moe_layer_freq reads it,
    refusing a placement it cannot spell), each expert --moe-ffn-hidden-size wide (Megatron's default: the dense
    `ffn`)."""
    experts = a.number("--num-experts", None)
    if experts is None:
        return []
    out = ["--moe-layer-freq", a.text("--moe-layer-freq")] if a.on("--moe-layer-freq") else []
    out += ["--num-experts", str(experts), "--moe-router-topk", str(a.number("--moe-router-topk", 2)),
           "--moe-ffn-hidden-size", str(a.number("--moe-ffn-hidden-size", ffn))]
    if a.on("--moe-shared-expert-intermediate-size"):
        out += ["--moe-shared-expert-intermediate-size", str(a.number("--moe-shared-expert-intermediate-size", None))]
    if a.on("--moe-shared-expert-gate"):  # Megatron-core >= 0.16 (TransformerConfig.moe_shared_expert_gate)
        out.append("--moe-shared-expert-gate")
    return out


def _error(where: str, message: str) -> PipesimError:
    return PipesimError(f"{where}: {message}")


__all__ = ["DROPOUT", "model_flags", "padded_vocab", "swiglu_width"]
