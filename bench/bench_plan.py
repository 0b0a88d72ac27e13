"""`pipesim plan` on every published model (issue 18): time, winner, and the published configuration's
predicted step time, simulated in the same search (`include`), with the margin.

Models and published layouts: the NAR21 Table 1 rows and KOR22's selective + sequence-parallel rows of
bench/published_rows.toml (their `pipesim simulate` commands are parsed for the model, the layout and the
attention kernel), plus Llama 3 405B on 16,384 H100s (2048 dgx-h100 nodes; Llama 3 paper, Table 4, as recalled:
TP 8, CP 1, PP 16, DP 128, 16 sequences of 8192 tokens per DP rank, 16M tokens per step). The search space is
the planner's default plus sequence parallelism on and off (NAR21 ran t 8 without it) and ZeRO 0 (NAR21 and
KOR22 predate the distributed optimizer, so ZeRO 0 is their layout).

    .venv/bin/python bench/bench_plan.py                 # every model, a Markdown table on stdout
    .venv/bin/python bench/bench_plan.py --only nar21-1.7b --workers 2
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
import time
from pathlib import Path

from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.hf_config import load_hf_config
from pipesim.plan.search import default_workers, plan
from pipesim.plan.space import Candidate, PlanRequest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROWS = Path(__file__).resolve().parent / "published_rows.toml"
NAR21_TABLE_1 = tuple(f"nar21-{x}" for x in ("1.7b", "3.6b", "7.5b", "18.4b", "39.1b", "76.1b", "145.6b", "310.1b",
                                               "529.6b", "1008b"))


def published_models() -> list[tuple[str, PlanRequest, Candidate]]:
    """(id, request, published candidate) for the NAR21 Table 1 and KOR22 selective + SP rows."""
    rows = tomllib.loads(ROWS.read_text())["rows"]
    out = []
    for row in rows:
        rid = row["id"]
        if rid not in NAR21_TABLE_1 and not (rid.startswith("kor22-") and rid.endswith("-selective-sp")):
            continue
        if "--layer-split" in row["command"]:
            continue
        out.append((rid, *from_command(row["command"])))
    out.append(("llama3-405b", *llama3_405b()))
    return out


def from_command(command: str) -> tuple[PlanRequest, Candidate]:
    """The request and published candidate of one `pipesim simulate` command of published_rows.toml."""
    argv = shlex.split(command)[2:]
    schedule, flags = argv[0], {}
    i = 1
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[argv[i]], i = argv[i + 1], i + 2
        else:
            flags[argv[i]], i = True, i + 1
    model = ModelConfig(kind="gpt", hidden=int(flags["--hidden"]), layers=int(flags["--layers"]),
                        heads=int(flags["--heads"]), seq=int(flags["--seq"]), vocab=int(flags["--vocab"]),
                        batch=int(flags["--batch"]), dtype=flags["--dtype"])
    nodes = int(flags["--nodes"])
    hw = load_hardware(flags["--hardware"]).with_nodes(nodes)
    p, t, d, mbs = (int(flags[k]) for k in ("--stages", "--tp", "--dp", "--microbatch-size"))
    req = PlanRequest(model, hw, nodes * hw.devices_per_node, job=Job(attention=flags.get("--attention")),
                      sequence_parallel=(False, True), zeros=(0, 1))
    published = Candidate(schedule, p, int(flags.get("--virtual", 1)), t, d, mbs, model.batch // (d * mbs),
                          flags.get("--recompute", "none"), 0, "--sequence-parallel" in flags)
    return req, published


def llama3_405b() -> tuple[PlanRequest, Candidate]:
    model = load_hf_config("llama3-405b", seq=8192, batch=2048, dtype="bfloat16")
    hw = load_hardware("dgx-h100").with_nodes(2048)
    req = PlanRequest(model, hw, 16384, zeros=(0, 1, 2))
    # Llama 3: 1F1B-family interleaving over 16 stages; here the plain 1F1B layout of the same p, t, d. Its FSDP
    # shards optimizer states and gradients (section 3.3.2): ZeRO 2, as docs/published_examples.md reads it; the
    # gradients are float32 (bfloat16's default, and the paper's FP32 reduce-scatter)
    return req, Candidate("1f1b", 16, 1, 8, 128, 1, 16, "none", 2, True)


def run_one(rid: str, req: PlanRequest, published: Candidate, workers: int) -> dict:
    start = time.perf_counter()
    result = plan(req, progress=False, workers=workers, include=(published,))
    seconds = time.perf_counter() - start
    pub = next((r for r in result.rows if r.candidate == published), None)
    best = result.best
    return {"id": rid, "seconds": seconds, "winner": best.candidate.label(), "winner_step": best.step_time,
            "published": published.label(), "published_step": pub.step_time if pub else None,
            "over": next((peak for c, peak in result.over if c == published), None),
            "counts": result.counts, "gpus": req.gpus}


def markdown(results: list[dict], workers: int) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"`bench/bench_plan.py`, {now}, {platform.node()} ({os.cpu_count()} cores, "
             f"{platform.processor() or platform.machine()}), --workers {workers}.", "",
             "| model | GPUs | plan s | simulated | winner | step s | published configuration | step s | "
             "margin |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        pub = r["published_step"]
        if pub is None:
            pub_text, margin = f"over memory ({r['over'] / 2**30:.1f} GiB)" if r["over"] else "refused", "-"
        else:
            pub_text, margin = f"{pub:.3f}", f"{(pub / r['winner_step'] - 1) * 100:+.1f} %"
        lines.append(f"| {r['id']} | {r['gpus']} | {r['seconds']:.1f} | {r['counts']['simulated']} | "
                     f"{r['winner']} | {r['winner_step']:.3f} | {r['published']} | {pub_text} | {margin} |")
    lines.append("")
    lines.append("margin: how much longer the published configuration's predicted step is than the winner's.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="comma-separated ids")
    ap.add_argument("--workers", type=int, default=default_workers())
    args = ap.parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else None
    results = []
    for rid, req, published in published_models():
        if wanted and rid not in wanted:
            continue
        r = run_one(rid, req, published, args.workers)
        print(f"{rid}: {r['seconds']:.1f} s, winner {r['winner']} {r['winner_step']:.3f} s, published "
              f"{r['published_step']}", file=sys.stderr, flush=True)
        results.append(r)
    print(markdown(results, args.workers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
