"""Read a Hugging Face `config.json` (Llama-style decoder) into a ModelConfig.

Fields read: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default:
num_attention_heads, as transformers' LlamaConfig), intermediate_size, vocab_size,
max_position_embeddings, tie_word_embeddings (default false, as LlamaConfig), hidden_act ("silu"
is Llama's gated MLP: SwiGLU; "gelu*" a plain two-matrix MLP), rms_norm_eps (present: RMSNorm),
attention_bias / mlp_bias (default false), attention_dropout (default 0: no dropout), head_dim
(if given, must be hidden_size / num_attention_heads, but in a qwen3 file: below), torch_dtype. Position
embeddings are rotary (Llama's). Every other key is checked by `pipesim.model.hf_keys`: one that changes nothing
pipesim models is ignored (and listed), one that would change the model (experts, latent attention, a
sliding window shorter than the sequence, ...) refuses the file. The bundled configs
(pipesim/model/configs/) load by name: `llama3-405b`, `mixtral-8x7b`, `qwen3-30b-a3b`, `qwen3-235b-a22b`, `kimi-k2`,
`llama4-scout-17b-16e`, `llama4-maverick-17b-128e`, ...

A "llama4_text" file (Llama4ForCausalLM), or a "llama4" one's text_config (Llama 4's repositories:
Llama4ForConditionalGeneration, its vision encoder ignored and listed), is read by pipesim.model.hf_llama4:
interleaved experts with a shared one, NoPE layers, the L2 QK-norm and chunked attention.

A "mixtral" file is Llama's layer with every MLP a mixture of experts (transformers' MixtralSparseMoeBlock):
`num_local_experts` experts (default 8, as MixtralConfig), `num_experts_per_tok` of them per token (default 2),
each a SwiGLU MLP of width `intermediate_size`, behind a bias-free router h -> E. Mixtral's experts are
always gated (w2(act(w1 x) * w3 x)) and its linears never have biases, so a "gelu*" activation (a gated GeLU,
which pipesim's two-matrix "gelu" is not) or a true `attention_bias` / `mlp_bias` refuses the file.

A "glm4_moe" file (GLM-4.5) is read by pipesim.model.hf_deepseek: DeepSeek-V3's experts and MTP modules behind
grouped-query attention with q/k/v biases, QK-norm and heads of head_dim.

A "deepseek_v3" file (DeepSeek-V3's DeepseekV3ForCausalLM) reads, besides Llama's keys: multi-head latent attention
(`q_lora_rank`, null for a plain Q projection, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`:
ModelConfig.mla); DeepSeekMoE (`n_routed_experts` -> experts, null for a dense model, `num_experts_per_tok` ->
top_k, `moe_intermediate_size` -> expert_ffn and the shared experts' width, `n_shared_experts` -> shared_experts,
`first_k_dense_replace` -> dense_layers of width `intermediate_size`, `moe_layer_freq` 1 -> every, `topk_method`
"noaux_tc" -> a per-expert routing bias); `num_nextn_predict_layers` -> mtp_layers (absent: none). Its gated MLP
and bias-free linears are Llama's. `moe_layer_freq` other than 1 is refused (DeepSeek places experts where
l % freq == 0, MoeConfig.every where (l + 1) % every == 0), as is a `scoring_func` other than sigmoid or softmax
and a `topk_method` DeepSeek's code does not know. A "kimi_k2" file (Moonshot AI's Kimi K2) runs the same
DeepseekV3ForCausalLM code and is read as a "deepseek_v3" one (pipesim.model.hf_keys.TYPE_ALIASES), and so is a
"deepseek_v2" file (DeepSeek-V2 and V2-Lite: the same latent attention and DeepSeekMoE, softmax routing without a
bias, no multi-token prediction). A `head_dim` in these files (transformers' DeepSeek configs write head_dim =
qk_rope_head_dim) must be that.

A "qwen2" file (Qwen2ForCausalLM: Qwen2 and Qwen2.5's dense models) is Llama's layer with biases on the q, k and v
projections alone (transformers' Qwen2Attention builds q_proj, k_proj and v_proj with bias=True and o_proj without,
whatever the file says; its MLP is bias-free): ModelConfig.qkv_bias, Megatron-LM's --add-qkv-bias. A true
`attention_bias` or `mlp_bias` there refuses the file. Its sliding window is off in every released file
(use_sliding_window false); switched on (on the layers from max_window_layers on) it is refused as not modelled.

A "qwen3" file (Qwen3ForCausalLM) is Llama's layer with QK-norm (an RMSNorm over head_dim on every query and key head:
ModelConfig.qk_norm) and heads of `head_dim` whatever hidden_size / num_attention_heads is (ModelConfig.head_width):
`head_dim` and `num_key_value_heads` are required (transformers' defaults for them, 128 and 32 or 4, are not
Llama's). A "qwen3_moe" file (Qwen3MoeForCausalLM) adds Qwen3MoeSparseMoeBlock on layer l when l is not in
`mlp_only_layers` and (l + 1) % `decoder_sparse_step` == 0 (the others dense, of width `intermediate_size`):
`num_experts` experts (0: dense) of width `moe_intermediate_size`, `num_experts_per_tok` per token, a bias-free router,
no shared expert (defaults those of Qwen3MoeConfig: 128, 768, 8, step 1, no mlp_only_layers). `mlp_only_layers` is read
when it is what MoeConfig can say (dense first layers), refused otherwise. Qwen3's `attention_bias` puts biases on
q, k, v and o only, which ModelConfig.biases (every linear) cannot say: a true one refuses the file.

A "qwen2_moe" file (Qwen2MoeForCausalLM: Qwen1.5-MoE, Qwen2-MoE) is Qwen3-MoE's experts and placement (Qwen2MoeConfig's
defaults) beside one shared SwiGLU expert of `shared_expert_intermediate_size` behind a sigmoid gate
(MoeConfig.shared_gate), with q/k/v biases by its `qkv_bias` (true by default) and no QK-norm.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from pipesim.errors import PipesimError, parse_json
from pipesim.model.config import DTYPE_BYTES, ModelConfig
from pipesim.model.hf_deepseek import deepseek_attention, deepseek_experts, glm4_moe_fields, mtp_modules
from pipesim.model.hf_gemma import gemma3_fields, gemma3_rope, unwrap_gemma3, with_gemma3_defaults
from pipesim.model.hf_gpt_oss import GPT_OSS_DEFAULTS, gpt_oss_experts, read_window
from pipesim.model.hf_keys import KeyReport, check_keys, code_type, count_field, positive_field, required_field
from pipesim.model.hf_llama4 import llama4_fields, unwrap_llama4
from pipesim.model.hf_nemotron_h import nemotron_h_fields
from pipesim.model.hf_qwen3_next import qwen3_next_fields
from pipesim.model.hf_rope import yarn_attention_factor
from pipesim.model.moe import MoeConfig
from pipesim.model.rotary import Rotary, rotary_from_config

BUNDLED_DIR = Path(__file__).parent / "configs"
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
            "max_position_embeddings")
GATED_ACTS = ("silu", "swish")  # a gated MLP: act(gate) * up, then down
PLAIN_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")
SQUARED_RELU = ("relu2",)  # Nemotron-4's relu(x)^2 between two matrices (transformers' ACT2FN "relu2")
# model types whose MLP is gated whatever hidden_act says (Mixtral's experts too: `_mixtral_experts`)
GATED_TYPES = ("llama", "mistral", "deepseek_v3", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "gpt_oss", "glm4_moe",
               "llama4_text", "qwen3_next")
MIXTRAL_DEFAULTS = {"num_local_experts": 8, "num_experts_per_tok": 2}  # transformers' MixtralConfig defaults
QWEN3_TYPES = ("qwen3", "qwen3_moe", "qwen3_next")  # Llama's layer with QK-norm and an explicit head_dim
QKV_BIAS_TYPES = ("qwen2", "qwen2_moe")  # Llama's layer with biases on q, k and v_proj alone (ModelConfig.qkv_bias)
# heads of head_dim whatever hidden_size / heads is
OWN_HEAD_TYPES = (*QWEN3_TYPES, "gpt_oss", "glm4_moe", "llama4_text", "gemma3_text", "nemotron_h")
QWEN3_MOE_DEFAULTS = {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                      "decoder_sparse_step": 1}  # transformers' Qwen3MoeConfig defaults
QWEN2_MOE_DEFAULTS = {"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                      "decoder_sparse_step": 1, "shared_expert_intermediate_size": 5632}  # Qwen2MoeConfig's


def bundled_configs() -> list[str]:
    """Names of the configs shipped with pipesim (file stems under pipesim/model/configs/)."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.json"))


def resolve_model_config(name_or_path: str | Path) -> Path:
    """A bundled config's name (`llama3-8b`) or a path to a config.json."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    bundled = BUNDLED_DIR / f"{name_or_path}.json"
    if bundled.is_file():
        return bundled
    raise PipesimError(f"--model-config {name_or_path}: no such file or bundled config "
                       f"(bundled: {', '.join(bundled_configs())})")


def _bool(cfg: dict, name: str, default: bool, where: str) -> bool:
    value = cfg.get(name, default)
    if not isinstance(value, bool):
        raise PipesimError(f"{where}: field {name!r} must be true or false, got {value!r}")
    return value


def read_hf_config(path: str | Path) -> dict:
    """The JSON object in `path`; PipesimError (one line, naming the file) if unreadable or not an object."""
    path = Path(path)
    try:
        cfg = parse_json(path.read_text(encoding="utf-8"))  # config.json is UTF-8 (transformers writes it so)
    except OSError as e:
        raise PipesimError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise PipesimError(f"{path}: not UTF-8 (byte {e.start}: {e.reason})") from None
    except json.JSONDecodeError as e:
        raise PipesimError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except ValueError as e:  # the parser's limits: an over-long integer, a nesting too deep
        raise PipesimError(f"{path}: cannot read ({str(e).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise PipesimError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def model_from_hf(cfg: dict, *, where: str, seq: int | None = None, batch: int = ModelConfig.batch,
                  dtype: str | None = None, seed: int = 0) -> ModelConfig:
    """A ModelConfig (kind "gpt", Llama-style fields) from a parsed config.json; `where` names it in errors.

    seq: training sequence length (default max_position_embeddings; longer is refused). dtype:
    default the file's torch_dtype (one pipesim does not model is refused), bfloat16 when it names none.
    """
    cfg = with_gemma3_defaults(unwrap(cfg, where)[0])  # a Llama 4 or Gemma 3 file's language model
    for name in REQUIRED:
        required_field(cfg, name, where)
    sizes = {name: positive_field(cfg, name, where) for name in REQUIRED}
    max_seq = sizes["max_position_embeddings"]
    seq = max_seq if seq is None else seq
    if seq > max_seq:
        raise PipesimError(f"--seq {seq} is longer than {where}'s max_position_embeddings {max_seq}")
    check_keys(cfg, where=where, seq=seq)  # a key that changes the model and is not modelled: refused
    kind = code_type(cfg)  # the code the file runs: "kimi_k2" is DeepSeek-V3's (pipesim.model.hf_keys.TYPE_ALIASES)
    heads = sizes["num_attention_heads"]
    qwen3, own_heads = kind in QWEN3_TYPES, kind in OWN_HEAD_TYPES
    if kind == "gpt_oss":
        cfg = {**GPT_OSS_DEFAULTS, **cfg}  # GptOssConfig's defaults where the file is silent
    if qwen3:
        for name in ("num_key_value_heads", "head_dim"):
            required_field(cfg, name, where)
    kv_heads = positive_field(cfg, "num_key_value_heads", where) if "num_key_value_heads" in cfg else heads
    if not own_heads and sizes["hidden_size"] % heads:
        raise PipesimError(f"{where}: field 'num_attention_heads' {heads} does not divide hidden_size "
                           f"{sizes['hidden_size']}")
    if heads % kv_heads:
        raise PipesimError(f"{where}: field 'num_key_value_heads' {kv_heads} does not divide num_attention_heads "
                           f"{heads}")
    act = cfg.get("hidden_act", "silu") if kind != "gemma3_text" else "silu"  # Gemma's: gemma3_fields
    if act not in GATED_ACTS + PLAIN_ACTS + SQUARED_RELU:
        raise PipesimError(f"{where}: field 'hidden_act' {act!r} is not supported; "
                           f"choose one of {', '.join(GATED_ACTS + PLAIN_ACTS + SQUARED_RELU)}")
    if kind in GATED_TYPES and act not in GATED_ACTS:
        raise PipesimError(f"{where}: field 'hidden_act' {act!r}: a {kind} MLP is gated whatever its "
                           "activation (down(act(gate x) * up x)); pipesim models the gated MLP with silu or swish "
                           "only")
    if kind == "deepseek_v3" and "head_dim" in cfg:  # transformers' DeepseekV2/V3Config write head_dim =
        # qk_rope_head_dim (RoPE's width, which latent attention's fields give): a file it saved carries it
        rope = required_field(cfg, "qk_rope_head_dim", where)
        if positive_field(cfg, "head_dim", where) != rope:
            raise PipesimError(f"{where}: field 'head_dim' {cfg['head_dim']!r} is not qk_rope_head_dim {rope!r} "
                               "(transformers' DeepSeek configs set it so; latent attention's heads are its "
                               "qk_nope_head_dim, qk_rope_head_dim and v_head_dim)")
    elif not own_heads and "head_dim" in cfg and positive_field(cfg, "head_dim", where) * heads != sizes["hidden_size"]:
        raise PipesimError(f"{where}: field 'head_dim' {cfg['head_dim']!r} is not hidden_size / num_attention_heads "
                           f"({sizes['hidden_size']} / {heads}); pipesim needs them equal")
    if dtype is None:
        key = "torch_dtype" if "torch_dtype" in cfg else "dtype"  # transformers 4.56+ writes "dtype"
        given = cfg.get(key)  # one pipesim does not model is refused: simulated as bfloat16 its bytes would be wrong
        if given is not None and (not isinstance(given, str) or given not in DTYPE_BYTES):
            raise PipesimError(f"{where}: field {key!r} {given!r} is not a dtype pipesim models; "
                               f"choose one of {', '.join(DTYPE_BYTES)}")
        dtype = given or "bfloat16"
    dropout = cfg.get("attention_dropout", 0.0)
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout < 1:
        raise PipesimError(f"{where}: field 'attention_dropout' must be a number in [0, 1), got {dropout!r}")
    attention_bias, mlp_bias = _bool(cfg, "attention_bias", False, where), _bool(cfg, "mlp_bias", False, where)
    biases = attention_bias or mlp_bias
    if kind == "gpt_oss" and not biases:
        raise PipesimError(f"{where}: field 'attention_bias' false, but GPT-OSS's experts and router keep their biases "
                           "(GptOssExperts), which pipesim's biases (every linear) cannot say")
    tied = _bool(cfg, "tie_word_embeddings", False, where)
    moe = _mixtral_experts(cfg, sizes["intermediate_size"], act=act, biases=biases, where=where) \
        if kind == "mixtral" else None
    mla, mtp, head_width = None, 0, None
    # Qwen3's QK-norm, Qwen2's q/k/v biases (Qwen2-MoE's: its qkv_bias, true by default)
    structure = {"qk_norm": qwen3, "qkv_bias": kind in QKV_BIAS_TYPES and _bool(cfg, "qkv_bias", True, where)}
    if kind == "deepseek_v3":
        moe, mla, mtp = deepseek_experts(cfg, where), deepseek_attention(cfg, where), mtp_modules(cfg, where)
    if kind == "glm4_moe":  # its biases are q, k and v's (qkv_bias): every linear's are refused there
        glm = glm4_moe_fields(cfg, biases=biases, where=where)
        moe, mtp, head_width, biases = glm.pop("moe"), glm.pop("mtp_layers"), glm.pop("head_width"), False
        structure = glm
    if qwen3:
        head_width = _qwen3_attention(cfg, biases=biases, where=where)
    if kind in QKV_BIAS_TYPES and biases:
        how = "Qwen2Attention builds them whatever the file says" if kind == "qwen2" else \
            "Qwen2MoeAttention builds them by its qkv_bias"
        raise PipesimError(f"{where}: field 'attention_bias' or 'mlp_bias' is true, but a {kind} layer's biases sit on "
                           f"q, k and v alone ({how}), o_proj and the MLP are bias-free")
    if kind == "qwen3_moe":
        moe = _qwen3_experts(cfg, sizes["num_hidden_layers"], where)
    if kind in ("qwen2_moe", "qwen3_next"):  # Qwen3-Next's layers: pipesim.model.hf_qwen3_next
        moe = _qwen2_moe_experts(cfg, sizes["num_hidden_layers"], where)
        structure.update(qwen3_next_fields(cfg, layers=sizes["num_hidden_layers"], where=where)
                         if kind == "qwen3_next" else {})
    if kind == "llama4_text":
        llama4 = llama4_fields(cfg, sizes["num_hidden_layers"], where)
        moe, head_width, sizes["intermediate_size"] = llama4.pop("moe"), llama4.pop("head_width"), \
            llama4.pop("ffn_hidden")
        structure = {**structure, **llama4}
    if kind == "gemma3_text":
        gemma = gemma3_fields(cfg, biases=biases, where=where)
        head_width = gemma.pop("head_width")
        structure = {**structure, **gemma}
    if kind == "nemotron_h":  # a hybrid model (pipesim.model.hf_nemotron_h)
        hybrid = nemotron_h_fields(cfg, layers=sizes["num_hidden_layers"], hidden=sizes["hidden_size"], where=where)
        moe, head_width = hybrid.pop("moe"), hybrid.pop("head_width")
        structure = {**structure, **hybrid}
    if kind == "gpt_oss":
        head_width = positive_field(cfg, "head_dim", where)
        moe = gpt_oss_experts(cfg, sizes["intermediate_size"], router_loss=_hf_router_loss(cfg, where), where=where)
    window = read_window({k: v for k, v in cfg.items() if k != "layer_types" or kind != "qwen3_next"}, kind,
                         sizes["num_hidden_layers"], where)
    rope_mscale = yarn_attention_factor(cfg, where)
    if kind == "gemma3_text":  # the full layers' rotary, and the windowed layers' own base
        rope_keys, window_theta = gemma3_rope(cfg, where)
        rotary = replace(rotary_from_config(rope_keys, where) or Rotary(), window_theta=window_theta)
    else:
        rotary = rotary_from_config(cfg, where)
    eps = structure.pop("norm_eps", None) or next(
        (cfg[k] for k in ("rms_norm_eps", "layer_norm_eps", "norm_eps") if cfg.get(k) is not None),
        ModelConfig.norm_eps)
    try:
        activation = structure.pop("activation", "swiglu" if act in GATED_ACTS else "relu2" if act in SQUARED_RELU
                                   else "gelu")
        return ModelConfig(kind="gpt", hidden=sizes["hidden_size"], layers=sizes["num_hidden_layers"], heads=heads,
                           seq=seq, vocab=sizes["vocab_size"], batch=batch, dtype=dtype, seed=seed,
                           kv_heads=kv_heads, ffn_hidden=sizes["intermediate_size"], activation=activation,
                           norm="rmsnorm" if "rms_norm_eps" in cfg or own_heads else "layernorm",  # norm_eps: LayerNorm
                           dropout=dropout > 0, biases=biases, positions=structure.pop("positions", "rope"),
                           tied_embeddings=tied, moe=moe, mla=mla, mtp_layers=mtp, head_width=head_width,
                           window=window, attention_sinks=kind == "gpt_oss", rope_mscale=rope_mscale,
                           rotary=rotary, norm_eps=eps, **structure)
    except PipesimError as e:
        raise PipesimError(f"{where}: {e}") from None


def _mixtral_experts(cfg: dict, width: int, *, act: str, biases: bool, where: str) -> MoeConfig:
    """Mixtral's MoeConfig: every layer's MLP is `num_local_experts` SwiGLU experts of width `intermediate_size`,
    `num_experts_per_tok` per token, no shared expert (transformers' MixtralSparseMoeBlock). Refuses what that
    block cannot be: a non-SiLU activation (its experts stay gated: a GeGLU is not pipesim's two-matrix MLP) and
    biases (its linears are built with bias=False whatever the file says)."""
    if act not in GATED_ACTS:
        raise PipesimError(f"{where}: field 'hidden_act' {act!r}: Mixtral's experts are gated (w2(act(w1 x) * w3 x)), "
                           f"which pipesim models with {' or '.join(GATED_ACTS)} only")
    if biases:
        raise PipesimError(f"{where}: field 'attention_bias' or 'mlp_bias' is true, but Mixtral's linears have no "
                           "biases (transformers builds them bias-free)")
    counts = {name: positive_field(cfg, name, where) if name in cfg else default
              for name, default in MIXTRAL_DEFAULTS.items()}
    experts, top_k = counts["num_local_experts"], counts["num_experts_per_tok"]
    if top_k > experts:
        raise PipesimError(f"{where}: field 'num_experts_per_tok' {top_k} is more than num_local_experts {experts}")
    # MixtralSparseMoeBlock: softmax over all E, top-k, then the k weights divided by their sum
    return MoeConfig(experts=experts, top_k=top_k, expert_ffn=width, renormalize=True,
                     hf_router_loss=_hf_router_loss(cfg, where))


def _hf_router_loss(cfg: dict, where: str) -> float:
    """The router loss a Mixtral or Qwen3-MoE file trains under transformers' own code: router_aux_loss_coef (0.001,
    MixtralConfig's and Qwen3MoeConfig's default, when absent) when output_router_logits is true
    (MixtralForCausalLM.forward adds coef x load_balancing_loss_func over every layer's router logits at once), else
    none."""
    on = cfg.get("output_router_logits", False)
    if not isinstance(on, bool):
        raise PipesimError(f"{where}: field 'output_router_logits' must be true or false, got {on!r}")
    coef = cfg.get("router_aux_loss_coef", 0.001)
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not 0 <= coef < float("inf"):
        raise PipesimError(f"{where}: field 'router_aux_loss_coef' must be a finite number >= 0, got {coef!r}")
    return float(coef) if on else 0.0


def _qwen3_attention(cfg: dict, *, biases: bool, where: str) -> int:
    """Qwen3Attention's head width: `head_dim` (required; q_proj h -> heads x head_dim, k/v_proj h -> kv heads x
    head_dim, o_proj heads x head_dim -> h, q_norm and k_norm over head_dim). Refuses biases: Qwen3's attention_bias
    puts them on q, k, v and o only (its MLP and experts are built bias-free), which ModelConfig.biases cannot say."""
    if biases:
        raise PipesimError(f"{where}: field 'attention_bias' or 'mlp_bias' is true, but Qwen3's biases would sit on "
                           "q, k, v and o only (its MLP is built bias-free), which pipesim's biases (every linear) "
                           "cannot say")
    return positive_field(cfg, "head_dim", where)


def _qwen3_experts(cfg: dict, layers: int, where: str) -> MoeConfig | None:
    """Qwen3MoeSparseMoeBlock's layout (None when no layer has one: a dense model): `num_experts` SwiGLU experts of
    width `moe_intermediate_size`, `num_experts_per_tok` per token, a bias-free softmax top-k router, no shared
    expert, on layer l when l is not in `mlp_only_layers` and (l + 1) % `decoder_sparse_step` == 0. MoeConfig places
    experts on l >= dense_layers with (l + 1) % every == 0: `mlp_only_layers` is read as dense first layers when that
    gives the same layers, and refused otherwise."""
    given = {name: cfg.get(name, default) for name, default in QWEN3_MOE_DEFAULTS.items()}
    experts = count_field(given, "num_experts", where)
    top_k, width, step = (positive_field(given, name, where)
                          for name in ("num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"))
    only = cfg.get("mlp_only_layers")
    only = [] if only is None else only
    if not isinstance(only, list) or any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in only):
        raise PipesimError(f"{where}: field 'mlp_only_layers' must be a list of layer indices, got {only!r}")
    sparse = [layer for layer in range(layers) if layer not in only and (layer + 1) % step == 0]
    if not experts or not sparse:
        return None
    if top_k > experts:
        raise PipesimError(f"{where}: field 'num_experts_per_tok' {top_k} is more than num_experts {experts}")
    dense = max((layer + 1 for layer in only if layer < layers and (layer + 1) % step == 0), default=0)
    renormalize = cfg.get("norm_topk_prob", False)  # Qwen3MoeConfig's default
    if not isinstance(renormalize, bool):
        raise PipesimError(f"{where}: field 'norm_topk_prob' must be true or false, got {renormalize!r}")
    moe = MoeConfig(experts=experts, top_k=top_k, expert_ffn=width, dense_layers=dense, every=step,
                    renormalize=renormalize, hf_router_loss=_hf_router_loss(cfg, where))
    if [layer for layer in range(layers) if moe.is_moe_layer(layer)] != sparse:
        raise PipesimError(f"{where}: field 'mlp_only_layers' {only}: pipesim places dense MLPs on the first layers "
                           "only (then every decoder_sparse_step-th layer has experts); these dense layers are not "
                           "first")
    return moe


def unwrap(cfg: dict, where: str) -> tuple[dict, tuple[str, ...], tuple[str, ...]]:
    """A wrapper file's language model (Llama 4's and Gemma 3's text_config: pipesim.model.hf_llama4, hf_gemma) with
    the wrapper's keys read and ignored; any other file unchanged, with none."""
    cfg, read, ignored = unwrap_llama4(cfg, where)
    if read:
        return cfg, read, ignored
    return unwrap_gemma3(cfg, where)


def _qwen2_moe_experts(cfg: dict, layers: int, where: str) -> MoeConfig | None:
    """Qwen2MoeSparseMoeBlock: Qwen3-MoE's routed experts and placement (`_qwen3_experts`, Qwen2MoeConfig's defaults:
    60 experts of 1408, 4 per token) and a shared SwiGLU expert of width `shared_expert_intermediate_size` (5632)
    whose output is multiplied by sigmoid(shared_expert_gate(x)), a linear h -> 1 (MoeConfig.shared_gate); none when
    that width is 0."""
    cfg = {**QWEN2_MOE_DEFAULTS, **cfg}
    moe = _qwen3_experts(cfg, layers, where)
    shared = count_field(cfg, "shared_expert_intermediate_size", where)
    if moe is None or not shared:
        return moe
    return replace(moe, shared_experts=1, shared_ffn=shared, shared_gate=True)


def hf_key_report(name_or_path: str | Path, *, seq: int | None = None) -> KeyReport:
    """The keys of `--model-config`'s file that pipesim reads and those it ignores (for `--json`)."""
    path = resolve_model_config(name_or_path)
    cfg, wrapper_read, wrapper_ignored = unwrap(read_hf_config(path), str(path))
    max_seq = with_gemma3_defaults(cfg).get("max_position_embeddings")  # the file's keys alone are reported
    seq = seq if seq is not None else max_seq if isinstance(max_seq, int) else 0
    report = check_keys(cfg, where=str(path), seq=seq)
    return KeyReport(wrapper_read + report.read, wrapper_ignored + report.ignored)


def load_hf_config(name_or_path: str | Path, *, seq: int | None = None, batch: int = ModelConfig.batch,
                   dtype: str | None = None, seed: int = 0) -> ModelConfig:
    """`--model-config`: a bundled name or a config.json path, read into a ModelConfig (see `model_from_hf`)."""
    path = resolve_model_config(name_or_path)
    return model_from_hf(read_hf_config(path), where=str(path), seq=seq, batch=batch, dtype=dtype, seed=seed)


__all__ = ["bundled_configs", "hf_key_report", "load_hf_config", "model_from_hf", "read_hf_config",
           "resolve_model_config"]
