"""`pipesim simulate`: one schedule, one step, simulated with SimPy; a table, JSON or a Perfetto trace."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from pipesim.calibration.speed_check import speed_note
from pipesim.commands.common import (
    DEFAULT_MICROBATCHES,
    add_model_args,
    add_output_args,
    add_schedule_args,
    add_transformer_args,
    emit_json,
    input_files,
    json_text,
    load_schedule,
    model_config_json,
    user_model_config,
)
from pipesim.commands.megatron_import import FLAG as MEGATRON_FLAG
from pipesim.commands.setup_args import add_setup_args, setup_from_args
from pipesim.commands.torchtitan_import import FLAG
from pipesim.commands.whatif_args import add_whatif_args, perturbation_from_args, whatif_lines
from pipesim.cost.fp8_costs import mfu_peak
from pipesim.cost.rank_memory import memory_json
from pipesim.cost.user_model_costs import is_factory_spec
from pipesim.errors import PipesimError
from pipesim.ir.torch_csv import check_csv_counts
from pipesim.model.flops import hardware_flops, model_flops, utilization
from pipesim.outputs import check_apart, check_distinct, check_file, write_files
from pipesim.plots.perfetto import trace_text
from pipesim.sim.blame import blame_rows, what_if
from pipesim.sim.sim_setup import SimSetup
from pipesim.units import format_bytes

EXAMPLES = """examples:
  pipesim simulate 1f1b --stages 4 --microbatches 8 --hardware dgx-h100 --model gpt --json
  pipesim simulate gpipe -p 4 -m 8 --cost F=1,B=2 --comm none --json       # closed forms, in seconds
  pipesim simulate interleaved-1f1b -p 4 -m 8 -v 2 --model gpt --layers 16 --trace sim.json
  pipesim simulate 1f1b -p 8 -m 32 --model gpt --dp 2 --hardware 2x-dgx-h100
  pipesim simulate 1f1b -p 4 -m 8 --cost F=1,B=2 --slow 1=1.5     # what if rank 1 is 1.5x slow (docs/whatif.md)
  pipesim simulate zb-h1 -p 4 -m 8 --model gpt --jitter 0.1 --jitter-seed 3 --slow-link 1-2=4
  pipesim simulate --from-csv my_schedule.csv --cost F=1,I=1,W=1
  pipesim simulate interleaved-1f1b --model gpt --hidden 12288 --layers 96 --heads 96 --seq 2048 --vocab 51200 \
      --batch 1536 --microbatch-size 1 --tp 8 --stages 8 --virtual 3 --dp 8 --dtype bfloat16 \
      --hardware dgx-a100 --nodes 64 --recompute selective --sequence-parallel    # docs/published_examples.md
  pipesim simulate 1f1b --model-config llama3-8b --seq 8192 --batch 64 --microbatch-size 1 --tp 8 -p 4 \
      --dp 2 --hardware dgx-h100 --nodes 8 --zero 1 --json
"""


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="simulate one step of a schedule (SimPy)", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_schedule_args(p, microbatch_size=True)
    add_setup_args(p)
    add_model_args(p)
    add_transformer_args(p)
    add_output_args(p)
    add_whatif_args(p)
    p.add_argument(FLAG, metavar="JOB.toml",
                   help="a torchtitan job config (its [model], [training], [parallelism], [activation_checkpoint], "
                        "[compile], [quantize] sections) as the flags it stands for; flags typed after it win; "
                        "degrees of -1 take the GPUs of --hardware and --nodes (docs/frameworks.md)")
    p.add_argument(MEGATRON_FLAG, metavar="ARGS",
                   help="a Megatron-LM launch: pretrain_gpt.py's arguments (after torchrun's, whose --nproc-per-node "
                        "x --nnodes give the GPUs, else --hardware's and --nodes') as the flags they stand for, under "
                        "--framework megatron-core; flags typed after it win (docs/frameworks.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    json_path = check_file(args.json, "--json", "json")
    trace_path = check_file(args.trace, "--trace", "json")
    check_distinct(("--json", json_path), ("--trace", trace_path))
    check_apart([("--json", json_path), ("--trace", trace_path)], input_files(args))
    # a CSV first: its own microbatch count is m when neither -m nor --microbatch-size is typed (a typed -p, -m
    # or --virtual it does not have is refused here; --microbatch-size's m below)
    csv_sched = load_schedule(args) if args.from_csv else None
    typed_size = args.microbatch_size
    if csv_sched is not None and args.microbatches is None and typed_size is None:
        args.microbatches = csv_sched.num_microbatches
    if is_factory_spec(args.model):  # the shared flags read as for pipesim's own models, then the factory's counts
        setup = _with_user_model(setup_from_args(argparse.Namespace(**{**vars(args), "model": None,
                                                                        "factory": args.model})), args)
    else:
        setup = setup_from_args(args)
    # Registered schedules are valid by construction (tests/test_schedules_invariants.py) and the
    # simulator itself reports a deadlock; full validation (a networkx task graph) is kept for CSV
    # imports, where it also prints the offending grid. At p=64, m=1024 it would cost ~10x the simulation.
    if args.hardware and (note := speed_note(setup.hardware, args.hardware)):  # another machine's file: say so once
        print(note, file=sys.stderr)
    args.microbatches = setup.microbatches(args.microbatches, args.microbatch_size,
                                           default_batch=getattr(args, "batch", None) is None)
    if csv_sched is not None and typed_size is not None:
        check_csv_counts(csv_sched, args.from_csv, microbatches=args.microbatches, microbatch_size=typed_size)
    sched = csv_sched or load_schedule(args, validate=False)
    pert = perturbation_from_args(args)
    if pert is not None:
        pert.check(sched.num_ranks)
        if pert.slow_links and not setup.comm:
            raise PipesimError("--slow-link needs links: give --hardware (and not --comm none)")
        result, memory = replace(setup, perturb=pert).evaluate(sched)
    else:
        result, memory = setup.evaluate(sched)
    data = result.to_dict()
    if pert is not None:  # the same step unperturbed, and who waited on whom (pipesim.sim.blame)
        data["what_if"] = {"perturbation": pert.describe(), **pert.to_dict(), **what_if(setup.run(sched), result)}
    data["options"] = setup.options()
    if (keys := model_config_json(args)) is not None:
        data["model_config"] = keys
    if memory is not None:  # per rank: parameters, gradients, optimizer states, activations (+ in-flight), ...
        data["memory"]["ranks"] = memory_json(memory)
    data.update(_utilization(setup, result, data))
    files = {}  # written together or not at all
    if json_path:
        files[json_path] = json_text(data)
    if trace_path:
        timeline = result.timeline()
        if setup.model is not None:  # the compare view checks it against the measured run's model
            timeline.meta = {**timeline.meta, "model": setup.model.to_dict()}
        elif setup.user_model is not None:  # as `pipesim run --model MODULE:FACTORY` records it
            timeline.meta = {**timeline.meta, "model": {"factory": args.model, "batch": user_model_config(args).batch}}
        if pert is not None:  # who waited on whom, drawn by pipesim plot and in Perfetto (pipesim.sim.blame)
            timeline.meta = {**timeline.meta, "blame": blame_rows(result), "what_if": pert.describe()}
        files[trace_path] = trace_text(timeline)
    write_files(files)
    if args.json == "-":
        emit_json("-", data)
    else:
        print(summary(data))
        if "what_if" in data:
            print("\n".join(whatif_lines(data["what_if"])))
    return 0


def _utilization(setup: SimSetup, result, data: dict) -> dict:
    """`mfu` and `tflops_per_gpu` of a transformer's step on a device with a peak in its dtype (the planner's
    definition, pipesim.model.flops.utilization, over pipesim.cost.fp8_costs.mfu_peak), and `hfu`, the FLOPs
    executed (`hardware_flops`) at the same rate; {} otherwise."""
    model, hw = setup.model, setup.hardware
    if model is None or model.kind != "gpt" or hw is None or model.dtype not in hw.device.flops \
            or "step_time" not in data:
        return {}
    d = setup.job.dims
    gpus = result.schedule.num_ranks * d.dp * d.cp * d.tp
    peak = mfu_peak(hw, model, setup.job.fp8)
    mfu, tflops = utilization(float(model_flops(model, model.batch)), data["step_time"], gpus, peak)
    opts = setup.job.layer_options(model)
    hfu, _ = utilization(float(hardware_flops(model, model.batch, opts)), data["step_time"], gpus, peak)
    return {"mfu": mfu, "tflops_per_gpu": tflops, "hfu": hfu}


def _with_user_model(setup: SimSetup, args: argparse.Namespace) -> SimSetup:
    """--model MODULE:FACTORY: each layer's FLOPs and bytes counted on one microbatch (torch, on meta)."""
    user = user_model_config(args)  # --batch and --seed; pipesim's size flags are refused
    if args.cost is not None:
        raise PipesimError(f"give --model {args.model} or --cost, not both")
    job = setup.job
    for flag, value, plain in (("--tp", job.tp, 1), ("--cp", job.cp, 1), ("--sequence-parallel", job.sp, False),
                               ("--recompute", job.recompute, "none"), ("--zero", job.zero, 0)):
        if value != plain:
            raise PipesimError(f"{flag} needs pipesim's own --model mlp or gpt, not --model {args.model}")
    if args.microbatch_size is not None:
        if user.batch % (job.dp * args.microbatch_size):
            raise PipesimError(f"--batch {user.batch} does not split into dp({job.dp}) x --microbatch-size "
                               f"{args.microbatch_size}")
        args.microbatches, args.microbatch_size = user.batch // (job.dp * args.microbatch_size), None
    args.microbatches = args.microbatches or DEFAULT_MICROBATCHES
    from executor.user_model import count_user_model  # local import: torch only with --model MODULE:FACTORY

    counted = count_user_model(args.model, batch=user.batch, microbatches=args.microbatches, dp=job.dp,
                               seed=user.seed)
    return replace(setup, model=None, user_model=counted)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:10.3f}"



def summary(d: dict) -> str:
    """The human-readable report from the `pipesim.simulate/1` dict: totals, per rank, busiest links."""
    s = d["schedule"]
    where = f"on {d['hardware']}" if d["hardware"] else "(no hardware)"
    lines = [
        f"{s['name']}: {s['ranks']} ranks, {s['stages']} stages, {s['microbatches']} microbatches {where}, "
        f"links {'modeled' if d['comm'] == 'links' else 'off'}, dp {d['parallel']['dp']} tp {d['parallel']['tp']}"
        + (f" ep {d['parallel']['ep']} etp {d['parallel']['etp']}" if "ep" in d["parallel"] else ""),
        f"makespan {d['makespan'] * 1e3:.3f} ms   bubble {d['bubble_fraction'] * 100:.1f} %   "
        f"peak activations {format_bytes(max(d['memory']['peak_activation_bytes'], default=0))}",
        f"{'rank':>4} {'busy ms':>10} {'wait ms':>10} {'idle ms':>10} {'bubble':>7} {'peak act':>11} {'in-flight':>9}",
    ]
    mem = d["memory"]
    if "step_time" in d:  # with the optimizer step (device presets, or --zero)
        mfu = (f"; MFU {d['mfu'] * 100:.1f} %, {d['tflops_per_gpu']:.1f} model TFLOP/s per GPU (causal attention, "
               f"no recomputation counted); HFU {d['hfu'] * 100:.1f} % (the FLOPs executed: recomputation, flash's "
               "diagonal tiles)") if "mfu" in d else ""
        lines.insert(2, f"step time {d['step_time'] * 1e3:.3f} ms (to the optimizer's end){mfu}")
    if mem.get("ranks"):  # the memory model's per-rank breakdown at its peak
        top = max(mem["ranks"], key=lambda r: r["total"])
        terms = ", ".join(f"{k.replace('_', ' ')} {format_bytes(top[k])}" for k in
                          ("parameters", "gradients", "optimizer_states", "activations", "fp8_weights") if top.get(k))
        lines.insert(3 if "step_time" in d else 2,
                     f"peak memory {format_bytes(top['total'])} on rank {top['rank']} ({terms})")
    for r in d["ranks"]:
        i = r["rank"]
        lines.append(f"{i:>4} {_ms(r['busy'])} {_ms(r['waiting_comm'])} {_ms(r['idle'])} "
                     f"{r['bubble_fraction'] * 100:6.1f}% {format_bytes(mem['peak_activation_bytes'][i]):>11} "
                     f"{mem['peak_inflight_microbatches'][i]:>9}")
    links = sorted(d["links"], key=lambda x: (-x["utilization"], x["resource"]))[:3]
    for x in links:
        lines.append(f"link {x['resource']}: {x['transfers']} transfers, {format_bytes(x['bytes'])}, "
                     f"busy {x['utilization'] * 100:.1f} %, {x['achieved_bandwidth'] / 1e9:.1f} GB/s achieved")
    path = d["critical_path"]
    kinds = {k: sum(1 for e in path if e["kind"] == k) for k in ("compute", "transfer", "collective")}
    lines.append("critical path: " + ", ".join(f"{v} {k}" for k, v in kinds.items() if v))
    return "\n".join(lines)
