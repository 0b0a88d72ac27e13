"""The model both the cost model and the executor build: the lecture's deep MLP or a decoder-only transformer.

One config so that simulated and executed runs describe the same network. kind "gpt" is the GPT
of Megatron's papers by default (4h GeLU MLP, LayerNorm, dropout, biases, learned positions); the
fields after `seed` turn it into a Llama-style model (grouped-query attention, SwiGLU of its own
width, RMSNorm, RoPE, no biases or dropout, tied or untied embeddings), a mixture of experts (`moe`), DeepSeek's
multi-head latent attention (`mla`) and its multi-token-prediction modules (`mtp_layers`), and Qwen3's attention
(`head_width`: heads whose width is not hidden / heads, so that Q, K, V and the projection's input are heads x
head_width wide; `qk_norm`: a norm over head_dim on every query and key head), sliding-window attention (`window`,
pipesim.model.attention_window) and GPT-OSS's attention sinks (`attention_sinks`: one learned logit per head that
joins each softmax's denominator). Their defaults keep the "mlp" and "gpt" models exactly as they were, and `to_dict`
leaves them out while at the default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from pipesim.errors import PipesimError
from pipesim.model.attention_window import SlidingWindow
from pipesim.model.gemma_layer import check_gemma_layer
from pipesim.model.hybrid import NOT_WITH_HYBRID, HybridLayers, check_hybrid
from pipesim.model.latent_attention import LatentAttention
from pipesim.model.linear_attention import NOT_WITH_LINEAR, LinearAttention, check_linear_attention
from pipesim.model.llama4_attention import check_llama4_attention, nope_layers
from pipesim.model.moe import MoeConfig
from pipesim.model.rotary import Rotary

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# MLP: Linear-GeLU-Linear, SwiGLU's gate, up and down matrices, Linear-ReLU^2-Linear (Nemotron-4's squared ReLU), or
# GeGLU's three matrices (Gemma's gelu_pytorch_tanh(gate) x up)
ACTIVATIONS = ("gelu", "swiglu", "relu2", "geglu")
GATED = ("swiglu", "geglu")  # the gated MLPs: gate and up in one FC1 of twice the width
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope", "none")  # a learned (seq x hidden) table, rotary embeddings, or none (a hybrid's)
# MoeConfig's fields left out of to_dict at their defaults (older files read the same)
MOE_OPTIONAL_FIELDS = ("glu_alpha", "glu_offset", "score", "input_probs", "shared_gate", "placement")
MOE_OPTIONAL_DEFAULTS = {f.name: f.default for f in fields(MoeConfig) if f.name in MOE_OPTIONAL_FIELDS}
STRUCTURE_FIELDS = ("kv_heads", "ffn_hidden", "activation", "norm", "dropout", "biases", "positions",
                    "tied_embeddings", "moe", "mla", "mtp_layers", "head_width", "qk_norm", "window",
                    "attention_sinks", "rope_mscale", "rotary", "norm_eps", "qkv_bias", "qk_l2_norm",
                    "nope_every", "attention_chunk", "post_norms", "embedding_scale",
                    "softmax_scale", "hybrid", "attention_gate",
                    "linear_attention")  # left out of to_dict at their defaults

MAX_LAYERS = 1 << 16  # layers of one model: far above any published one, a step costed in well under a second


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
    # transformer structure (gpt only); the defaults are the GPT of Megatron's papers
    kv_heads: int | None = None  # key/value heads (grouped-query attention); None: as many as heads
    ffn_hidden: int | None = None  # MLP width; None: 4 * hidden
    activation: str = "gelu"  # "gelu" or "relu2" (two matrices), or "swiglu" (gate, up, down: three matrices)
    norm: str = "layernorm"  # "layernorm" (weight and bias) or "rmsnorm" (weight only)
    dropout: bool = True  # dropout after softmax, projection and MLP (masks stashed); Llama has none
    biases: bool = True  # biases on the linear layers; Llama has none
    positions: str = "learned"  # position embedding: "learned" table or "rope"
    tied_embeddings: bool = False  # the LM head reuses the token embedding's matrix
    moe: MoeConfig | None = None  # mixture of experts (pipesim/model/moe.py); None: every MLP dense
    mla: LatentAttention | None = None  # latent attention (pipesim/model/latent_attention.py); None: standard
    mtp_layers: int = 0  # DeepSeek-V3's multi-token-prediction modules after the last layer (on the last stage)
    head_width: int | None = None  # width of one attention head (config.json's head_dim); None: hidden / heads
    qk_norm: bool = False  # a norm (the model's kind) over head_dim on each query and key head (Qwen3's q/k_norm)
    window: SlidingWindow | None = None  # sliding-window attention on some or all layers; None: full attention
    attention_sinks: bool = False  # a learned logit per head in every softmax's denominator (GPT-OSS's sinks)
    # YaRN's attention factor on RoPE's cos and sin (pipesim.model.hf_rope); 1.0: none. Not 1: Megatron-core's RoPE
    # runs unfused
    rope_mscale: float = 1.0
    # RoPE's base and scaling (pipesim.model.rotary): no cost depends on them, the executor builds them; None: base
    # 10,000 unscaled
    rotary: Rotary | None = None
    # the norms' epsilon (config.json's rms_norm_eps, layer_norm_eps or norm_eps; Megatron-LM's --norm-epsilon default):
    # no cost depends on it, the executor's norms take it
    norm_eps: float = 1e-5
    # biases on the QKV projection alone (Megatron-LM's --add-qkv-bias, Qwen2's q/k/v_proj), the other linears
    # bias-free; `biases` puts one there already, so with it this is stored False (one model, one spelling)
    qkv_bias: bool = False
    # Llama 4's attention (pipesim.model.llama4_attention): a weightless L2 norm on every query and key head
    # (Megatron-core's --qk-l2-norm), layer l without rotary embedding when (l + 1) % nope_every == 0 (its
    # --no-rope-freq; 0: none), chunked attention over chunks of attention_chunk tokens (None: none; modelled up to
    # the chunk, where it is causal attention)
    qk_l2_norm: bool = False
    nope_every: int = 0
    attention_chunk: int | None = None
    # Gemma's layer (pipesim.model.gemma_layer): a norm on the attention's and on the MLP's output before each residual
    # add (post_attention_layernorm, post_feedforward_layernorm), and the embeddings times sqrt(hidden)
    post_norms: bool = False
    embedding_scale: bool = False
    # the attention scores' scale (Megatron-core's softmax_scale; Gemma's query_pre_attn_scalar ** -0.5): inside the
    # attention kernel, no cost; the executor builds it. None: 1 / sqrt(head_dim)
    softmax_scale: float | None = None
    # Megatron-core's hybrid model (pipesim.model.hybrid: Nemotron-H, Nemotron 3): one layer per pattern symbol, Mamba-2
    # mixers among attention, MLP and expert layers; None: every layer a transformer block
    hybrid: HybridLayers | None = None
    # Qwen3-Next's and Qwen3.5's attention (pipesim.model.linear_attention): a sigmoid gate on the attention's output
    # (Megatron-core's attention_output_gate: the query projection's second half), and Gated DeltaNet mixers in place
    # of self-attention on all but every full_every-th layer; None: every layer attends with softmax attention
    attention_gate: bool = False
    linear_attention: LinearAttention | None = None

    def __post_init__(self) -> None:
        if isinstance(self.moe, dict):  # from to_dict / JSON
            object.__setattr__(self, "moe", MoeConfig(**self.moe))
        if isinstance(self.window, dict):
            object.__setattr__(self, "window", SlidingWindow(**self.window))
        if isinstance(self.mla, dict):
            object.__setattr__(self, "mla", LatentAttention(**self.mla))
        if isinstance(self.rotary, dict):
            object.__setattr__(self, "rotary", Rotary(**self.rotary))
        if isinstance(self.hybrid, dict):
            object.__setattr__(self, "hybrid", HybridLayers(**self.hybrid))
        if isinstance(self.linear_attention, dict):
            object.__setattr__(self, "linear_attention", LinearAttention(**self.linear_attention))
        if self.kind not in ("mlp", "gpt"):
            raise PipesimError(f"unknown --model {self.kind!r}; choose mlp or gpt")
        for name in ("hidden", "layers", "heads", "seq", "vocab", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PipesimError(f"--{name} must be a positive integer, got {value!r}")
        if self.layers > MAX_LAYERS:  # the costs walk the layers one by one: 10**9 of them never came back
            raise PipesimError(f"--layers {self.layers} is above pipesim's bound of {MAX_LAYERS:,} (the deepest "
                               "published models have a few hundred)")
        if self.dtype not in DTYPE_BYTES:
            raise PipesimError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
        self._check_heads()
        if self.kind == "gpt" and self.head_width is None and self.hidden % self.heads:
            raise PipesimError(f"--hidden {self.hidden} must be divisible by --heads {self.heads}")
        self._check_structure()

    def _check_heads(self) -> None:
        """head_width and qk_norm: types, a transformer's, not latent attention's (whose heads have their own widths);
        a head_width equal to hidden / heads is the default spelled out, stored as None (one model, one spelling)."""
        width = self.head_width
        if width is not None and (not isinstance(width, int) or isinstance(width, bool) or width < 1):
            raise PipesimError(f"head_width must be a positive integer, got {width!r}")
        if not isinstance(self.qk_norm, bool):
            raise PipesimError(f"qk_norm must be true or false, got {self.qk_norm!r}")
        for name, on in (("head_width", width is not None), ("qk_norm", self.qk_norm)):
            if on and self.kind != "gpt":
                raise PipesimError(f"{name} needs a transformer (--model gpt or --model-config)")
            if on and self.mla is not None:
                raise PipesimError(f"{name} with latent attention (mla): its heads' widths are mla's (qk_nope_dim, "
                                   "qk_rope_dim, v_head_dim)")
        if width is not None and width * self.heads == self.hidden:
            object.__setattr__(self, "head_width", None)

    def _check_structure(self) -> None:
        """The transformer fields: types, choices, and kv heads dividing the heads."""
        for name, flag in (("kv_heads", "--kv-heads"), ("ffn_hidden", "--ffn-hidden")):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise PipesimError(f"{flag} must be a positive integer, got {value!r}")
        for name, choices in (("activation", ACTIVATIONS), ("norm", NORMS), ("positions", POSITIONS)):
            if getattr(self, name) not in choices:
                raise PipesimError(f"unknown {name} {getattr(self, name)!r}; choose {' or '.join(choices)}")
        if self.activation == "geglu" and self.moe is not None:
            raise PipesimError("GeGLU experts are not modelled (mixture-of-experts models here are SwiGLU's or "
                               "squared ReLU's)")
        check_gemma_layer(self.kind, post_norms=self.post_norms, embedding_scale=self.embedding_scale,
                          softmax_scale=self.softmax_scale)
        for name in ("dropout", "biases", "tied_embeddings", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise PipesimError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.qkv_bias and self.kind != "gpt":
            raise PipesimError("qkv_bias (--add-qkv-bias) needs a transformer (--model gpt or --model-config)")
        if self.qkv_bias and self.biases:
            object.__setattr__(self, "qkv_bias", False)
        if isinstance(self.rope_mscale, bool) or not isinstance(self.rope_mscale, (int, float)) \
                or not 0 < self.rope_mscale < float("inf"):
            raise PipesimError(f"rope_mscale must be a positive finite number, got {self.rope_mscale!r}")
        if self.rope_mscale != 1.0 and (self.positions != "rope" or self.mla is not None):
            raise PipesimError(f"rope_mscale {self.rope_mscale:g} (YaRN's attention factor) scales rotary "
                               "embeddings of standard attention; this model has "
                               + ("latent attention (its YaRN factor is not modelled)" if self.mla is not None
                                  else f"{self.positions} positions"))
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or not 0 < self.norm_eps < 1:
            raise PipesimError(f"norm_eps must be a number in (0, 1), got {self.norm_eps!r}")
        if self.rotary is not None and (not isinstance(self.rotary, Rotary) or self.positions != "rope"):
            raise PipesimError(f"rotary frequencies go with rope positions and a Rotary, got {self.positions} "
                               f"positions and {type(self.rotary).__name__}")
        if self.rotary is not None and self.rotary.fraction < 1 and self.mla is None:
            self.rotary.rotated_width(self.head_dim)  # an even number of features, or refused in one line
        if self.kind == "gpt" and self.heads % self.num_kv_heads:
            raise PipesimError(f"--kv-heads {self.num_kv_heads} must divide --heads {self.heads}")
        if self.moe is not None:
            if not isinstance(self.moe, MoeConfig):
                raise PipesimError(f"moe must be a MoeConfig, got {type(self.moe).__name__}")
            if self.kind != "gpt":
                raise PipesimError("experts (moe) need a transformer (--model gpt or --model-config)")
            placed = self.moe.placement
            if placed and placed[-1] >= self.layers + self.mtp_layers:
                raise PipesimError(f"moe placement {placed}: the model has {self.layers + self.mtp_layers} layers")
            if self.moe.moe_layers(0, self.layers) == 0:
                raise PipesimError(f"moe: none of the {self.layers} layers has experts (dense_layers "
                                   f"{self.moe.dense_layers}, every {self.moe.every})")
            if not self.moe.plain_glu and self.activation != "swiglu":  # (geglu experts: refused above)
                raise PipesimError(f"moe glu_clamp, glu_alpha and glu_offset shape a gated activation; activation "
                                   f"{self.activation!r} has none (use swiglu)")
        self._check_deepseek()

    def _check_deepseek(self) -> None:
        """Latent attention and multi-token prediction: a transformer's, without what pipesim does not model with
        them (biases on latent attention's linears, grouped key/value heads, learned positions)."""
        if self.mla is not None:
            if not isinstance(self.mla, LatentAttention):
                raise PipesimError(f"mla must be a LatentAttention, got {type(self.mla).__name__}")
            if self.kind != "gpt":
                raise PipesimError("latent attention (mla) needs a transformer (--model gpt or --model-config)")
            if self.biases or self.qkv_bias:
                which = "biases" if self.biases else "qkv_bias (--add-qkv-bias)"
                raise PipesimError("latent attention (mla): pipesim models its linears bias-free (DeepSeek's "
                                   f"attention_bias false); set {which} false")
            if self.positions != "rope":
                raise PipesimError("latent attention (mla) carries its positions in a decoupled rotary part: "
                                   "positions must be rope")
            if self.num_kv_heads != self.heads:
                raise PipesimError(f"latent attention (mla) gives every head its own keys and values: --kv-heads "
                                   f"{self.num_kv_heads} must equal --heads {self.heads}")
        m = self.mtp_layers
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise PipesimError(f"mtp_layers must be a non-negative integer, got {m!r}")
        if self.layers + m > MAX_LAYERS:  # each module is costed as a layer: the bound --layers has
            raise PipesimError(f"{m} multi-token-prediction modules beside {self.layers} layers are above pipesim's "
                               f"bound of {MAX_LAYERS:,} layers (DeepSeek-V3 has 1)")
        if m and self.kind != "gpt":
            raise PipesimError("multi-token prediction (mtp_layers) needs a transformer (--model gpt or "
                               "--model-config)")
        if m and self.positions == "learned":
            raise PipesimError("multi-token prediction (mtp_layers) with learned positions: Megatron-core supports "
                               "rope only")
        self._check_window()
        check_llama4_attention(self)
        check_hybrid(self.hybrid, kind=self.kind, layers=self.layers, moe=self.moe,
                     fields={name: getattr(self, name) for name, _ in NOT_WITH_HYBRID})
        check_linear_attention(self.linear_attention, kind=self.kind, gate=self.attention_gate,
                               mla=self.mla is not None,
                               fields={name: getattr(self, name) for name, _ in NOT_WITH_LINEAR})

    def _check_window(self) -> None:
        """Sliding windows and sinks: a standard transformer's attention (not latent attention's, not with
        multi-token prediction: pipesim models neither with them)."""
        if self.window is not None and not isinstance(self.window, SlidingWindow):
            raise PipesimError(f"window must be a SlidingWindow, got {type(self.window).__name__}")
        if not isinstance(self.attention_sinks, bool):
            raise PipesimError(f"attention_sinks must be true or false, got {self.attention_sinks!r}")
        for name, on in (("sliding-window attention (window)", self.window is not None),
                         ("attention sinks", self.attention_sinks)):
            if on and self.kind != "gpt":
                raise PipesimError(f"{name} needs a transformer (--model gpt or --model-config)")
            if on and (self.mla is not None or self.mtp_layers):
                raise PipesimError(f"{name} with latent attention or multi-token prediction is not modelled")

    def windowed_layers(self, start: int, n: int) -> int:
        """How many of layers start .. start + n - 1 attend over a window shorter than the sequence (0 without one:
        a window at least as long as the sequence is full attention)."""
        return 0 if self.window_size is None else self.window.windowed_layers(start, n)

    def nope_layers(self, start: int, n: int) -> int:
        """How many of layers start .. start + n - 1 take no rotary embedding (`nope_every`; 0 without)."""
        return nope_layers(self.nope_every, start, n)

    @property
    def window_size(self) -> int | None:
        """Keys a windowed layer's query sees when that is fewer than the sequence; None: every layer attends fully."""
        w = self.window
        return w.size if w is not None and w.size < self.seq else None

    @property
    def has_qkv_bias(self) -> bool:
        """The QKV projection has a bias: every linear's (`biases`) or its alone (`qkv_bias`)."""
        return self.biases or self.qkv_bias

    @property
    def gated(self) -> bool:
        """A gated MLP (SwiGLU, GeGLU): FC1 holds gate and up, 2 x ffn outputs, and three matrices in all."""
        return self.activation in GATED

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads: `kv_heads`, or one per query head (multi-head attention)."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def ffn_size(self) -> int:
        """Width of the MLP's hidden layer: `ffn_hidden`, or GPT's 4 * hidden."""
        return 4 * self.hidden if self.ffn_hidden is None else self.ffn_hidden

    @property
    def head_dim(self) -> int:
        """Width of one attention head: `head_width`, or hidden / heads. Latent attention has none (its query/key and
        value heads differ): asking is an error, so that no cost is taken from standard attention's shapes."""
        if self.mla is not None:
            raise PipesimError("latent attention (mla) has no single head_dim: its costs come from "
                               "pipesim.model.latent_attention")
        return self.hidden // self.heads if self.head_width is None else self.head_width

    @property
    def attention_width(self) -> int:
        """Width of the queries and of the attention's output (the projection's input): heads x head_dim, the hidden
        size unless `head_width` says otherwise (Qwen3-30B-A3B: 32 x 128 = 4096 over a 2048 hidden)."""
        return self.heads * self.head_dim

    @property
    def qkv_width(self) -> int:
        """Outputs of the QKV projection: the queries (and as many gate values with `attention_gate`: Qwen3-Next's
        q_proj of twice the width), the keys and the values."""
        return (2 if self.attention_gate else 1) * self.attention_width + 2 * self.kv_width

    @property
    def kv_width(self) -> int:
        """Width of the keys and of the values: kv heads x head_dim."""
        return self.num_kv_heads * self.head_dim

    def microbatch_size(self, microbatches: int) -> int:
        """Samples per microbatch; the batch must split evenly."""
        if self.batch % microbatches:
            raise PipesimError(f"--batch {self.batch} does not split into {microbatches} microbatches evenly")
        return self.batch // microbatches

    def microbatches_for(self, dp: int = 1, *, microbatches: int | None = None,
                         microbatch_size: int | None = None, default_batch: bool = False) -> int:
        """Microbatches per step on each dp replica from either spelling: m = batch / (dp x microbatch size).

        Megatron and torchtitan users give the microbatch size; both given must agree. `default_batch`: the batch was
        not typed (the command's default), which a batch that does not split says, since typing one is the fix.
        """
        default = f" (--batch {self.batch} is the default: give --batch)" if default_batch else ""
        for flag, value in (("--microbatches", microbatches), ("--microbatch-size", microbatch_size)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise PipesimError(f"{flag} must be a positive integer, got {value!r}")
        if microbatches is None and microbatch_size is None:
            raise PipesimError("give --microbatches or --microbatch-size")
        if microbatch_size is None:
            if self.batch % (dp * microbatches):
                raise PipesimError(f"--batch {self.batch} does not split into dp({dp}) x {microbatches} "
                                   f"microbatches evenly{default}")
            return microbatches
        if microbatches is not None and dp * microbatches * microbatch_size != self.batch:
            raise PipesimError(f"--microbatches {microbatches} and --microbatch-size {microbatch_size} disagree: "
                               f"dp({dp}) x {microbatches} x {microbatch_size} = "
                               f"{dp * microbatches * microbatch_size}, not --batch {self.batch}{default}")
        if self.batch % (dp * microbatch_size):
            raise PipesimError(f"--batch {self.batch} does not split into dp({dp}) x microbatches of "
                               f"--microbatch-size {microbatch_size}{default}")
        return self.batch // (dp * microbatch_size)

    def to_dict(self) -> dict:
        """All fields, less the transformer-structure ones still at their default (older files read the same)."""
        data = asdict(self)
        for f in fields(self):
            if f.name in STRUCTURE_FIELDS and data[f.name] == f.default:
                del data[f.name]
        if data.get("moe") is not None:  # the experts' gate shape and routing, likewise (MoeConfig's defaults)
            for name in MOE_OPTIONAL_FIELDS:
                if data["moe"][name] == MOE_OPTIONAL_DEFAULTS[name]:
                    del data["moe"][name]
        return data



def split_layers(layers: int, stages: int, weights: list[int] | None = None) -> list[int]:
    """Layers per stage (per chunk under interleaved / V placements): even split (earlier stages take the
    remainder), or explicit `weights`.

    `weights` (e.g. [3, 2, 2, 1]) must sum to `layers`, one entry per stage. Any entry may be 0: that
    stage holds no layer (a GPT's first and last keep the embedding and the head, as Llama 3 405B's 126
    layers over 128 chunks; any other is an identity stage that passes its input on and the gradient back).
    """
    if weights is not None:
        if layers < 1:
            raise PipesimError(f"layer split {weights}: a model needs at least one layer, got {layers}")
        if len(weights) != stages or sum(weights) != layers or min(weights, default=0) < 0:
            raise PipesimError(f"layer split {weights} must have {stages} entries of 0 or more layers summing to "
                               f"the model's {layers} layers")
        return list(weights)
    if layers < stages:
        raise PipesimError(f"--layers {layers} is fewer than the {stages} stages; each stage needs a layer "
                           "(or give --layer-split)")
    base, extra = divmod(layers, stages)
    return [base + (1 if s < extra else 0) for s in range(stages)]
