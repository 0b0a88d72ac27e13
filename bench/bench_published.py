"""Published large-scale training results against pipesim's predictions (issue 15): writes docs/published.md.

Every row of bench/published_rows.toml is a paper's figure and the `pipesim simulate` command a user would type for
its configuration; the command runs as typed (through pipesim.cli.main, with --json), and its JSON becomes the
paper's unit by the paper's own formula (METRICS). Rows, relative effects, trends and the switches of the
per-mechanism breakdown are data: adding a paper is adding rows. No figure here is tuned to a row; the report
(bench/published_report.py) computes every number from the rows and the runs. Each distinct command runs once,
on --jobs processes (the simulator is deterministic, so the order of the runs changes nothing). The formulas, the
switches and the runs of one benchmark; its report is bench/published_report.py, the one-figure diagnosis of the
residual bench/published_diagnosis.py.

    pipesim bench published                                  # all rows + breakdown -> docs/published.md
    pipesim bench published -- --out /tmp/p.md --only KOR22  # one source
    pipesim bench published -- --out /tmp/p.md --no-breakdown --no-diagnosis
    pipesim bench published -- --out /tmp/p.md --hardware dgx-a100=gpu_calibration/hardware.toml
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from pipesim.cli import OneLineParser
from pipesim.cli import main as pipesim_main
from pipesim.errors import PipesimError
from pipesim.timeline import Timeline

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
ROWS = ROOT / "bench" / "published_rows.toml"
OUT = ROOT / "docs" / "published.md"


def _sibling(name: str):
    """bench/<name>.py as a module: `pipesim bench` loads the bench scripts by path, not as a package."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


report = _sibling("published_report")
diagnosis = _sibling("published_diagnosis")
commands = _sibling("published_commands")
goals = _sibling("published_goals")
metrics = _sibling("published_metrics")
METRICS, gpus, without_optimizer = metrics.METRICS, metrics.gpus, metrics.without_optimizer
Switch, parse_command, switched_argv = commands.Switch, commands.parse_command, commands.switched_argv
hardware_variant, substitute_hardware = commands.hardware_variant, commands.substitute_hardware
Result, Row, Switched = report.Result, report.Row, report.Switched
render, stats, stats_line = report.render, report.stats, report.stats_line


# ---- rows and switches ---------------------------------------------------------------------------------------

def load(path: Path = ROWS) -> dict:
    """The TOML file as rows (list[Row]), sources, effects, trends, mechanisms and their switches (list[Switch])."""
    data = tomllib.loads(path.read_text())
    rows = []
    for r in data["rows"]:
        if r["metric"] not in METRICS or r["source"] not in data["sources"]:
            raise ValueError(f"row {r['id']}: unknown metric {r['metric']!r} or source {r['source']!r}")
        metric = METRICS[r["metric"]]
        cluster, work = rank_key(parse_command(r["command"])[1])
        rows.append(Row(id=r["id"], source=r["source"], table=r["table"], configuration=r["configuration"],
                        metric=r["metric"], command=r["command"], published=r.get("published"), unit=metric.unit,
                        faster_is_higher=metric.faster_is_higher, cluster=cluster, work=work))
    for key, src in data["sources"].items():
        goals.source_goal(key, src)  # an unknown `goal` is refused here, naming its source
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate row ids")
    for ref in [i for e in data.get("effects", []) for p in e["pairs"] for i in p] + \
               [i for t in data.get("trends", []) for i in t["rows"]]:
        if ref not in ids:
            raise ValueError(f"effect or trend names an unknown row {ref!r}")
    mechanisms = data.get("mechanisms", [])
    for d in data.get("diagnosis", []):
        if d["anchor"] not in ids:
            raise ValueError(f"diagnosis names an unknown row {d['anchor']!r}")
    return {"rows": rows, "sources": data["sources"], "effects": data.get("effects", []),
            "trends": data.get("trends", []), "mechanisms": mechanisms, "switches": commands.switches(mechanisms),
            "diagnosis": data.get("diagnosis", [])}


def rank_key(args: argparse.Namespace) -> tuple[str, float]:
    """(the model and cluster a row's command runs, tokens per GPU per iteration): issue 33's rankings compare the
    rows of one model on one cluster, its GPU count included ("the same model on the same cluster": schedules,
    interleaving, recomputation, layouts; bench/published_goals.py), a time as work / time. The model is the
    bundled config's name or file with the shape flags that override it (a proxy of fewer layers, --layers 8, is
    another model: "llama3-405b L8"), or a --model gpt's shape."""
    if args.cost is not None:  # hand-given seconds (a test's row): no model, its work one unit per GPU
        return f"--cost {args.cost} on {gpus(args)} x {args.hardware}", 1.0
    shape = (("h", args.hidden), ("L", args.layers), ("a", args.heads), ("kv", args.kv_heads),
             ("f", args.ffn_hidden), ("V", args.vocab), (" ", args.activation))
    given = "".join(f"{k}{v}" for k, v in shape if v is not None)
    if args.model_config:
        model = str(args.model_config) + (" " + given if given else "")
    else:
        model = args.model + " " + given
    return f"{model} on {gpus(args)} x {args.hardware}", args.batch * args.seq / gpus(args)


def features(args: argparse.Namespace) -> str:
    """The features a row's command uses, from its flags."""
    out = [args.name + (f" v={args.virtual}" if args.virtual else ""),
           f"tp {args.tp} pp {args.stages} dp {args.dp}" + (f" cp {args.cp}" if args.cp > 1 else "")
           + (f" ep {args.ep} etp {args.tp if args.etp is None else args.etp}" if args.ep > 1 else ""),
           f"recompute {args.recompute}" if args.recompute != "none" else "no recompute"]
    if args.sequence_parallel:
        out.append("SP")
    if args.ep > 1:
        flex = "Hybrid-EP" if args.moe_flex_dispatcher_backend == "hybridep" else "DeepEP"
        out.append(flex if args.moe_token_dispatcher_type == "flex" else "NCCL all-to-all")
    if args.attention:
        out.append(f"{args.attention} attention")
    if args.zero:
        out.append(f"ZeRO {args.zero}")
    if args.optimizer != "adam":
        out.append(args.optimizer + (" (Nesterov)" if args.muon_use_nesterov else ""))
    if args.scatter_gather and args.tp > 1 and not args.sequence_parallel:  # a no-op otherwise
        out.append("scatter/gather")
    if not args.tp_comm_overlap and args.tp > 1:
        out.append("blocking TP backward")
    if args.tp_comm_overlap_ub:
        cfg = Path(args.tp_comm_overlap_cfg).name if args.tp_comm_overlap_cfg else "TE's defaults"
        out.append(f"TP overlap (userbuffers, {cfg})")
    if not args.grad_accum_fusion:
        out.append("unfused gradient accumulation")
    if args.blocking_p2p and args.stages > 1:
        out.append("blocking p2p")
    if args.fp4_format:
        out.append(f"{args.fp4_recipe or 'nvfp4'} (NVFP4)")
    elif args.fp8_format:
        out.append(f"FP8 {args.fp8_recipe or 'delayed'}" + (" (torchao)" if args.fp8_impl == "torchao" else ""))
    if args.fp8_param_gather:
        out.append("FP8 parameter gather")
    if args.cuda_graph_impl != "none":
        out.append(f"CUDA graphs ({args.cuda_graph_impl}: {' '.join(args.cuda_graph_scope or ['whole layer'])})")
    if args.overlap_grad_reduce and args.dp > 1:
        out.append("DP overlap" + (f", {args.ddp_bucket_size:,}-parameter buckets" if args.ddp_bucket_size else ""))
    hardware = Path(str(args.hardware))
    if hardware.is_absolute() and hardware.is_relative_to(ROOT):  # a repository file: as typed, from the root
        hardware = hardware.relative_to(ROOT)
    out.append(f"{args.nodes} x {hardware}" if args.nodes else str(hardware))
    return ", ".join(out)


# ---- runs ----------------------------------------------------------------------------------------------------

def run_argv(argv: list[str], actions: bool = False) -> dict | str:
    """Run `pipesim <argv> --json`; the JSON's parts the metrics read, or the failure's last line. With `actions`
    (a metric with `needs_actions`) also `--trace`, whose timeline gives every compute action's span: the JSON has
    only the critical path's, and a trace costs about as much again as a large run, so only where a metric reads it."""
    with tempfile.TemporaryDirectory() as tmp:
        out, trace = Path(tmp) / "sim.json", Path(tmp) / "trace.json"
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = pipesim_main(argv + ["--json", str(out)] + (["--trace", str(trace)] if actions else []))
        if code != 0:
            said = err.getvalue().strip().splitlines()
            return said[-1] if said else f"exit {code}"
        sim = json.loads(out.read_text())
        spans = ({"actions": [{"name": e.label, "kind": "compute", "rank": e.rank, "start": e.start, "end": e.end}
                              for e in Timeline.read(trace).events if e.stream == "compute"]} if actions else {})
    return {"step_time": sim.get("step_time", sim["makespan"]), "makespan": sim["makespan"],
            "critical_path": [a for a in sim["critical_path"] if a["kind"] == "compute"],
            "ranks": [{k: r[k] for k in ("step_end", "optimizer") if k in r} for r in sim.get("ranks", [])], **spans}


def needs_actions(row: Row) -> bool:
    """Whether the row's metric reads an action off the critical path (its run keeps every compute action)."""
    return METRICS[row.metric].needs_actions


def _timed(job: tuple[list[str], bool]) -> tuple[dict | str, float]:
    t0 = time.perf_counter()
    return run_argv(*job), time.perf_counter() - t0


def run_all(argvs: list[list[str]], jobs: int, label: Callable[[list[str]], str],
            actions: set[tuple[str, ...]] = frozenset()) -> dict[tuple[str, ...], dict | str]:
    """Each distinct argv once, on `jobs` processes (1: in this one); printed as they end. The argvs in `actions`
    keep every compute action (run_argv)."""
    unique = list(dict.fromkeys(tuple(a) for a in argvs))
    out: dict[tuple[str, ...], dict | str] = {}

    def done(key: tuple[str, ...], sim: dict | str, seconds: float) -> None:
        out[key] = sim
        shown = "ok" if isinstance(sim, dict) else f"FAILED {sim}"
        print(f"{seconds:6.1f} s  [{len(out)}/{len(unique)}] {label(list(key))}: {shown}", flush=True)

    work = [(list(k), k in actions) for k in unique]
    if jobs <= 1:
        for key, job in zip(unique, work):
            done(key, *_timed(job))
        return out
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for key, (sim, seconds) in zip(unique, pool.map(_timed, work)):
            done(key, sim, seconds)
    return out


def result(row: Row, sim: dict | str, args: argparse.Namespace, *, no_optimizer: bool = False) -> Result:
    if isinstance(sim, str):
        return Result(row, None, features(args), failure=sim)
    return Result(row, METRICS[row.metric].convert(without_optimizer(sim) if no_optimizer else sim, args),
                  features(args))


def evaluate(data: dict, jobs: int, breakdown: bool, directory: Path) -> tuple[list[Result], list[Switched]]:
    """Every row as typed and, with `breakdown`, every row under every switch."""
    parsed = {r.id: parse_command(r.command) for r in data["rows"]}
    plans: list[tuple[Switch, list[tuple[Row, list[str]]]]] = []
    if breakdown:
        for sw in data["switches"]:
            plans.append((sw, [(r, switched_argv(r.command, sw, directory) or parsed[r.id][0])
                               for r in data["rows"]]))  # the effect-only rows too: the effects under each switch
    labels: dict[tuple[str, ...], str] = {}
    actions = {tuple(parsed[r.id][0]) for r in data["rows"] if needs_actions(r)}
    for r in data["rows"]:
        labels.setdefault(tuple(parsed[r.id][0]), r.id)
    for sw, runs in plans:
        for r, a in runs:
            labels.setdefault(tuple(a), f"{r.id} [{sw.mechanism}, {report.label_head(sw.label)}]")
            if needs_actions(r):
                actions.add(tuple(a))
    sims = run_all([list(k) for k in labels], jobs, lambda a: labels[tuple(a)], actions)
    results = [result(r, sims[tuple(parsed[r.id][0])], parsed[r.id][1]) for r in data["rows"]]
    switched = [Switched(sw.mechanism, sw.label, [result(r, sims[tuple(a)], parsed[r.id][1],
                                                         no_optimizer=sw.without_optimizer) for r, a in runs],
                         sw.heading)
                for sw, runs in plans]
    return results, switched


def machine_line() -> str:
    return (f"{platform.node()}: {platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}")


def restrict(data: dict, only: str) -> dict:
    """`data` with the sources of --only (comma-separated) and what names only their rows."""
    keep = set(only.split(","))
    unknown = keep - set(data["sources"])
    if unknown:
        raise PipesimError(f"--only: unknown source {', '.join(sorted(unknown))}")
    rows = [r for r in data["rows"] if r.source in keep]
    ids = {r.id for r in rows}
    return {**data, "sources": {k: v for k, v in data["sources"].items() if k in keep}, "rows": rows,
            "effects": [e for e in data["effects"] if all(i in ids for pr in e["pairs"] for i in pr)],
            "trends": [t for t in data["trends"] if all(i in ids for i in t["rows"])]}


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="pipesim bench published", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=Path, default=ROWS, help="rows file (default bench/published_rows.toml)")
    p.add_argument("--out", type=Path, default=OUT, help="markdown report (default docs/published.md)")
    p.add_argument("--only", default=None, help="comma-separated sources (default all)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    p.add_argument("--no-breakdown", action="store_true", help="skip the per-mechanism breakdown's runs")
    p.add_argument("--no-diagnosis", action="store_true", help="skip the one-figure diagnosis of the residual")
    p.add_argument("--hardware", action="append", default=[], metavar="PRESET=FILE",
                   help="run every row that uses PRESET on FILE instead (a `pipesim calibrate --gpu` file); repeatable")
    args = p.parse_args(argv)
    try:
        data = load(args.rows)
    except (OSError, ValueError, KeyError) as e:  # TOMLDecodeError is a ValueError
        raise PipesimError(f"{args.rows}: {e}") from None
    if args.only:
        data = restrict(data, args.only)
    if args.hardware:
        data = substitute_hardware(data, args.hardware)
    start = time.time()
    in_ref = {k for k, s in data["sources"].items() if s.get("in_published_md", True)}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            results, switched = evaluate(data, args.jobs, not args.no_breakdown, Path(tmp))
            goal = [r for r in data["rows"] if r.published is not None and r.source in in_ref]
            others = [r for r in data["rows"] if r.published is not None and r.source not in in_ref]
            diagnoses = [] if args.no_diagnosis else diagnosis.diagnose(data, sys.modules[__name__], goal, args.jobs,
                                                                        Path(tmp), others)
        except ValueError as e:
            raise PipesimError(f"{args.rows}: {e}") from None
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start))
    header = ["# Published results: predicted vs measured", "",
              f"Generated by `pipesim bench published` on {when} in {time.time() - start:.0f} s "
              f"({args.jobs} processes); do not edit by hand, rerun it.", "", f"- Machine: {machine_line()}.",
              *([f"- Hardware substituted in every row: {', '.join(args.hardware)} (`--hardware`)."]
                if args.hardware else []),
              "- Predicted iteration time: the simulator's `step_time` (to the optimizer's end). NAR21's TFLOP/s "
              "per GPU = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) / (iteration seconds x GPUs) (NAR21 eq. 3, "
              "counting the recompute pass); KOR22 Table 5 in seconds per iteration; KOR22 Table 4 as one layer's "
              "forward and backward action times (the middle stage of a 0,1,0 layer split, TP communication "
              "included); ZB24 Table 9 as the F, I (the paper's T_B) and W action times of the stage p // 2 of one "
              "zb-h1 microbatch (every compute action's span from the run's --trace); Llama 3's TFLOP/s per GPU = "
              "(6 N + 12 L H Q T) x tokens per step / (iteration seconds x GPUs), PaLM's MFU numerator (N: "
              "parameters without the embedding table)."]
    text = render(data, results, header, switched, goals.goal_lines(data["sources"], results, stats))
    text += "\n".join(diagnosis.lines(diagnoses, stats, report.pct)) + ("\n" if diagnoses else "")
    args.out.write_text(text)
    print(f"wrote {args.out}")
    published = [r for r in results if r.row.published is not None]
    ref = [r for r in published if r.row.source in in_ref]
    if ref:
        print(stats_line("published.md rows", stats(ref)))
    other = [r for r in published if r.row.source not in in_ref]
    if other:
        print(stats_line("other sources", stats(other)))
    for line in goals.goal_lines(data["sources"], results, stats):
        print(line.replace("**", ""))
    return 1 if any(r.predicted is None for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
