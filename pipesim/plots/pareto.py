"""The Pareto view of a sweep: bubble against peak activation memory, one point per schedule, per configuration.

What users choose from: a schedule is worth a look only if no other one has both less bubble and
less memory on the same (p, m). Reads `pipesim sweep` rows (pipesim.sweep/1); `pareto_front` is
the plain computation (no plotly needed to test it).
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from pipesim.plots.style import SCHEDULE_COLOURS, base_layout
from pipesim.plots.sweep_figure import check_rows


def _series(row: dict) -> str:
    """A schedule variant's name, as the sweep figure writes it: `interleaved-zb v=2`."""
    v = row.get("virtual") or 1
    return f"{row['schedule']} v={v}" if v > 1 else str(row["schedule"])


def _bytes_unit(largest: float) -> tuple[str, float]:
    return ("GiB", 2.0**30) if largest >= 2**30 else ("MiB", 2.0**20)


def pareto_front(rows: Sequence[dict]) -> list[dict]:
    """Rows no other row dominates (no more bubble and no more memory, one of them strictly less),
    by increasing memory."""
    def point(row: dict) -> tuple[float, float]:
        return row["bubble_fraction"], row["peak_activation_bytes"]

    def dominated(a: dict) -> bool:
        return any(point(b)[0] <= point(a)[0] and point(b)[1] <= point(a)[1] and point(b) != point(a) for b in rows)

    return sorted((r for r in rows if not dominated(r)),
                  key=lambda r: (r["peak_activation_bytes"], r["bubble_fraction"], _series(r)))


def _configurations(rows: list[dict]) -> dict[tuple[int, int], list[dict]]:
    out: dict[tuple[int, int], list[dict]] = {}
    for row in rows:
        out.setdefault((row["stages"], row["microbatches"]), []).append(row)
    return dict(sorted(out.items()))


def pareto_figure(rows: Sequence[dict], *, title: str | None = None) -> go.Figure:
    """Bubble fraction (y) against the largest rank's peak activation memory (x): a marker per schedule,
    labelled; the non-dominated ones joined by a line, one per (p, m) configuration."""
    rows = check_rows(rows)
    unit, scale = _bytes_unit(max(r["peak_activation_bytes"] for r in rows))
    names = sorted({_series(r) for r in rows})
    colours = {n: SCHEDULE_COLOURS[i % len(SCHEDULE_COLOURS)] for i, n in enumerate(names)}
    fig = go.Figure()
    for (p, m), group in _configurations(rows).items():
        label = f"p={p}, m={m}"
        front = pareto_front(group)
        fig.add_trace(go.Scatter(
            x=[r["peak_activation_bytes"] / scale for r in front], y=[r["bubble_fraction"] for r in front],
            mode="lines", line={"color": "#888888", "dash": "dot", "shape": "hv"}, name=f"Pareto front, {label}",
            hoverinfo="skip"))
        fig.add_trace(go.Scatter(
            x=[r["peak_activation_bytes"] / scale for r in group], y=[r["bubble_fraction"] for r in group],
            mode="markers+text", text=[_series(r) for r in group], textposition="top center", name=label,
            marker={"size": 10, "color": [colours[_series(r)] for r in group],
                    "line": {"width": [2 if r in front else 0 for r in group], "color": "#222222"}},
            customdata=[[_series(r), r["makespan"] if "makespan" in r else "-"] for r in group],
            hovertemplate="%{customdata[0]}<br>bubble %{y:.1%}<br>peak activations %{x:.2f} " + unit
                          + "<br>makespan %{customdata[1]} s<extra>" + label + "</extra>"))
    fig.update_layout(**base_layout(title or "Bubble against peak activation memory (Pareto view)"))
    fig.update_xaxes(title_text=f"peak activation memory, largest rank ({unit})", rangemode="tozero")
    fig.update_yaxes(title_text="bubble fraction", tickformat=".0%", rangemode="tozero")
    return fig
