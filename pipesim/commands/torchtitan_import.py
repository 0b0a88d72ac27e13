"""`pipesim simulate --from-torchtitan JOB.toml`: a torchtitan job config read as pipesim's own flags.

torchtitan users describe a run in one TOML (pytorch/torchtitan v0.2.2 torchtitan/config/job_config.py, whose
section and key names are read here); `pipesim plan` writes the same sections (pipesim.plan.exports). This module
turns such a file into `pipesim simulate` flags, placed before the ones typed after it, so that a flag on the command
line wins as it does in torchtitan (`--parallelism.tensor_parallel_degree 8` over the file). What changes the
model or its timing and pipesim does not model is refused in one line; the keys that change neither (optimizer
hyperparameters, data, logging, checkpoints) are read past. Degrees of -1 take the rest of the job's GPUs, as
torchtitan's ParallelDims does: WORLD_SIZE is the GPUs of `--hardware` (with `--nodes`, `--nvlink-domain`).
"""

from __future__ import annotations

from pathlib import Path

from pipesim.commands.job_import import keep_flags, split_command, typed_rest, world_size
from pipesim.commands.torchtitan_pipeline import model_layers, parts_split, stages_per_rank
from pipesim.commands.torchtitan_sections import Keys, compile_flags, quantize_flags, recompute_flags
from pipesim.errors import PipesimError, refuse_special_file
from pipesim.plan.stack_space import TORCHTITAN_FLAVORS
from pipesim.plan.torchtitan_export import TORCH_ROTATE

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

FLAG = "--from-torchtitan"
ROTATE = {torch: ours for ours, torch in TORCH_ROTATE.items()}
# torchtitan v0.1.0's config_manager.py spellings that v0.2 moved or dropped (its split_points and layers-per-stage
# split, torchtitan/distributed/pipeline.py generate_split_points, is another rule than v0.2's)
V01_SECTIONS = ("float8", "mx")
V01_KEYS = (("training", "compile"), ("parallelism", "pipeline_parallel_split_points"),
            ("parallelism", "enable_compiled_autograd"))
# sections that change neither the model nor a step's time
IGNORED = ("job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "comm", "memory_estimation",
           "fault_tolerance", "experimental", "validation")


def torchtitan_argv(path: str, argv: list[str]) -> tuple[str | None, list[str]]:
    """(schedule, None for a CSV given as --from-csv; `pipesim simulate` flags) of torchtitan job config `path`;
    `argv` the rest of the command line (its --hardware and --nodes give WORLD_SIZE; its own model replaces the
    file's)."""
    where = f"{FLAG} {path}"
    refuse_special_file(path, where)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PipesimError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PipesimError(f"{where}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PipesimError(f"{where}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {*IGNORED, "model", "training", "parallelism", "activation_checkpoint", "compile",
                                  "quantize", "debug"})
    old = [f"[{k}]" for k in V01_SECTIONS if k in data] + [f"{t}.{k}" for t, k in V01_KEYS if k in data.get(t, {})]
    if old:  # torchtitan v0.1's config_manager.py: its pipeline split is another rule, so no silent reading
        raise PipesimError(f"{where}: {old[0]} is torchtitan v0.1's spelling; pipesim reads v0.2's job_config.py "
                           "keys ([quantize.linear.float8], [compile] enable, module_fqns_per_model_part)")
    if unknown:
        raise PipesimError(f"{where}: unknown section [{unknown[0]}] (torchtitan v0.2.2's job_config.py has none such)")
    out = ["--framework", "torchtitan"]

    model = Keys(data, "model", where)
    name, flavor = model.take("name", "llama3", str), model.take("flavor", "debugmodel", str)
    converters = model.take("converters", [], list)
    model.done()
    typed = typed_rest(argv)
    config = TORCHTITAN_FLAVORS.get((name, flavor))
    if typed.model_config or typed.model:  # a model typed replaces the file's
        config = None
    elif config is None:
        raise PipesimError(f"{where}: torchtitan's {name} {flavor} has no bundled config ("
                           + ", ".join(f"{n} {f}" for n, f in TORCHTITAN_FLAVORS) + "); give --model-config")
    else:
        out += ["--model-config", config]

    training = Keys(data, "training", where)
    local = training.take("local_batch_size", 8, int)
    global_batch = training.take("global_batch_size", -1, int)
    seq = training.take("seq_len", 2048, int)
    param = training.take("mixed_precision_param", "bfloat16", str)
    reduce = training.take("mixed_precision_reduce", "float32", str)
    training.refuse("enable_cpu_offload", False, "pipesim does not model FSDP's CPU offload")
    training.refuse("dtype", "float32", "training without float32 master weights is not modelled")
    training.done()
    if param not in ("bfloat16", "float32") or reduce not in ("bfloat16", "float32"):
        raise PipesimError(f"{where}: training.mixed_precision_param / _reduce take bfloat16 or float32")
    out += ["--seq", str(seq), "--dtype", param]
    if reduce == "bfloat16":
        out.append("--grad-reduce-in-bf16")

    par = Keys(data, "parallelism", where)
    replicate = par.take("data_parallel_replicate_degree", 1, int)
    shard = par.take("data_parallel_shard_degree", -1, int)
    reshard = par.take("fsdp_reshard_after_forward", "default", str)
    tp = par.take("tensor_parallel_degree", 1, int)
    par.refuse("disable_loss_parallel", False, "pipesim's head is vocabulary-parallel (loss parallel) under tp")
    async_tp = par.take("enable_async_tensor_parallel", False, bool)
    pp = par.take("pipeline_parallel_degree", 1, int)
    fqns = par.take("module_fqns_per_model_part", None, list)
    first_less = par.take("pipeline_parallel_first_stage_less_layers", 1, int)
    last_less = par.take("pipeline_parallel_last_stage_less_layers", 1, int)
    per_stage = par.take("pipeline_parallel_layers_per_stage", None, int)
    schedule_name = par.take("pipeline_parallel_schedule", "1F1B", str)
    csv = par.take("pipeline_parallel_schedule_csv", "", str)
    pp_mbs = par.take("pipeline_parallel_microbatch_size", 1, int)
    cp = par.take("context_parallel_degree", 1, int)
    par.refuse("context_parallel_load_balancer", "headtail", "pipesim's context parallelism is the head-tail "
               "(causal load-balanced) one")
    rotate = par.take("context_parallel_rotate_method", "allgather", str)
    ep = par.take("expert_parallel_degree", 1, int)
    etp = par.take("expert_tensor_parallel_degree", 1, int)
    par.refuse("expert_parallel_comm_backend", "standard", "pipesim times torchtitan's standard all-to-all only")
    par.done()

    for label, value in (("tensor_parallel_degree", tp), ("pipeline_parallel_degree", pp),
                         ("context_parallel_degree", cp), ("data_parallel_replicate_degree", replicate),
                         ("expert_parallel_degree", ep), ("expert_tensor_parallel_degree", etp),
                         ("local_batch_size", local), ("pipeline_parallel_microbatch_size", pp_mbs)):
        if value < 1:
            raise PipesimError(f"{where}: {label} = {value} must be at least 1")
    if shard < 1 and shard != -1:
        raise PipesimError(f"{where}: parallelism.data_parallel_shard_degree = {shard}: give -1 or at least 1")
    # a --tp or --cp typed after the file is the job's degree, as a command-line override is torchtitan's: the
    # sequence-parallel norms and the rotate method follow it; a typed --stages only sizes the data-parallel rest
    # (the file's pipeline parts are cut for its own degree)
    tp, cp = (d if over is None else over for d, over in ((tp, typed.tp), (cp, typed.cp)))
    if shard == -1:  # the rest of the job's GPUs (torchtitan's ParallelDims)
        world = world_size(typed)
        rest = replicate * tp * cp * (pp if typed.stages is None else typed.stages)
        if world % rest:
            raise PipesimError(f"{where}: {world} GPUs are not a multiple of replicate x tp x pp x cp = {rest}")
        shard = world // rest
    if replicate > 1 and shard > 1:
        raise PipesimError(f"{where}: HSDP (data_parallel_replicate_degree {replicate} x shard {shard}) is not "
                           "modelled: give one of them")
    dp = replicate * shard
    out += ["--dp", str(dp), "--zero", "3" if shard > 1 else "0"]
    if shard > 1:
        out += ["--fsdp-reshard-after-forward", reshard]
    if tp > 1:
        out += ["--tp", str(tp), "--sequence-parallel"]  # torchtitan's apply_tp: SequenceParallel norms
    if async_tp:
        out.append("--async-tp")
    if cp > 1:
        if rotate not in ROTATE:
            raise PipesimError(f"{where}: context_parallel_rotate_method {rotate!r}: allgather or alltoall")
        out += ["--cp", str(cp), "--cp-comm-type", ROTATE[rotate]]
    if ep > 1:
        out += ["--ep", str(ep)]
    if etp > 1 or ep > 1:
        out += ["--etp", str(etp)]

    batch = global_batch if global_batch != -1 else local * dp
    if batch % (local * dp):
        raise PipesimError(f"{where}: global_batch_size {batch} is not a multiple of local_batch_size x dp = "
                           f"{local} x {dp} (torchtitan asserts it)")
    out += ["--batch", str(batch)]
    schedule = "1f1b"
    if pp == 1:  # no pipeline: each gradient-accumulation step is one microbatch of the local batch
        out += ["--stages", "1", "--microbatch-size", str(local)]
    else:
        if local % pp_mbs:
            raise PipesimError(f"{where}: local_batch_size {local} is not a multiple of "
                               f"pipeline_parallel_microbatch_size {pp_mbs}")
        out += ["--stages", str(pp), "--microbatch-size", str(pp_mbs)]
        stages = None
        if per_stage is not None and fqns is None:  # pipeline_llm: ceil((layers + both weights) / layers per stage)
            layers = model_layers(config or typed.model_config, where)
            if per_stage < 1:
                raise PipesimError(f"{where}: pipeline_parallel_layers_per_stage = {per_stage} must be at least 1")
            stages = -(-(layers + first_less + last_less) // per_stage)
        schedule, v = stages_per_rank(where, schedule_name, csv, pp, fqns, stages, path)
        if csv:  # the file's schedule is the CSV: no name
            out += ["--from-csv", schedule]
            schedule = None
        elif v > 1:
            out += ["--virtual", str(v)]
        if fqns is not None:  # the layers' count is checked where the split is (pipesim.model.config)
            split = parts_split(fqns, where)
            out += ["--layer-split", ",".join(map(str, split))]
        else:
            out += ["--pipeline-parallel-first-stage-less-layers", str(first_less),
                    "--pipeline-parallel-last-stage-less-layers", str(last_less)]

    out += recompute_flags(data, where) + compile_flags(data, where) + quantize_flags(data, converters, where)
    Keys(data, "debug", where).done()
    return schedule, out


# what `pipesim plan --from-torchtitan` keeps of the file: the job (model, batch, sequence, precision, compile);
# the layout (parallel degrees, pipeline, schedule, recomputation) is what the plan searches
PLAN_KEEPS = ("--framework", "--model-config", "--seq", "--dtype", "--grad-reduce-in-bf16", "--batch", "--compile",
              "--fp8-format", "--fp8-recipe", "--fp8-param-gather", "--fp8-impl")


def expand(argv: list[str]) -> list[str]:
    """`simulate [SCHEDULE] --from-torchtitan FILE REST` -> `simulate SCHEDULE FLAGS REST`: the file's flags first,
    so that REST wins; the schedule the file names unless one is typed. `plan --from-torchtitan FILE REST` -> `plan
    JOB-FLAGS REST`: the file's model, batch, sequence and precision, its layout left to the search."""
    path, rest, name, planning = split_command(argv, FLAG, "torchtitan's")
    schedule, flags = torchtitan_argv(path, rest)
    if planning:
        return [argv[0], *keep_flags(flags, PLAN_KEEPS), *rest]
    if name is not None:  # a typed schedule replaces the file's (its CSV too)
        if schedule is None:
            at_csv = flags.index("--from-csv")
            flags = flags[:at_csv] + flags[at_csv + 2:]
        schedule = name
    return [argv[0], *([schedule] if schedule else []), *flags, *rest]


__all__ = ["FLAG", "expand", "torchtitan_argv"]
