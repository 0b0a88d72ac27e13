"""`pipesim plan`: the fastest parallel configuration of a transformer on a cluster, searched with the
simulator (pipesim/plan/); a ranked table, --json, and the winner as commands (docs/planner.md)."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

from pipesim.commands.arg_types import bounded_int, positive_int
from pipesim.commands.common import (
    add_model_args,
    add_transformer_args,
    emit_json,
    given_model_flags,
    input_files,
    model_config,
    model_config_json,
    model_flag_words,
)
from pipesim.commands.kernel_args import (
    add_act_fp8_store_arg,
    add_ce_fusion_args,
    add_cp_comm_arg,
    add_cuda_graph_args,
    add_fp8_args,
    add_grad_args,
    add_optimizer_args,
    add_stack_kernel_args,
    add_ub_args,
    check_fp8_run,
)
from pipesim.commands.megatron_import import FLAG as MEGATRON_FLAG
from pipesim.commands.model_switches import SEED
from pipesim.commands.plan_args import (
    cp_sizes,
    names_list,
    on_off,
    plan_modules,
    recompute_list,
    shared_job,
    zero_list,
)
from pipesim.commands.plan_report import plan_json, report
from pipesim.commands.setup_args import add_comm_args, add_domain_arg, add_power_limit_arg, capped
from pipesim.commands.split_args import add_split_args, split_rule, typed_split
from pipesim.commands.torchtitan_import import FLAG
from pipesim.cost.model_costs import check_muon_device
from pipesim.cost.v_search import SEARCHED, V_SEARCHED
from pipesim.errors import PipesimError
from pipesim.hardware.machine import Hardware
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig
from pipesim.model.options import ATTENTION
from pipesim.model.pipeline_split import FIRST_LAYERS, LAST_LAYERS, LAYOUT, BalancedSplit
from pipesim.model.recompute_modules import RECOMPUTE_MODULES
from pipesim.outputs import check_apart, check_file, write_text
from pipesim.plan.backends import open_backend
from pipesim.plan.balance import balanced_rule
from pipesim.plan.evaluate import Evaluator
from pipesim.plan.exports import (
    grad_flags,
    run_command,
    schedule_csv,
    simulate_command,
)
from pipesim.plan.finalists import DEFAULT_FINALISTS
from pipesim.plan.jitter import PlanJitter, rank_under_jitter
from pipesim.plan.search import DEFAULT_MAX_CANDIDATES, DEFAULT_MAX_WORK, default_workers, plan
from pipesim.plan.space import PlanRequest
from pipesim.sim.sim_setup import DEFAULT_HARDWARE

EXAMPLES = """examples:
  pipesim plan --model gpt --hidden 1024 --layers 8 --heads 16 --seq 1024 --vocab 32000 --batch 32 \\
      --dtype bfloat16 --hardware dgx-h100 --gpus 8 --top 5
  pipesim plan --model-config llama3-8b --seq 8192 --batch 64 --hardware dgx-h100 --nodes 2 --json plan.json \
      --plot plan.html --export-csv winner.csv
"""


def _headroom(text: str) -> float:
    """--memory-headroom: a fraction in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.1, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="search the fastest parallel configuration (schedule, pp, tp, dp, ...)",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, default="gpt")
    add_transformer_args(p)
    add_comm_args(p)
    add_grad_args(p.add_argument_group("main gradients (Megatron-LM's flags)"))
    add_ce_fusion_args(p.add_argument_group("loss (Megatron-core's flag)"))
    add_ub_args(p.add_argument_group("tensor-parallel overlap (Megatron-core's flags)"))
    add_fp8_args(p.add_argument_group("FP8 (Megatron-core's Transformer Engine flags)"))
    add_cuda_graph_args(p.add_argument_group("CUDA graphs (Megatron-core's flags)"))
    add_stack_kernel_args(p.add_argument_group("kernels and sharding (torchtitan's and Megatron-core's choices)"))
    add_optimizer_args(p.add_argument_group("optimizer states (Megatron-core's flags)"))
    split = p.add_argument_group("layer split (Megatron-core's and torchtitan's flags, or pipesim's balance)")
    add_split_args(split)
    split.add_argument("--balance-layers", action="store_true",
                       help="cut each candidate's layers so that its busiest stage carries the least it can, the "
                            "head weighing its FLOPs in layers (pipesim/plan/balance.py); exported as Megatron-core's "
                            "--pipeline-model-parallel-layout, torchtitan's module list and --layer-split")
    g = p.add_argument_group("cluster and search")
    g.add_argument("--hardware", metavar="PRESET|FILE", help=f"hardware preset or TOML file (default "
                                                             f"{DEFAULT_HARDWARE})")
    add_domain_arg(g)
    add_power_limit_arg(g)
    n = g.add_mutually_exclusive_group()
    n.add_argument("--nodes", type=positive_int, default=None, metavar="N", help="nodes of the hardware's kind")
    n.add_argument("--gpus", type=positive_int, default=None, metavar="N",
                   help="GPUs in all (a multiple of the GPUs per node, or fewer than one node holds)")
    g.add_argument("--schedules", type=names_list, default=None, metavar="A,B,...",
                   help="schedules to consider (default every one --framework runs; without it every registered "
                        "one)")
    g.add_argument("--max-tp", type=positive_int, default=None, help="largest tensor-parallel size (default a node)")
    g.add_argument("--recompute", type=recompute_list, default=None, metavar="none,selective,full,op",
                   help="recomputation choices to consider (default every one --framework offers: none, op and "
                        "full with torchtitan; without it none, selective and full)")
    g.add_argument("--recompute-modules", nargs="+", default=None, metavar="MODULE",
                   help="what the selective choice recomputes: Megatron-core's --recompute-modules, "
                        f"{', '.join(RECOMPUTE_MODULES)} (default core_attn)")
    add_act_fp8_store_arg(g)
    g.add_argument("--zero", type=zero_list, default=None, metavar="0,1,...",
                   help="ZeRO stages to consider with dp > 1 (default every one --framework offers: 0 and 3 "
                        "(FSDP2) with torchtitan; without it 0,1)")
    g.add_argument("--sequence-parallel", type=on_off, default=None, metavar="on|off|on,off",
                   help="sequence parallelism with tp > 1: on (default, Megatron's practice; without it where "
                        "--framework has none), off, or both searched")
    g.add_argument("--cp", type=cp_sizes, default=(1,), metavar="1,2,4,...",
                   help="context-parallel sizes to search (ring attention; needs flash attention and --seq "
                        "divisible by 2 cp; default 1: none)")
    add_cp_comm_arg(g)
    g.add_argument("--attention", choices=ATTENTION, default=None,
                   help="attention kernel of every candidate (default: flash on GPUs at 16 bits, as simulate)")
    g.add_argument("--tokens-per-step", type=positive_int, default=None, metavar="T",
                   help="global batch in tokens (instead of --batch): T / --seq sequences")
    g.add_argument("--memory-headroom", type=_headroom, default=0.0, metavar="FRACTION",
                   help="share of each GPU's memory kept free (allocator fragmentation, buffers): 0 <= f < 1 "
                        "(default 0)")
    g.add_argument("--ilp", type=float, nargs="?", const=2.0, default=None, metavar="SECONDS", dest="ilp_seconds",
                   help="also try zb-auto / zb-2p on the best layouts, their orders searched by the Zero Bubble "
                        "paper's ILP for up to SECONDS each (default 2; pipesim/plan/finalists.py)")
    g.add_argument("--finalists", type=positive_int, default=None, metavar="K",
                   help=f"with --ilp: the best K layouts searched again (default {DEFAULT_FINALISTS})")
    g.add_argument("--top", type=positive_int, default=10, metavar="N", help="rows shown (default 10)")
    g.add_argument("--jitter", type=float, default=None, metavar="SIGMA",
                   help="rank the shown rows by their expected step when every compute action's seconds are "
                        "times exp(SIGMA z), z ~ N(0,1) (docs/whatif.md; pipesim/plan/jitter.py)")
    g.add_argument("--jitter-seed", type=lambda t: bounded_int(t, 0), default=None, metavar="N",
                   help="with --jitter: the first draw's seed (default 0); draw k of every row uses N + k")
    g.add_argument("--samples", type=positive_int, default=None, metavar="N",
                   help="with --jitter: draws per row; rows rank by their mean step (default 8)")
    g.add_argument("--max-candidates", type=positive_int, default=DEFAULT_MAX_CANDIDATES, metavar="N",
                   help="simulate at most N candidates that fit memory, in the estimate's order "
                        f"(default {DEFAULT_MAX_CANDIDATES})")
    g.add_argument("--max-work", type=positive_int, default=DEFAULT_MAX_WORK, metavar="N",
                   help="stop the walk after N work units: p x v x m per candidate built, 20 x p x m more for "
                        f"zb-auto / zb-2p (default {DEFAULT_MAX_WORK}, about 40 s on one core)")
    g.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="processes simulating candidates (default: the machine's cores); results are the same")
    g.add_argument("--cluster", default=None, metavar="dask://HOST:PORT|ray://HOST:PORT|ray",
                   help="simulate the candidates on a running Dask scheduler or Ray cluster (extra "
                        "pipesim[cluster]; default this machine's --workers); results are the same")
    g.add_argument("--plot", default=None, metavar="FILE.html",
                   help="write throughput against peak memory of every simulated candidate (HTML, plotly)")
    g.add_argument("--png", default=None, metavar="FILE.png",
                   help="also write the figure as a PNG (needs Chromium, as `pipesim plot --png`)")
    g.add_argument("--export-csv", default=None, metavar="FILE.csv",
                   help="write the winner's schedule as a torch.distributed.pipelining CSV")
    g.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="write the plan as JSON to FILE, or to stdout without FILE")
    p.add_argument(FLAG, metavar="JOB.toml",
                   help="a torchtitan job config's job: its model, batch, sequence, precision and compile "
                        "(pipesim simulate --from-torchtitan reads the rest too); the layout is searched "
                        "(docs/frameworks.md)")
    p.add_argument(MEGATRON_FLAG, metavar="ARGS",
                   help="a Megatron-LM launch's job: pretrain_gpt.py's model, batch, sequence, precision and the "
                        "software choices the plan does not search (kernels, dispatcher, overlaps, gradient dtype); "
                        "the layout is searched (docs/frameworks.md)")
    p.set_defaults(func=run)


def _jitter(args: argparse.Namespace) -> PlanJitter | None:
    """--jitter's ranking, or None; --jitter-seed and --samples mean nothing without it (one line)."""
    if args.jitter is None:
        given = [f for f, v in (("--jitter-seed", args.jitter_seed), ("--samples", args.samples)) if v is not None]
        if given:
            raise PipesimError(f"{given[0]} needs --jitter SIGMA (the ranking under jitter it sets up)")
        return None
    return PlanJitter(args.jitter, args.jitter_seed or 0, args.samples or 8)








def _csv_path(path: str | None) -> Path | None:
    """--export-csv's file, checked before the search (a .csv in an existing folder)."""
    if path is None:
        return None
    p = Path(path)
    if p.suffix.lower() != ".csv" or p.is_dir():
        raise PipesimError(f"--export-csv {path}: writes a CSV schedule; name the file *.csv")
    if not p.parent.is_dir():
        raise PipesimError(f"--export-csv {path}: folder {p.parent} does not exist")
    return p










def cluster(args: argparse.Namespace) -> tuple[Hardware, int, list[str]]:
    """(hardware joined to its nodes, GPUs to fill, the hardware flags that reproduce it)."""
    name = args.hardware or DEFAULT_HARDWARE
    hw = load_hardware(name)
    flags = ["--hardware", name]
    if args.nvlink_domain is not None:
        hw, flags = hw.with_domain(args.nvlink_domain), flags + ["--nvlink-domain", str(args.nvlink_domain)]
    if args.power_limit is not None:
        hw, flags = capped(hw, args.power_limit), flags + ["--power-limit", f"{args.power_limit:g}"]
    per_node = hw.devices_per_node
    if args.nodes is not None:
        return hw.with_nodes(args.nodes), args.nodes * per_node, flags + ["--nodes", str(args.nodes)]
    if args.gpus is None:
        return hw, hw.num_devices, flags
    if args.gpus > per_node and args.gpus % per_node:
        raise PipesimError(f"--gpus {args.gpus} is not a multiple of {hw.name}'s {per_node} GPUs per node "
                           "(--nvlink-domain G fills G of each)")
    nodes = max(1, args.gpus // per_node)
    if nodes != hw.num_nodes:
        hw, flags = hw.with_nodes(nodes), flags + ["--nodes", str(nodes)]
    return hw, args.gpus, flags


def run_model_flags(args: argparse.Namespace, req: PlanRequest) -> list[str]:
    """The model flags `pipesim run` takes for the plan's model: the simulate export's (the same --model-config and
    structure flags build the same model in the executor) less the cost model's routing assumption, which a run
    replaces by what its router routes (exports.run_note says so), and a typed --dropout, which the executor does not
    apply (as for a GPT's default dropout)."""
    words = model_flags(args, req)
    if "--moe-load-imbalance" in words:
        at = words.index("--moe-load-imbalance")
        words = words[:at] + words[at + 2:]
    return [word for word in words if word != "--dropout"]


STEP_FLAGS = ("seq", "batch")  # the step's, not the model's: the exports give them from the request


def model_flags(args: argparse.Namespace, req: PlanRequest) -> list[str]:
    """The model flags as given (plus the step's --seq and --batch), for the exported simulate command."""
    kind = "moe" if args.model == "moe" else "gpt"  # --model moe's experts are its flags: the export keeps the kind
    out = ["--model-config", args.model_config] if args.model_config else ["--model", kind]
    out += model_flag_words(args, skip=STEP_FLAGS)  # sizes, structure, experts, routing
    return out + ["--seq", str(req.model.seq), "--batch", str(req.model.batch)]


def run(args: argparse.Namespace) -> int:
    json_path = check_file(args.json, "--json", "json")
    plot_path = check_file(args.plot, "--plot", "html")
    png_path = check_file(args.png, "--png", "png")
    check_apart([("--json", json_path), ("--plot", plot_path), ("--png", png_path)], input_files(args))
    csv_path = _csv_path(args.export_csv)
    if args.model == "mlp":
        raise PipesimError("pipesim plan searches transformer layouts; drop --model mlp")
    if args.seed is not None:  # the same line as simulate's
        raise PipesimError(SEED)
    if args.tokens_per_step is not None:
        if args.batch is not None:
            raise PipesimError("give the global batch once: --batch (sequences) or --tokens-per-step (tokens)")
        seq = args.seq if args.seq is not None else ModelConfig.seq
        if args.tokens_per_step % seq:
            raise PipesimError(f"--tokens-per-step {args.tokens_per_step} is not a multiple of --seq {seq}")
        args.batch = args.tokens_per_step // seq
    jitter = _jitter(args)
    if args.finalists is not None and args.ilp_seconds is None:
        raise PipesimError("--finalists needs --ilp [SECONDS] (the ILP search of the best K layouts it sets)")
    model = model_config(args)
    typed = typed_split(args)  # before --framework fills its switches
    shared, scheds, zeros, recomputes, sps = shared_job(args, model)
    rule = split_rule(args, typed, model)
    if args.balance_layers:
        if typed or rule:
            raise PipesimError(f"--balance-layers chooses the split itself: it cannot go with "
                               f"{typed[0] if typed else f'--framework {args.framework}'}'s split")
        rule = balanced_rule(model)
    if rule.fixes_stages:
        raise PipesimError(f"{FIRST_LAYERS}, {LAST_LAYERS} and {LAYOUT} fix one layout's layers, and the plan "
                           "searches pipeline sizes: plan with the account-for flags, or simulate the layout")
    hw, gpus, hw_flags = cluster(args)
    check_fp8_run(shared.fp8, model, hw)  # FP8 tensor cores and the recipe, before any candidate
    check_muon_device(shared.muon, hw)  # Muon's step is timed kernel by kernel: a GPU family
    if args.memory_headroom:  # the search sees the memory left after the headroom
        kept = int(hw.device.memory * (1.0 - args.memory_headroom))
        hw = dataclasses.replace(hw, device=dataclasses.replace(hw.device, memory=kept))
    req = PlanRequest(model, hw, gpus, scheds, args.max_tp, recomputes, zeros, shared, sequence_parallel=sps,
                      cps=args.cp, recompute_modules=plan_modules(model, recomputes, args.recompute_modules),
                      framework=args.framework, split_rule=rule)
    ev = Evaluator(req)
    with open_backend(args.cluster, args.workers or default_workers()) as backend:
        if args.ilp_seconds is not None and not args.ilp_seconds > 0:
            raise PipesimError(f"--ilp takes a positive number of seconds, got {args.ilp_seconds:g}")
        result = plan(req, max_candidates=args.max_candidates, max_work=args.max_work, evaluator=ev,
                      backend=backend, ilp_seconds=args.ilp_seconds, finalists=args.finalists or DEFAULT_FINALISTS)
    if jitter is not None:  # the shown rows re-ranked by their expected step (pipesim.plan.jitter)
        result.rows = rank_under_jitter(ev, result.rows, jitter, args.top)
    best = result.best.candidate.job(shared)  # the winner's switches (a profile's overlaps only where they apply)
    switches = best.comm.flags() + [f for f in best.kernels.flags(gpu=bool(hw.device.family))
                                    if f not in grad_flags(True) + grad_flags(False)]
    switches += shared.fp8.flags() if shared.fp8 is not None else []
    switches += best.state_flags() + best.precision_flags() + rule.flags()
    if isinstance(rule, BalancedSplit) and result.best.candidate.chunks > 1:  # no stack's flag: its split
        switches += ["--layer-split", ",".join(map(str, req.stage_split(result.best.candidate.chunks)))]
    if shared.cp_comm != "p2p" and result.best.candidate.cp > 1:
        switches += ["--cp-comm-type", shared.cp_comm]
    if args.ilp_seconds is not None and result.best.candidate.schedule in SEARCHED:
        switches += ["--ilp", f"{args.ilp_seconds:g}"]  # the winner's order is the ILP's
    # a float32 model's gradients are float32 already: simulate refuses the flag typed (a profile's is not typed)
    argv = simulate_command(result.best.candidate, model_flags(args, req), hw_flags + switches,
                            args.attention, shared.kernels.grad_fp32 if model.dtype != "float32" else None)
    ranks = gpus // result.best.candidate.cp  # the executor has no cp: t x p x d ranks (exports.run_note)
    per_node = ranks if ranks <= hw.host_devices else math.gcd(ranks, hw.host_devices)
    run_argv = run_command(result.best.candidate, run_model_flags(args, req), per_node=per_node,
                           nodes=ranks // per_node, split=req.stage_split(result.best.candidate.chunks))
    if args.ilp_seconds is not None and result.best.candidate.schedule in V_SEARCHED:
        run_argv += ["--ilp", f"{args.ilp_seconds:g}"]  # without it `pipesim run zb-v` runs the handcrafted order
    unchanged = not given_model_flags(args, skip=STEP_FLAGS)
    config = args.model_config if args.model_config and unchanged else None  # the bundled config, as it is
    data = plan_json(result, args.top, argv, ev.attention, run_argv, config)
    if (keys := model_config_json(args)) is not None:
        data["model_config"] = keys
    if csv_path:
        write_text(csv_path, schedule_csv(ev.cost(result.best.candidate).schedule))
    if plot_path or png_path:
        from pipesim.plots.export import write_html, write_png  # local import: plotly, kept out of start-up
        from pipesim.plots.plan_figure import plan_figure  # local import: plotly, kept out of start-up
        title = (f"pipesim plan: {req.gpus} GPUs of {hw.name}, batch {model.batch} x seq {model.seq} "
                 f"({len(result.rows)} candidates simulated)")
        fig = plan_figure([r.to_dict() for r in result.rows], title=title, device_memory=hw.device.memory)
        if plot_path:
            write_html(fig, plot_path)
        if png_path:
            write_png(fig, png_path)
    if json_path:
        emit_json(str(json_path), data)
    if args.json == "-":
        emit_json("-", data)
    else:
        print(report(result, args.top, argv, ev.attention, run_argv, config))
    return 0
