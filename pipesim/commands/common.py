"""Shared flags: one meaning for --stages, --microbatches, --model, --json, ... everywhere."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

import schedules
from pipesim.commands.arg_types import bounded_int, positive_int
from pipesim.commands.expert_args import (
    MOE_DEFAULTS,
    MOE_FLAGS,
    ROUTING_FLAGS,
    moe_config,
    with_expert_flags,
    with_routing,
)
from pipesim.commands.latent_args import LATENT_FLAGS, add_latent_args, latent_norms, with_latent_flags
from pipesim.commands.llama4_args import LLAMA4_FLAGS, add_llama4_args, with_llama4_flags
from pipesim.commands.structure_args import (
    ROTARY_FLAGS,
    WINDOW_FLAGS,
    add_structure_args,
    flag_words,
    with_rotary,
    with_window,
)
from pipesim.errors import PipesimError
from pipesim.ir import torch_csv
from pipesim.ir.schedule import Schedule
from pipesim.model.config import ACTIVATIONS, ModelConfig
from pipesim.model.hf_config import bundled_configs, hf_key_report, load_hf_config
from pipesim.model.moe import BALANCE_TYPES, DROP_POLICIES
from pipesim.outputs import write_text


def int_list(text: str) -> list[int]:
    """`4,8,16` -> [4, 8, 16] (each positive)."""
    return [positive_int(t) for t in text.split(",") if t.strip()]


def layer_split_list(text: str) -> list[int]:
    """`0,2,2,0` -> [0, 2, 2, 0]: layers per chunk (>= 0; `split_layers` says which may be 0)."""
    return [bounded_int(t, 0) for t in text.split(",") if t.strip()]


DEFAULT_STAGES, DEFAULT_MICROBATCHES = 4, 8  # a registered schedule's -p and -m when not typed (a CSV has its own)


def add_schedule_args(parser: argparse.ArgumentParser, *, microbatch_size: bool = False) -> None:
    """NAME (or --from-csv FILE), --stages P, --microbatches M, --virtual V.

    -p and -m default to None, so that a typed one can be checked against a CSV's own counts; a NAME takes
    DEFAULT_STAGES and DEFAULT_MICROBATCHES in their place (`load_schedule`).
    microbatch_size: also --microbatch-size N, the other spelling of M (m = batch / (dp x N)), which the command
    resolves (`SimSetup.microbatches`).
    """
    parser.add_argument("name", nargs="?", metavar="NAME",
                        help="registered schedule (see `pipesim schedule --list`)")
    parser.add_argument("--stages", "-p", type=positive_int, default=None, metavar="P",
                        help=f"pipeline ranks (default {DEFAULT_STAGES}; a --from-csv schedule's own)")
    parser.add_argument("--microbatches", "-m", type=positive_int, default=None, metavar="M",
                        help=f"microbatches per step (default {DEFAULT_MICROBATCHES}; a --from-csv schedule's own)")
    if microbatch_size:
        parser.add_argument("--microbatch-size", type=positive_int, default=None, metavar="N",
                            help="sequences (samples) per microbatch, instead of -m: m = batch / (dp x N)")
    parser.add_argument("--virtual", "-v", type=positive_int, default=None, metavar="V",
                        help="model chunks per rank (interleaved schedules; default the schedule's)")
    parser.add_argument("--from-csv", metavar="FILE",
                        help="a torch.distributed.pipelining schedule CSV instead of NAME")


MAX_STAGE_MICROBATCHES = 1 << 20  # stages x microbatches (p x v x m) of one schedule: ~30 s to simulate
MAX_CHECKED_STAGE_MICROBATCHES = 1 << 17  # the same for `pipesim schedule`, whose full check is ~10x slower


def check_schedule_size(p: int, v: int, m: int, limit: int = MAX_STAGE_MICROBATCHES) -> None:
    """Refuse a schedule too large to build in reasonable time and memory, before building it."""
    if p * v * m > limit:
        raise PipesimError(f"{p} ranks x {v} chunks x {m} microbatches = {p * v * m} stage-microbatches, above "
                           f"the bound of {limit}; make -p, -v or -m smaller")


def load_schedule(args: argparse.Namespace, *, validate: bool = True,
                  limit: int = MAX_STAGE_MICROBATCHES) -> Schedule:
    """The schedule named by NAME or --from-csv, validated."""
    from pipesim.ir.schedule_check import validate as check  # networkx: kept out of `pipesim`'s start-up

    if args.from_csv and args.name:
        raise PipesimError("give a schedule NAME or --from-csv FILE, not both")
    if args.from_csv:
        sched = torch_csv.load(args.from_csv)
        torch_csv.check_csv_counts(sched, args.from_csv, stages=args.stages, microbatches=args.microbatches,
                                   virtual=getattr(args, "virtual", None))
    elif args.name:
        p = DEFAULT_STAGES if args.stages is None else args.stages
        m = DEFAULT_MICROBATCHES if args.microbatches is None else args.microbatches
        v = args.virtual if args.virtual is not None else schedules.spec(args.name).default_virtual
        check_schedule_size(p, v, m, limit)
        sched = schedules.build(args.name, p, m, args.virtual)
    else:
        raise PipesimError(f"name a schedule ({', '.join(schedules.names())}) or give --from-csv FILE")
    if validate:
        check(sched)
    return sched


def add_model_args(parser: argparse.ArgumentParser, *, default: str | None = "mlp") -> None:
    """--model mlp|gpt with --hidden, --layers, --heads, --seq, --vocab, --batch, --dtype, --seed.

    Sizes default to None here and to ModelConfig's defaults in `model_config`, so that a value given
    on the command line can be told from the default (it overrides a --model-config file's).
    """
    d = ModelConfig()
    g = parser.add_argument_group("model")
    g.add_argument("--model", type=_model_name, default=None, metavar="{mlp,gpt,moe,MODULE:FACTORY}",
                   help=f"model to cost or train (default {default}); moe: the GPT with mixture-of-experts MLPs "
                        "(docs/moe.md); run and simulate also take your own: MODULE:FACTORY or FILE.py:FACTORY "
                        "(docs/your_model.md)")
    parser.set_defaults(model_default=default)
    g.add_argument("--hidden", type=positive_int, default=None, help=f"width / d_model (default {d.hidden})")
    g.add_argument("--layers", type=positive_int, default=None, help=f"layers or blocks (default {d.layers})")
    g.add_argument("--heads", type=positive_int, default=None, help=f"attention heads, gpt (default {d.heads})")
    g.add_argument("--seq", type=positive_int, default=None,
                   help=f"sequence length, gpt (default {d.seq}; with --model-config its max_position_embeddings)")
    g.add_argument("--vocab", type=positive_int, default=None, help=f"vocabulary, gpt (default {d.vocab})")
    g.add_argument("--batch", type=positive_int, default=None, help=f"global batch per step (default {d.batch})")
    g.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help=f"parameter and activation dtype (default {d.dtype}; with --model-config the file's)")
    g.add_argument("--seed", type=int, default=None,
                   help=f"pipesim run: the parameters' and synthetic data's seed (default {d.seed})")
    e = parser.add_argument_group("experts: --model moe's, or over a mixture-of-experts --model-config's "
                                  "(Megatron-core's flag names)")
    e.add_argument("--num-experts", type=positive_int, default=None, metavar="E",
                   help=f"routed experts per MoE layer (default {MOE_DEFAULTS['experts']})")
    e.add_argument("--moe-router-topk", type=positive_int, default=None, metavar="K",
                   help=f"experts per token (default {MOE_DEFAULTS['top_k']})")
    e.add_argument("--moe-ffn-hidden-size", type=positive_int, default=None, metavar="F",
                   help="width of one routed expert (default the dense MLP's: --ffn-hidden, else 4 x --hidden)")
    e.add_argument("--moe-shared-expert-intermediate-size", type=positive_int, default=None, metavar="S",
                   help="width of the shared expert every token passes through (default none)")
    e.add_argument("--moe-shared-expert-gate", action="store_const", const=True, default=None,
                   help="the shared expert's output times a sigmoid gate of the token (Qwen2-MoE's; Megatron-core "
                        ">= 0.16)")
    e.add_argument("--moe-layer-freq", default=None, metavar="N|LIST",
                   help="which layers have experts, Megatron-core's spelling: 1 (every layer, the default), or one "
                        "0/1 per layer such as '([0]*3+[1]*58)'; pipesim places them after the first dense layers "
                        "on every N-th (docs/moe.md)")
    add_latent_args(parser)
    add_llama4_args(parser)


def _model_name(text: str) -> str:
    """mlp, gpt, or a factory MODULE:FACTORY / FILE.py:FACTORY (pipesim.cost.user_model_costs; checked where it is
    read)."""
    if text in ("mlp", "gpt", "moe") or ":" in text:
        return text
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose mlp, gpt, moe, MODULE:FACTORY or "
                                     "FILE.py:FACTORY)")


def add_transformer_args(parser: argparse.ArgumentParser) -> None:
    """The transformer's structure (`add_structure_group`) and, for the cost model, the experts' routing."""
    g = add_structure_group(parser)
    g.add_argument("--moe-load-imbalance", type=float, default=None, metavar="X",
                   help="mixture of experts, dropless: the most-loaded expert's tokens over the mean (default 1: "
                        "balanced); the slowest rank computes and receives that many more")
    add_router_args(g)


def add_router_args(g: argparse._ArgumentGroup) -> None:
    """How a mixture of experts' router trains (pipesim.model.moe), for `simulate` and `run`: Megatron-core's
    capacity factor and token-drop policy, load-balancing loss and z-loss."""
    g.add_argument("--moe-expert-capacity-factor", type=float, default=None, metavar="CF",
                   help="mixture of experts: each expert keeps at most CF x the mean of its tokens (per sequence, per "
                        "tp rank's part of it, in `pipesim run`), the rest dropped; the cost model pads buffers to it "
                        "(Megatron-core's flag with --moe-pad-expert-input-to-capacity) (default: dropless)")
    g.add_argument("--moe-token-drop-policy", choices=DROP_POLICIES, default=None,
                   help="mixture of experts with a capacity factor: an expert over capacity keeps its "
                        "highest-probability tokens (probs, Megatron-core's default) or its first ones (position)")
    g.add_argument("--moe-router-load-balancing-type", choices=BALANCE_TYPES, default=None,
                   help="mixture of experts: the load-balancing loss over each microbatch's tokens (aux_loss, "
                        "Megatron-core's default), each sequence's (seq_aux_loss) or none; `pipesim run` trains it, "
                        "the cost model counts nothing for it")
    g.add_argument("--moe-aux-loss-coeff", type=float, default=None, metavar="C",
                   help="mixture of experts: the load-balancing loss's coefficient (default 0: no loss)")
    g.add_argument("--moe-z-loss-coeff", type=float, default=None, metavar="C",
                   help="mixture of experts: the router z-loss's coefficient, C x the mean squared log-sum-exp of "
                        "the router's logits (ST-MoE; default: none); `pipesim run` trains it")


def add_structure_group(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Llama-style structure, one model for the cost model and the executor: --model-config, --kv-heads, --ffn-hidden,
    --activation and the structure flags (pipesim.commands.structure_args)."""
    g = parser.add_argument_group("transformer structure")
    g.add_argument("--model-config", metavar="FILE|NAME",
                   help="a Hugging Face config.json, or a bundled one: " + ", ".join(bundled_configs())
                        + " (implies a transformer; size flags given too override the file's, and the expert flags a "
                        "mixture of experts')")
    g.add_argument("--kv-heads", type=positive_int, default=None,
                   help="key/value heads, grouped-query attention (default: --heads)")
    g.add_argument("--ffn-hidden", type=positive_int, default=None, help="MLP width (default 4 x --hidden)")
    g.add_argument("--activation", choices=ACTIVATIONS, default=None,
                   help="MLP: gelu or relu2 (two matrices), or swiglu or geglu (gate, up, down; geglu: Gemma's "
                   "gated tanh GeLU) (default gelu)")
    add_structure_args(g)
    return g


SIZE_FLAGS = ("hidden", "layers", "heads", "seq", "vocab", "batch", "dtype")  # ModelConfig field = flag name
# ModelConfig field = argparse destination; typed as `flag_words` says
STRUCTURE_FLAGS = ("kv_heads", "ffn_hidden", "activation", "norm", "positions", "biases", "dropout", "qk_norm",
                   "head_width", "tied_embeddings", "attention_sinks", "norm_eps", "qkv_bias")
# every flag that shapes pipesim's model (the window flags make ModelConfig.window together: `with_window`; the
# rotary flags ModelConfig.rotary: `with_rotary`)
MODEL_FLAGS = (*SIZE_FLAGS, *STRUCTURE_FLAGS, *WINDOW_FLAGS, *ROTARY_FLAGS, *MOE_FLAGS, *ROUTING_FLAGS, *LATENT_FLAGS,
               *LLAMA4_FLAGS)


def given_model_flags(args: argparse.Namespace, *, skip: tuple[str, ...] = ()) -> list[tuple[str, object]]:
    """(--flag, value) of each model flag the command line gave (MODEL_FLAGS less `skip`), in that order, value None
    for a switch: what a `--cost` run refuses, a calibration mode does not use, and a plan's export must type again
    (`model_flag_words`)."""
    out = []
    for name in MODEL_FLAGS:
        if name not in skip and getattr(args, name, None) is not None:
            words = flag_words(name, getattr(args, name))
            out.append((words[0], words[1] if len(words) > 1 else None))
    return out


def model_flag_words(args: argparse.Namespace, *, skip: tuple[str, ...] = ()) -> list[str]:
    """`given_model_flags` as the words a command line types."""
    return [word for flag, value in given_model_flags(args, skip=skip)
            for word in ([flag] if value is None else [flag, str(value)])]


def seed_of(args: argparse.Namespace) -> int:
    """--seed, or ModelConfig's default when not given (None tells a typed seed apart: a simulation refuses it)."""
    return ModelConfig.seed if getattr(args, "seed", None) is None else args.seed


def model_config(args: argparse.Namespace) -> ModelConfig:
    """The model of the command line: --model-config's file (with the flags given overriding it), or the flags."""
    given = {k: getattr(args, k) for k in SIZE_FLAGS + STRUCTURE_FLAGS if getattr(args, k, None) is not None}
    if args.model and ":" in args.model:  # a factory: read by `pipesim run` and `pipesim simulate` (user_model_config)
        raise PipesimError(f"--model {args.model}: a model factory is read by `pipesim run` and `pipesim simulate`")
    source = getattr(args, "model_config", None)
    if source:
        if args.model in ("mlp", "moe"):
            raise PipesimError(f"--model-config describes the model, experts or not; drop --model {args.model}")
        base = load_hf_config(source, seq=given.get("seq"), batch=given.get("batch", ModelConfig.batch),
                              dtype=given.get("dtype"), seed=seed_of(args))
        given = latent_norms(args, given, base.mla is not None)
        # typed learned positions replace the file's rotary embedding, its frequencies with it
        rotary = {"rotary": None} if given.get("positions", "rope") != "rope" else {}
        model = _with_composite_flags(replace(base, **given, **rotary), args, source)
        framework = getattr(args, "framework", None)
        if (model.hybrid or model.linear_attention) and framework not in (None, "megatron-core", "nemo"):
            what = "hybrid (Mamba)" if model.hybrid else "linear-attention (Gated DeltaNet)"
            raise PipesimError(f"--framework {framework} has no {what} model: {source} runs on Megatron-core "
                               "(--framework megatron-core or nemo)")
        moe = model.moe
        if "ffn_hidden" in given and moe is not None and all(map(moe.is_moe_layer, range(model.layers))):
            raise PipesimError(f"--ffn-hidden sizes a dense MLP, and every layer of {source} has experts "
                               "(--moe-ffn-hidden-size sizes them)")
        return model
    kind = args.model or getattr(args, "model_default", None) or "mlp"
    moe_given = [name for name in MOE_FLAGS if getattr(args, name, None) is not None]
    if kind != "mlp":
        given = latent_norms(args, given, False)
    if kind == "moe":
        base = ModelConfig(kind="gpt", seed=seed_of(args), **given)
        return _with_composite_flags(replace(base, moe=moe_config(args, base.hidden, base.layers)), args)
    if moe_given:
        raise PipesimError(f"--{moe_given[0].replace('_', '-')} needs --model moe")
    if kind == "mlp":  # an MLP has no heads, sequence or vocabulary: those flags would size nothing
        typed = {**given, **{name: getattr(args, name) for name in WINDOW_FLAGS
                             if getattr(args, name, None) is not None}}
        typed.update({name: getattr(args, name) for name in ROTARY_FLAGS if getattr(args, name, None) is not None})
        typed.update({name: getattr(args, name) for name in (*LATENT_FLAGS, *LLAMA4_FLAGS)
                      if getattr(args, name, None) is not None})
        for name in ("heads", "seq", "vocab", *STRUCTURE_FLAGS, *WINDOW_FLAGS, *ROTARY_FLAGS, *LATENT_FLAGS,
                     *LLAMA4_FLAGS):
            if name in typed:
                raise PipesimError(f"{flag_words(name, typed[name])[0]} needs a transformer (--model gpt or "
                                   "--model-config)")
    return _with_composite_flags(ModelConfig(kind=kind, seed=seed_of(args), **given), args)


def _with_composite_flags(model: ModelConfig, args: argparse.Namespace, source: str | None = None) -> ModelConfig:
    """The flags that make a field together, over `model`: the window's, the rotary frequencies', (over a
    --model-config `source`) the experts', the routing's, DeepSeek-V3's pieces' and Llama 4's."""
    model = with_rotary(with_window(model, args), args)
    if source is not None:
        model = with_expert_flags(model, args, source)
    return with_llama4_flags(with_latent_flags(with_routing(model, args), args, source), args)


def model_config_json(args: argparse.Namespace) -> dict | None:
    """--json's account of --model-config's file: the keys read and those ignored as changing nothing modelled."""
    source = getattr(args, "model_config", None)
    if not source:
        return None
    report = hf_key_report(source, seq=getattr(args, "seq", None))
    return {"source": source, "read": list(report.read), "ignored": list(report.ignored)}


def user_model_config(args: argparse.Namespace) -> ModelConfig:
    """With --model MODULE:FACTORY, what still applies of pipesim's model flags: --batch and --seed."""
    sizes = [k for k in (*SIZE_FLAGS, *STRUCTURE_FLAGS, *WINDOW_FLAGS, *ROTARY_FLAGS, *LATENT_FLAGS, *LLAMA4_FLAGS)
             if k != "batch" and getattr(args, k, None) is not None]
    if sizes or getattr(args, "model_config", None):
        flag = flag_words(sizes[0], getattr(args, sizes[0]))[0] if sizes else "--model-config"
        raise PipesimError(f"{flag} sizes pipesim's own models; --model {args.model} defines its own layers")
    return ModelConfig(batch=args.batch or ModelConfig.batch, seed=seed_of(args))


INPUT_FLAGS = (("--model-config", "model_config"), ("--hardware", "hardware"), ("--from-csv", "from_csv"),
               ("--tp-comm-overlap-cfg", "tp_comm_overlap_cfg"))  # flags that may name a file the command reads


def input_files(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(flag, path) of the files simulate, sweep and plan read (a preset's or bundled config's name is no file)."""
    job = getattr(args, "job_file", None)  # --from-megatron / --from-torchtitan's file, read before argparse (cli)
    return [(flag, getattr(args, dest, None)) for flag, dest in INPUT_FLAGS] + ([job] if job else [])


def add_output_args(parser: argparse.ArgumentParser, *, trace: bool = True) -> None:
    """--json [FILE] (stdout when no FILE) and --trace FILE (Perfetto JSON)."""
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                        help="write the result as JSON to FILE, or to stdout without FILE")
    if trace:
        parser.add_argument("--trace", metavar="FILE", help="write a Perfetto/Chrome trace (JSON) to FILE")


def json_text(data: dict) -> str:
    """The JSON text of a result: seconds and bytes, no formatting."""
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def emit_json(target: str | None, data: dict) -> None:
    """Write `data` to stdout ('-') or a file (atomically: pipesim.outputs)."""
    if target is None:
        return
    if target == "-":
        sys.stdout.write(json_text(data))
        return
    write_text(target, json_text(data))
