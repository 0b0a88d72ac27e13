"""The plan's figure: throughput (tokens/s) against peak memory per GPU for every candidate simulated, one
colour per schedule, the Pareto front (no other candidate both faster and lighter) joined and ringed, the
winner starred, and the configuration on hover. Reads `pipesim plan --json`'s rows (`plan_front` is the
plain computation, testable without plotly).
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from pipesim.plots.style import SCHEDULE_COLOURS, base_layout

GiB = 2.0**30


def plan_front(rows: Sequence[dict]) -> list[dict]:
    """Rows no other row dominates (no less throughput and no more memory, one strictly better), by memory."""
    def dominated(a: dict) -> bool:
        return any(b["tokens_per_s"] >= a["tokens_per_s"] and b["peak_memory"] <= a["peak_memory"]
                   and (b["tokens_per_s"], b["peak_memory"]) != (a["tokens_per_s"], a["peak_memory"]) for b in rows)

    return sorted((r for r in rows if not dominated(r)), key=lambda r: (r["peak_memory"], -r["tokens_per_s"]))


def _label(r: dict) -> str:
    v = f" v{r['virtual']}" if r["virtual"] > 1 else ""
    sp = " sp" if r.get("sequence_parallel") else ""
    cp = f" cp{r['cp']}" if r.get("cp", 1) > 1 else ""
    return (f"{r['schedule']} p{r['pp']}{v} t{r['tp']}{sp}{cp} d{r['dp']} mbs{r['microbatch_size']} "
            f"m{r['microbatches']} rc={r['recompute']} zero{r['zero']}")


def _hover(r: dict) -> str:
    return (f"{_label(r)}<br>step {r['step_time'] * 1e3:.2f} ms, {r['tokens_per_s']:.0f} tokens/s, "
            f"MFU {r['mfu'] * 100:.1f}%<br>peak {r['peak_memory'] / GiB:.2f} GiB, bubble "
            f"{r['bubble_fraction'] * 100:.1f}%")


def plan_figure(rows: Sequence[dict], *, title: str, device_memory: int | None = None) -> go.Figure:
    """One marker per simulated candidate (x: GiB per GPU, y: tokens/s), coloured by schedule; the front joined."""
    rows = list(rows)
    names = sorted({r["schedule"] for r in rows})
    colours = {n: SCHEDULE_COLOURS[i % len(SCHEDULE_COLOURS)] for i, n in enumerate(names)}
    fig = go.Figure()
    for name in names:
        group = [r for r in rows if r["schedule"] == name]
        fig.add_trace(go.Scatter(
            x=[r["peak_memory"] / GiB for r in group], y=[r["tokens_per_s"] for r in group], mode="markers",
            name=name, marker={"color": colours[name], "size": 8, "opacity": 0.75},
            hovertext=[_hover(r) for r in group], hoverinfo="text"))
    front = plan_front(rows)
    fig.add_trace(go.Scatter(
        x=[r["peak_memory"] / GiB for r in front], y=[r["tokens_per_s"] for r in front], mode="lines+markers",
        name="Pareto front", line={"color": "#333333", "width": 1, "dash": "dot"},
        marker={"size": 14, "symbol": "circle-open", "color": "#333333", "line": {"width": 2}},
        hovertext=[_hover(r) for r in front], hoverinfo="text"))
    best = max(rows, key=lambda r: (r["tokens_per_s"], -r["peak_memory"]))
    fig.add_trace(go.Scatter(
        x=[best["peak_memory"] / GiB], y=[best["tokens_per_s"]], mode="markers", name="winner",
        marker={"size": 18, "symbol": "star", "color": "#d62728"}, hovertext=[_hover(best)], hoverinfo="text"))
    layout = base_layout(title)
    layout.update(xaxis={"title": {"text": "peak memory per GPU (GiB)"}},
                  yaxis={"title": {"text": "throughput (tokens/s)"}})
    fig.update_layout(**layout)
    if device_memory:
        fig.add_vline(x=device_memory / GiB, line={"color": "#999999", "dash": "dash"},
                      annotation_text="device memory", annotation_position="top left")
    return fig


__all__ = ["plan_figure", "plan_front"]
