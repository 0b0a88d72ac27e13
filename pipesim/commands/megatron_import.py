"""`pipesim simulate --from-megatron ARGS`: a Megatron-LM launch (pretrain_gpt.py's arguments) read as pipesim's flags.

Megatron-LM users describe a run as pretrain_gpt.py's argument list; `pipesim plan --framework megatron-core` writes
one (pipesim.plan.exports.megatron_args). This module turns such a file (pipesim.commands.megatron_args reads it,
pipesim.commands.megatron_flags classifies every flag, pipesim.commands.megatron_model reads the model) into
`pipesim simulate` flags under `--framework megatron-core`, placed before the flags typed after it, so that a typed
flag wins and every flag of the file moves off Megatron-core's defaults exactly as the same flag typed would. Names,
defaults and checks are NVIDIA/Megatron-LM v0.15.3's megatron/training/arguments.py (validate_args): data parallel =
WORLD_SIZE / (tp x pp x cp), WORLD_SIZE torchrun's --nproc-per-node x --nnodes, else the GPUs of `--hardware` (with
`--nodes`, `--nvlink-domain`); the global batch a whole number of micro x dp.
"""

from __future__ import annotations

from pipesim.commands.job_import import keep_flags, split_command, typed_rest, world_size
from pipesim.commands.megatron_args import MegatronArgs
from pipesim.commands.megatron_model import model_flags
from pipesim.commands.torchtitan_pipeline import model_layers
from pipesim.errors import PipesimError
from pipesim.model.megatron_layout import LAYOUT, parse_layout
from pipesim.model.muon_options import OPTIMIZERS
from pipesim.model.options import TRANSFORMER_IMPLS

FLAG = "--from-megatron"
CP_TYPES = {"p2p": "p2p", "a2a": "a2a", "allgather": "all_gather"}  # Megatron's --cp-comm-type -> pipesim's
# TE's attention backends (megatron/core/transformer/enums.py AttnBackend) -> pipesim's --attention: flash is TE's
# FlashAttention-2 backend, fused cuDNN's fused attention (flash-like), unfused the scores materialised
BACKENDS = {"flash": "flash2", "fused": "flash", "unfused": "eager", "auto": None}
# Megatron's five fusions, pipesim's --no-kernel-fusion turns them off at once
FUSIONS = ("--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion",
           "--no-bias-dropout-fusion", "--no-rope-fusion")
PASS_AS_TYPED = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                 "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                 "--overlap-p2p-communication-warmup-flush", "--no-overlap-p2p-communication", "--overlap-grad-reduce",
                 "--ddp-bucket-size", "--overlap-param-gather", "--tp-comm-overlap", "--tp-comm-overlap-cfg",
                 "--no-gradient-accumulation-fusion", "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl",
                 "--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16", "--fp8-param-gather",
                 "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16",
                 "--fp4-format", "--fp4-recipe", "--fp4-param-gather", "--use-precision-aware-optimizer",
                 "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype", "--activation-func-fp8-input-store",
                 "--cuda-graph-impl", "--moe-enable-deepep", "--moe-deepep-num-sms", "--moe-flex-dispatcher-backend",
                 "--moe-hybridep-num-sms", "--muon-num-ns-steps", "--muon-no-split-qkv", "--muon-use-nesterov",
                 "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
                 "--mtp-num-layers", "--moe-router-enable-expert-bias", "--moe-router-num-groups",
                 "--moe-router-group-topk", "--moe-shared-expert-overlap", "--qk-l2-norm", "--no-rope-freq",
                 "--moe-router-score-function", "--moe-apply-probs-on-input")


def megatron_argv(path: str, argv: list[str]) -> tuple[str, list[str]]:
    """(schedule; `pipesim simulate` flags) of Megatron-LM launch file `path`; `argv` the rest of the command line
    (its --hardware and --nodes give WORLD_SIZE without torchrun's counts; its own model replaces the file's)."""
    where = f"{FLAG} {path}"
    a = MegatronArgs(path, where)
    typed = typed_rest(argv)
    out = ["--framework", "megatron-core"]
    tp, pp, cp = (a.number(f"--{n}-parallel-size", 1) if over is None else over  # a typed degree wins: dp follows
                  for n, over in (("tensor-model", typed.tp), ("pipeline-model", typed.stages), ("context", typed.cp)))
    world = a.world if a.world is not None else world_size(typed)
    if world % (tp * pp * cp):
        raise PipesimError(f"{where}: {world} GPUs are not a multiple of tp x pp x cp = {tp * pp * cp} (Megatron "
                           "asserts it)")
    dp = world // (tp * pp * cp)
    _only(a, "--distributed-backend", "nccl", "pipesim times NCCL's collectives")
    _only(a, "--num-distributed-optimizer-instances", "1", "one distributed-optimizer instance is modelled")
    _only(a, "--empty-unused-memory-level", "0", "emptying the CUDA cache each step is not modelled")
    optimizer = a.text("--optimizer", "adam")
    if optimizer not in OPTIMIZERS:
        raise PipesimError(f"{where}: --optimizer {optimizer}: pipesim models {', '.join(OPTIMIZERS)}")
    if optimizer != "adam":  # Muon: its choices that would change its step, at their defaults
        _only(a, "--muon-tp-mode", "blockwise", "pipesim times each tp shard orthogonalized alone (blockwise)")
        _only(a, "--muon-fp32-matmul-prec", "medium", "pipesim times the Newton-Schulz GEMMs in bfloat16 (medium)")
        _only(a, "--muon-scalar-optimizer", "adam", "pipesim steps Muon's other tensors with Adam")
        out += ["--optimizer", optimizer]
    impl = a.text("--transformer-impl", "transformer_engine")
    if impl not in TRANSFORMER_IMPLS:
        raise PipesimError(f"{a.where}: --transformer-impl {impl}: pipesim times {' or '.join(TRANSFORMER_IMPLS)}")
    out += ["--transformer-impl", impl] if impl != "transformer_engine" else []
    _only(a, "--main-grads-dtype", "fp32", "give --grad-reduce-in-bf16 for bfloat16 main gradients")
    _only(a, "--microbatch-group-size-per-virtual-pipeline-stage", str(pp), "pipesim's interleaved 1F1B groups pp "
          "microbatches (Megatron's default)")
    out += ["--tp", str(tp), "--dp", str(dp)]
    if cp > 1:
        out += ["--cp", str(cp), "--cp-comm-type", _cp_type(a)]
    if a.on("--sequence-parallel") and tp > 1:  # Megatron turns it off at tp 1
        out.append("--sequence-parallel")
    if a.on("--expert-model-parallel-size"):
        out += ["--ep", str(a.number("--expert-model-parallel-size", 1))]
    if a.on("--expert-tensor-parallel-size"):
        out += ["--etp", str(a.number("--expert-tensor-parallel-size", 1))]
    if a.on("--use-distributed-optimizer"):
        out += ["--zero", "1"]

    mbs, seq = a.need("--micro-batch-size"), a.need("--seq-length")
    batch = a.number("--global-batch-size", mbs * dp)
    if batch % (mbs * dp):
        raise PipesimError(f"{where}: --global-batch-size {batch} is not a multiple of --micro-batch-size x dp = "
                           f"{mbs} x {dp}")
    out += ["--batch", str(batch), "--microbatch-size", str(mbs), "--seq", str(seq)]
    out += ["--dtype", _dtype(a)] + _fp8(a)

    if typed.model is not None:  # the file's model is its own flags: only a config file replaces it whole
        raise PipesimError(f"{where}: --model {typed.model} after the file: the file's model is its --num-layers, "
                           "--hidden-size, ... (a size flag typed after it overrides the file's); give --model-config "
                           "to replace it")
    own_model = typed.model_config is not None
    if not own_model:
        out = ["--model", "moe" if a.on("--num-experts") else "gpt", *out,
               *model_flags(a, tp=tp, seq=seq, vocab_typed=typed.vocab is not None)]
    layers = model_layers(typed.model_config, where) if own_model else a.need("--num-layers")
    schedule, v = _pipeline(a, pp, layers)
    out += ["--stages", str(pp)] + (["--virtual", str(v)] if v > 1 or schedule == "combined-1f1b" else [])
    if a.on(LAYOUT):
        out += [LAYOUT, a.text(LAYOUT)]
    out += _recompute(a) + _kernels(a) + _experts(a)
    _megatron_asserts(a, pp, v, layers, ep=a.number("--expert-model-parallel-size", 1))
    for flag in PASS_AS_TYPED:
        if a.on(flag):
            out += [flag, *a.texts(flag)]
    return schedule, out


def _only(a: MegatronArgs, flag: str, value: str, why: str) -> None:
    if a.text(flag, value) != value:
        raise PipesimError(f"{a.where}: {flag} {a.text(flag)}: {why}")


def _cp_type(a: MegatronArgs) -> str:
    kinds = set(a.texts("--cp-comm-type") or ["p2p"])
    if len(kinds) > 1:
        raise PipesimError(f"{a.where}: --cp-comm-type {' '.join(a.texts('--cp-comm-type'))}: one type for every "
                           "layer is modelled")
    return a.one_of("--cp-comm-type", CP_TYPES, "p2p", "pipesim models p2p, a2a and allgather (not a2a+p2p)")


def _dtype(a: MegatronArgs) -> str:
    if a.on("--bf16") and a.on("--fp16"):
        raise PipesimError(f"{a.where}: --bf16 and --fp16: give one (Megatron asserts it)")
    return "bfloat16" if a.on("--bf16") else "float16" if a.on("--fp16") else "float32"


def _fp8(a: MegatronArgs) -> list[str]:
    """--fp8-format with its recipe (Megatron's default recipe: delayed); a recipe alone does nothing there."""
    if not a.on("--fp8-format"):
        return []
    return ["--fp8-format", a.text("--fp8-format"), "--fp8-recipe", a.text("--fp8-recipe", "delayed")]


def _split_slots(a: MegatronArgs, layers: int) -> int:
    """The layer slots Megatron's pipeline split counts: the layers, and the embedding and the loss where the
    account-for flags count them."""
    return layers + a.on("--account-for-embedding-in-pipeline-split") + a.on("--account-for-loss-in-pipeline-split")


def _pipeline(a: MegatronArgs, pp: int, layers: int) -> tuple[str, int]:
    """(the schedule, chunks per rank) of Megatron's virtual-pipeline flags (at most one, as validate_args asserts)."""
    given = [f for f in (LAYOUT, "--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage")
             if a.on(f)]
    if len(given) > 1:
        raise PipesimError(f"{a.where}: {given[0]} and {given[1]}: give one (Megatron asserts it)")
    v = 1
    if a.on(LAYOUT):
        stages = len(parse_layout(a.text(LAYOUT)))
        if stages % pp:
            raise PipesimError(f"{a.where}: {LAYOUT} has {stages} stages, not a multiple of "
                               f"--pipeline-model-parallel-size {pp}")
        v = stages // pp
    elif a.on("--num-virtual-stages-per-pipeline-rank"):
        v = a.number("--num-virtual-stages-per-pipeline-rank", 1)
    elif a.on("--num-layers-per-virtual-pipeline-stage"):
        per_chunk = a.number("--num-layers-per-virtual-pipeline-stage", 1)
        counted = _split_slots(a, layers)
        if counted % pp or counted // pp % per_chunk:
            raise PipesimError(f"{a.where}: {counted} layers do not split into --pipeline-model-parallel-size {pp} "
                               f"x chunks of --num-layers-per-virtual-pipeline-stage {per_chunk}")
        v = counted // pp // per_chunk
    if a.on("--overlap-moe-expert-parallel-comm"):  # Megatron-core's EP A2A overlap: combined 1F1B
        return "combined-1f1b", v
    return ("interleaved-1f1b" if v > 1 else "1f1b"), v


def _megatron_asserts(a: MegatronArgs, pp: int, v: int, layers: int, *, ep: int) -> None:
    """What Megatron-LM v0.15.3 refuses to start with (validate_args in megatron/training/arguments.py,
    TransformerConfig.__post_init__), refused here too rather than simulated as a run that cannot exist."""
    counted = _split_slots(a, layers)
    uneven = any(a.on(f) for f in (LAYOUT, "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"))
    if not uneven and counted % (pp * v):
        raise PipesimError(f"{a.where}: {counted} layers (with the embedding and loss the split counts) do not split "
                           f"into --pipeline-model-parallel-size {pp} x {v} chunks (Megatron asserts an even split "
                           "without a layout or --decoder-first/last-pipeline-num-layers)")
    if v > 1 and pp <= (2 if a.on("--no-overlap-p2p-communication") else 1):
        raise PipesimError(f"{a.where}: a virtual pipeline at --pipeline-model-parallel-size {pp}: Megatron's "
                           "interleaved schedule needs more than 1 (more than 2 with --no-overlap-p2p-communication)")
    if a.on("--moe-grouped-gemm") and not a.on("--bf16"):
        raise PipesimError(f"{a.where}: --moe-grouped-gemm without --bf16 (Megatron asserts 'Currently GroupedGEMM "
                           "for MoE only supports bf16 dtype.')")
    if a.on("--moe-pad-expert-input-to-capacity") and not a.on("--moe-expert-capacity-factor"):
        raise PipesimError(f"{a.where}: --moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor "
                           "(Megatron asserts it)")
    if a.on("--overlap-moe-expert-parallel-comm"):
        if ep == 1:
            raise PipesimError(f"{a.where}: --overlap-moe-expert-parallel-comm overlaps the expert-parallel "
                               "all-to-alls: it needs --expert-model-parallel-size > 1 (Megatron asserts it)")
        if a.text("--recompute-granularity") == "full":
            raise PipesimError(f"{a.where}: --overlap-moe-expert-parallel-comm with full recomputation (Megatron "
                               "asserts recompute_granularity != 'full')")


def _recompute(a: MegatronArgs) -> list[str]:
    granularity = "selective" if a.on("--recompute-activations") else a.text("--recompute-granularity")
    method, layers = a.text("--recompute-method"), a.number("--recompute-num-layers", None)
    modules = a.texts("--recompute-modules")
    if a.on("--moe-layer-recompute"):  # deprecated: selective with "moe" added to the modules (default core_attn),
        # and a ValueError beside full granularity (transformer_config.py @ core_v0.15.3, __post_init__)
        if granularity == "full":
            raise PipesimError(f"{a.where}: --moe-layer-recompute with --recompute-granularity full (Megatron raises: "
                               "'Do not set --moe-layer-recompute with full recompute granularity')")
        if not a.on("--num-experts"):
            raise PipesimError(f"{a.where}: --moe-layer-recompute recomputes the MoE layers: this model has none "
                               "(no --num-experts)")
        granularity, modules = "selective", [*(modules or ["core_attn"]), *(["moe"] if "moe" not in (modules or [])
                                                                              else [])]
    if granularity == "selective":
        if method is not None:
            raise PipesimError(f"{a.where}: --recompute-method with selective recomputation (Megatron asserts none)")
        return ["--recompute", "selective"] + (["--recompute-modules", *modules] if modules else [])
    if granularity == "full":
        if method != "uniform" or layers != 1:
            raise PipesimError(f"{a.where}: --recompute-granularity full with --recompute-method {method} "
                               f"--recompute-num-layers {layers}: pipesim models every layer recomputed on its own "
                               "(uniform, 1)")
        return ["--recompute", "full"]
    if granularity is not None:
        raise PipesimError(f"{a.where}: --recompute-granularity {granularity}: full or selective")
    return []


def _kernels(a: MegatronArgs) -> list[str]:
    """The attention kernel, the five fusions and the CUDA graphs' scope."""
    backend = a.one_of("--attention-backend", BACKENDS, "auto", "flash, fused, unfused or auto (local needs "
                       "Megatron's local spec)")
    out = ["--attention", backend] if backend else ["--attention", "flash"] if a.on("--use-flash-attn") else []
    off = [f for f in FUSIONS if a.on(f)]
    if off and len(off) < len(FUSIONS):
        raise PipesimError(f"{a.where}: {off[0]} alone: pipesim turns Megatron's five fusions off together "
                           f"(--no-kernel-fusion): give all of {', '.join(FUSIONS)} or none")
    out += ["--no-kernel-fusion"] if off else []
    scope = [s for s in a.texts("--cuda-graph-scope") or [] if s != "full"]  # full: the whole layer, the default
    return out + (["--cuda-graph-scope", *scope] if scope else [])


def _experts(a: MegatronArgs) -> list[str]:
    """The dispatcher (Megatron's default allgather is not modelled), the grouped GEMM pipesim times and the capacity
    (padded, as pipesim times it)."""
    if not a.on("--num-experts"):
        return []
    dispatcher = a.one_of("--moe-token-dispatcher-type", {"alltoall": "alltoall", "flex": "flex"}, "allgather",
                          "Megatron's allgather dispatcher is not modelled: give alltoall or flex")
    if not a.on("--moe-grouped-gemm"):
        raise PipesimError(f"{a.where}: experts without --moe-grouped-gemm run one GEMM per expert (SequentialMLP); "
                           "pipesim times Transformer Engine's grouped GEMM")
    out = ["--moe-token-dispatcher-type", dispatcher]
    if a.on("--moe-expert-capacity-factor"):
        if not a.on("--moe-pad-expert-input-to-capacity"):
            raise PipesimError(f"{a.where}: --moe-expert-capacity-factor without --moe-pad-expert-input-to-capacity: "
                               "pipesim times the experts' buffers padded to capacity")
        out += ["--moe-expert-capacity-factor", a.text("--moe-expert-capacity-factor")]
    return out


# what `pipesim plan --from-megatron` keeps of the file: the job (model, batch, sequence, precision) and the software
# choices the plan does not search (kernels, dispatcher, overlaps, the optimizer's dtypes, the split rule); the
# layout (degrees, chunks, the schedule, recomputation, ZeRO and a fixed layer split) is what the plan searches
LAYOUT_FLAGS = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")
PLAN_KEEPS = ("--framework", "--model", "--seq", "--batch", "--dtype", "--fp8-format", "--fp8-recipe", "--layers",
              "--hidden", "--heads", "--ffn-hidden", "--activation", "--kv-heads", "--kv-channels", "--normalization",
              "--position-embedding-type", "--disable-bias-linear", "--add-qkv-bias",
              "--tie-embeddings-and-output-weights", "--untie-embeddings-and-output-weights", "--dropout",
              "--no-dropout", "--qk-layernorm", "--vocab",
              "--softmax-type", "--window-size", "--window-attn-skip-freq", "--multi-latent-attention",
              "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
              "--moe-shared-expert-gate", "--moe-layer-freq", "--moe-expert-capacity-factor",
              "--moe-token-dispatcher-type", "--attention",
              "--no-kernel-fusion", "--cuda-graph-scope",
              *(f for f in PASS_AS_TYPED if f not in LAYOUT_FLAGS))


def expand(argv: list[str]) -> list[str]:
    """`simulate [SCHEDULE] --from-megatron FILE REST` -> `simulate SCHEDULE FLAGS REST`: the file's flags first, so
    that REST wins; the schedule the file's flags give unless one is typed. `plan --from-megatron FILE REST` ->
    `plan JOB-FLAGS REST`: the file's model, batch, sequence and precision, its layout left to the search."""
    path, rest, name, planning = split_command(argv, FLAG, "Megatron-LM's (--framework megatron-core)")
    schedule, flags = megatron_argv(path, rest)
    if planning:
        return [argv[0], *keep_flags(flags, PLAN_KEEPS), *rest]
    return [argv[0], name or schedule, *flags, *rest]


__all__ = ["FLAG", "expand", "megatron_argv"]
