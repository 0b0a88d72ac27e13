"""Collective bandwidth benchmark (nccl-tests conventions), run under torchrun on any backend.

Launch with `pipesim bench collectives --nproc 2 --sizes 1K,1M,16M` (or `--lecture`): it checks the
flags, then runs `torchrun --standalone --nproc-per-node 2 -m executor.collectives_bench --config JSON`,
the JSON being a `CollectivesConfig` (executor/collectives_config.py).

Sizes are the whole buffer S (nccl-tests' "size"): all_gather's output, reduce_scatter's input,
scatter's root input, gather's root output, all_to_all's input on each rank (S / n to each peer, as a MoE
layer's token dispatch sends). algbw = S / t; busbw = algbw x factor, the factor being what a ring moves per
link (all_reduce 2(n-1)/n, all_gather/reduce_scatter/scatter/gather/all_to_all (n-1)/n,
broadcast/reduce/send_recv 1), so busbw is comparable across ops and world sizes. Each result is
checked (e.g. all_reduce of rank+1 gives n(n+1)/2) before it is timed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from executor.collectives_config import CollectivesConfig
from executor.config_json import config_argument
from pipesim.comm.collective_costs import busbw_factor as _ring_factor
from pipesim.errors import PipesimError
from pipesim.outputs import write_text

USAGE = "usage: python -m executor.collectives_bench --config JSON|FILE (as `pipesim bench collectives` runs it)"
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.13
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class Result:
    """One (op, size) measurement; seconds, bytes, bytes/s."""

    op: str
    bytes: int  # S, the whole buffer
    time: float  # seconds per call, slowest rank
    algbw: float  # bytes/s = bytes / time
    busbw: float  # bytes/s = algbw * busbw_factor
    busbw_factor: float
    iters: int
    verified: bool  # the collective's result was checked against its closed form


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests factor; scatter and gather are not in pipesim.comm.collective_costs, nccl-tests uses (n-1)/n."""
    if op in ("scatter", "gather"):
        return (n - 1) / n
    return _ring_factor(op, n)


def _case(op: str, nbytes: int, dev: torch.device) -> tuple[int, Callable[[], None], Callable[[], bool]]:
    """(bytes actually used, one call of the op, check of the first call's result)."""
    n, r = dist.get_world_size(), dist.get_rank()
    numel = max(n, nbytes // 4 // n * n)  # float32 elements, a multiple of n
    chunk = numel // n
    total = n * (n + 1) / 2  # sum over ranks of (rank + 1)
    f = dict(dtype=torch.float32, device=dev)
    pat = (torch.arange(numel, device=dev) % 251).to(torch.float32)  # small integers: every sum stays exact
    owner = torch.arange(n, **f).repeat_interleave(chunk)  # the rank each element of a gathered buffer came from
    mine = slice(r * chunk, (r + 1) * chunk)
    if op == "all_reduce":
        x = torch.full((numel,), r + 1.0, **f)
        return numel * 4, lambda: dist.all_reduce(x), lambda: bool((x == total).all())
    if op == "reduce":
        x = torch.full((numel,), r + 1.0, **f)
        return numel * 4, lambda: dist.reduce(x, dst=0), lambda: r != 0 or bool((x == total).all())
    if op == "broadcast":
        x = pat.clone() if r == 0 else torch.zeros(numel, **f)
        return numel * 4, lambda: dist.broadcast(x, src=0), lambda: bool(torch.equal(x, pat))
    if op == "all_gather":
        x, out = torch.full((chunk,), float(r), **f), torch.empty(numel, **f)
        return numel * 4, lambda: _all_gather_flat(out, x), lambda: bool(torch.equal(out, owner))
    if op == "reduce_scatter":
        x, out = pat + r, torch.empty(chunk, **f)
        want = pat[mine] * n + (total - n)  # sum over ranks of (pat + rank)
        return numel * 4, lambda: _reduce_scatter_flat(out, x), lambda: bool(torch.equal(out, want))
    if op == "all_to_all":  # chunk j of every rank goes to rank j: rank r receives each rank's chunk r
        x, out = torch.full((numel,), float(r), **f), torch.empty(numel, **f)
        return numel * 4, lambda: dist.all_to_all_single(out, x), lambda: bool(torch.equal(out, owner))
    if op == "scatter":
        parts, out = (list(pat.chunk(n)) if r == 0 else None), torch.empty(chunk, **f)
        return numel * 4, lambda: dist.scatter(out, parts, src=0), lambda: bool(torch.equal(out, pat[mine]))
    if op == "gather":
        x = torch.full((chunk,), float(r), **f)
        outs = [torch.empty(chunk, **f) for _ in range(n)] if r == 0 else None
        return numel * 4, lambda: dist.gather(x, outs, dst=0), \
            lambda: r != 0 or bool(torch.equal(torch.cat(outs), owner))
    if op == "send_recv":  # a ring: each rank sends S to rank+1 and receives S from rank-1
        x, out = torch.full((numel,), float(r), **f), torch.empty(numel, **f)

        ops = [dist.P2POp(dist.isend, x, (r + 1) % n), dist.P2POp(dist.irecv, out, (r - 1) % n)]

        def ring() -> None:  # batched: NCCL would deadlock on a separate send then recv at n = 2
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        return numel * 4, ring, lambda: bool((out == (r - 1) % n).all())
    raise PipesimError(f"unknown collective {op!r}")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _slowest(value: float, dev: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def measure(op: str, nbytes: int, iters: int, warmup: int, dev: torch.device) -> Result:
    """Check one call, then warm up, barrier + synchronize, time `iters` calls, synchronize + barrier."""
    used, run, check = _case(op, nbytes, dev)
    run()
    _sync(dev)
    ok = _slowest(0.0 if check() else 1.0, dev) == 0.0  # every rank's check passed
    if not ok:
        raise RuntimeError(f"{op} of {used} bytes returned a wrong result on some rank")
    for _ in range(warmup):
        run()
    _sync(dev)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        run()
    _sync(dev)
    dist.barrier()
    seconds = _slowest((time.perf_counter() - start) / iters, dev)
    factor = busbw_factor(op, dist.get_world_size())
    algbw = used / seconds
    return Result(op, used, seconds, algbw, algbw * factor, factor, iters, ok)


def _lecture_time(call: Callable[[], None], dev: torch.device) -> float:
    """Seconds of one call on this rank, bracketed the lecture's way."""
    call()  # warm-up
    _sync(dev)
    dist.barrier()
    start = time.perf_counter()
    call()
    _sync(dev)
    dist.barrier()
    return time.perf_counter() - start


def lecture(elements: int, dev: torch.device) -> dict:
    """The lecture's demo, literally: one warm-up, synchronize + barrier, one timed call, synchronize + barrier.

    all_reduce of N float32: sent = 4N * 2(n-1); reduce_scatter of an (n, N) input: sent = 4nN * (n-1);
    bandwidth = sent / (n * duration), which equals nccl-tests' busbw for S = 4N and S = 4nN.
    """
    n = dist.get_world_size()
    x = torch.randn(elements, device=dev)
    duration = {"all_reduce": _lecture_time(lambda: dist.all_reduce(x), dev)}
    data_bytes = {"all_reduce": 4 * elements}  # bytes
    sent = {"all_reduce": 4 * elements * 2 * (n - 1)}  # bytes
    del x
    x, y = torch.randn(n, elements, device=dev), torch.empty(elements, device=dev)
    flat = x.view(-1)  # gloo checks dim 0 (n N vs N); NCCL only the element count
    duration["reduce_scatter"] = _lecture_time(lambda: _reduce_scatter_flat(y, flat), dev)
    data_bytes["reduce_scatter"] = 4 * n * elements
    sent["reduce_scatter"] = 4 * n * elements * (n - 1)
    out: dict = {"elements": elements, "world_size": n}
    for op in ("all_reduce", "reduce_scatter"):
        gathered = [torch.zeros(1, dtype=torch.float64, device=dev) for _ in range(n)]
        dist.all_gather(gathered, torch.tensor([duration[op]], dtype=torch.float64, device=dev))
        per_rank = [float(d.item()) for d in gathered]  # seconds
        out[op] = {"data_bytes": data_bytes[op], "sent_bytes": sent[op], "duration": per_rank,
                   "bandwidth": [sent[op] / (n * d) for d in per_rank]}  # bytes/s per rank
    return out


def render_table(results: list[Result]) -> str:
    lines = [f"{'op':<15}{'bytes':>12}{'time (us)':>12}{'algbw (GB/s)':>14}{'busbw (GB/s)':>14}"]
    for r in results:
        lines.append(f"{r.op:<15}{r.bytes:>12}{r.time * 1e6:>12.1f}{r.algbw / 1e9:>14.3f}{r.busbw / 1e9:>14.3f}")
    return "\n".join(lines)


def render_lecture(res: dict) -> str:
    lines = [f"lecture demo: {res['elements']} float32 elements, world size {res['world_size']}"]
    for op in ("all_reduce", "reduce_scatter"):
        for rank, (d, bw) in enumerate(zip(res[op]["duration"], res[op]["bandwidth"])):
            lines.append(f"[{op}] rank {rank}: took {d:.6f} s, bandwidth = {bw / 1e9:.3f} GB/s "
                         f"({bw / 1024**3:.3f} GiB/s, the lecture's unit)")
    return "\n".join(lines)


def write_plot(results: list[Result], path: str, title: str) -> None:
    """busbw vs size per op, as one self-contained HTML file."""
    import plotly.graph_objects as go  # plotly: only rank 0 with --plot pays for it

    fig = go.Figure()
    for op in dict.fromkeys(r.op for r in results):
        rows = [r for r in results if r.op == op]
        fig.add_trace(go.Scatter(x=[r.bytes for r in rows], y=[r.busbw / 1e9 for r in rows], mode="lines+markers",
                                 name=op, customdata=[r.time * 1e6 for r in rows],
                                 hovertemplate="%{x} B: busbw %{y:.3f} GB/s, %{customdata:.1f} us"))
    fig.update_layout(title=title, xaxis_title="size S (bytes)", yaxis_title="busbw (GB/s, 1e9 B/s)")
    fig.update_xaxes(type="log")
    write_text(path, fig.to_html(include_plotlyjs=True))  # atomic


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = CollectivesConfig.from_json(config_argument(sys.argv[1:] if argv is None else argv, USAGE)).check()
    except PipesimError as exc:
        print(f"pipesim: error: {exc}", file=sys.stderr)
        return 2
    sizes, ops = cfg.sizes, cfg.ops
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout))
    try:
        n, rank = dist.get_world_size(), dist.get_rank()
        report: dict = {"backend": backend, "world_size": n, "device": str(dev.type),
                        "units": {"time": "seconds", "bytes": "bytes", "algbw": "bytes/s", "busbw": "bytes/s"}}
        if cfg.lecture:
            elements = cfg.elements or (100_000_000 if dev.type == "cuda" else 10_000_000)
            report["lecture"] = lecture(elements, dev)
            text = render_lecture(report["lecture"])
        else:
            results = [measure(op, s, cfg.iters, cfg.warmup, dev) for op in ops for s in sizes]
            report["results"] = [asdict(r) for r in results]
            text = render_table(results)
            if rank == 0 and cfg.plot:
                write_plot(results, cfg.plot, f"busbw vs size, {backend}, {n} ranks")
        if rank == 0:
            if cfg.json == "-":
                print(json.dumps(report, indent=2))
            else:
                print(f"{backend}, {n} ranks, {dev.type}\n{text}", flush=True)
                if cfg.json:
                    write_text(cfg.json, json.dumps(report, indent=2))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
