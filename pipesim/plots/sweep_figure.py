"""Sweep plots: bubble fraction against microbatches, peak activation memory, link utilisation.

Reads the rows of a `pipesim sweep` result (schema "pipesim.sweep/1"): one dict per
(schedule, stages, microbatches, virtual) with makespan, bubble_fraction, peak_activation_bytes,
peak_inflight and link_utilization {link class: fraction}.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pipesim.errors import PipesimError
from pipesim.plots.style import SCHEDULE_COLOURS, base_layout

SCHEMA = "pipesim.sweep/1"
REQUIRED = ("schedule", "stages", "microbatches", "bubble_fraction", "peak_activation_bytes")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash")  # one per stage count
PATTERNS = ("", "/", ".", "x", "-")  # bar fill per stage count
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star", "cross", "pentagon")


def check_rows(rows: Sequence[dict]) -> list[dict]:
    """The rows, or a one-line PipesimError naming the first missing key."""
    if not rows:
        raise PipesimError("the sweep has no rows to plot")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise PipesimError(f"sweep row {i} is not an object")
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise PipesimError(f"sweep row {i} lacks {', '.join(missing)}")
    return list(rows)


def _series(row: dict) -> str:
    """Legend name of a schedule variant: `interleaved-1f1b v=2`."""
    v = row.get("virtual") or 1
    return f"{row['schedule']} v={v}" if v > 1 else str(row["schedule"])


def _last_m(rows: list[dict]) -> list[dict]:
    """Per (series, stages), the row with the most microbatches (the steady-state picture)."""
    best: dict[tuple[str, int], dict] = {}
    for row in rows:
        key = (_series(row), row["stages"])
        if key not in best or row["microbatches"] > best[key]["microbatches"]:
            best[key] = row
    return list(best.values())


def _bytes_unit(largest: float) -> tuple[str, float]:
    return ("GiB", 2.0**30) if largest >= 2**30 else ("MiB", 2.0**20)


def sweep_figure(rows: Sequence[dict], *, title: str | None = None, setting: str | None = None,
                 notes: Sequence[str] = ()) -> go.Figure:
    """Three panels: bubble fraction vs m (line per schedule, dash per stage count), memory, links.

    `setting` (the hardware and model the sweep assumed) goes under the title, `notes` below the figure.
    """
    rows = check_rows(rows)
    series = sorted({_series(r) for r in rows})
    colour = {s: SCHEDULE_COLOURS[i % len(SCHEDULE_COLOURS)] for i, s in enumerate(series)}
    stage_counts = sorted({r["stages"] for r in rows})
    many_p = len(stage_counts) > 1
    fig = make_subplots(
        rows=2, cols=2, specs=[[{"colspan": 2}, None], [{}, {}]], vertical_spacing=0.16, horizontal_spacing=0.1,
        subplot_titles=["bubble fraction vs microbatches per step",
                        "peak activation memory per rank (most microbatches)",
                        "link utilisation per link class (most microbatches)"],
    )
    for i, s in enumerate(series):
        width = 2 + 1.5 * (len(series) - 1 - i)  # earlier series thicker: equal curves (gpipe, 1f1b) both show
        for j, p in enumerate(stage_counts):
            pts = sorted((r for r in rows if _series(r) == s and r["stages"] == p), key=lambda r: r["microbatches"])
            if not pts:
                continue
            fig.add_trace(go.Scatter(
                x=[r["microbatches"] for r in pts], y=[r["bubble_fraction"] for r in pts], mode="lines+markers",
                name=f"{s} p={p}" if many_p else s, legendgroup=s,
                line={"color": colour[s], "dash": DASHES[j % len(DASHES)], "width": width},
                marker={"symbol": SYMBOLS[i % len(SYMBOLS)], "size": 5 + width},
                hovertemplate=f"{s}, p={p}<br>m=%{{x}}<br>bubble %{{y:.1%}}<extra></extra>",
            ), row=1, col=1)
    last = sorted(_last_m(rows), key=lambda r: (r["stages"], _series(r)))
    unit, div = _bytes_unit(max(r["peak_activation_bytes"] for r in last))
    fig.add_trace(go.Bar(
        x=[f"{_series(r)} p={r['stages']}" if many_p else _series(r) for r in last],
        y=[r["peak_activation_bytes"] / div for r in last],
        marker={"color": [colour[_series(r)] for r in last],
                "pattern": {"shape": [PATTERNS[stage_counts.index(r["stages"]) % len(PATTERNS)] for r in last]}},
        showlegend=False,
        text=[f"{r['peak_activation_bytes'] / div:.3g}" for r in last], textposition="outside",
        customdata=[[r["microbatches"], r.get("peak_inflight", "-")] for r in last],
        hovertemplate=f"%{{x}}<br>%{{y:.4g}} {unit} at m=%{{customdata[0]}}<br>"
                      "peak in-flight microbatches %{customdata[1]}<extra></extra>",
    ), row=2, col=1)
    classes = sorted({c for r in last for c in (r.get("link_utilization") or {})})
    labels = [f"{_series(r)} p={r['stages']}" if many_p else _series(r) for r in last]
    for cls in classes:  # same x as the memory panel; one bar per link class, grouped
        util = [(r.get("link_utilization") or {}).get(cls, 0.0) for r in last]
        fig.add_trace(go.Bar(
            x=labels, y=util, name=cls, showlegend=False,
            marker={"color": [colour[_series(r)] for r in last],
                    "pattern": {"shape": [PATTERNS[stage_counts.index(r["stages"]) % len(PATTERNS)] for r in last]}},
            # one class: the value on top; several: the class name up the inside of each bar
            text=[cls if len(classes) > 1 else f"{u:.1%}" for u in util],
            textposition="inside" if len(classes) > 1 else "outside", insidetextanchor="start",
            textangle=-90 if len(classes) > 1 else 0, cliponaxis=False,
            customdata=[r["microbatches"] for r in last],
            hovertemplate=f"%{{x}} (m=%{{customdata}})<br>{cls}: %{{y:.1%}} busy<extra></extra>",
        ), row=2, col=2)
    fig.update_xaxes(title_text="microbatches per step", type="log", dtick=0.30102999566, row=1, col=1)
    fig.update_yaxes(title_text="bubble fraction", tickformat=".0%", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=f"peak activations ({unit})", rangemode="tozero", row=2, col=1)
    names = ", ".join(classes) if classes else "none"
    fig.update_yaxes(title_text=f"busy fraction ({names})", tickformat=".0%", rangemode="tozero", row=2, col=2)
    if not classes:
        fig.add_annotation(text="no link data in this sweep", xref="x3 domain", yref="y3 domain", x=0.5, y=0.5,
                           showarrow=False)
    dashes = f" · dash / hatching = stage count ({', '.join(f'p={p}' for p in stage_counts)})" if many_p else ""
    head = title or f"sweep: {len(series)} schedules, {len(rows)} configurations{dashes}"
    if setting:
        head += f"<br><span style='font-size:12px;color:#555'>{setting}</span>"
    fig.update_layout(**base_layout(head), barmode="group", height=760 + 40 * len(notes),
                      uniformtext={"minsize": 9, "mode": "hide"}, bargroupgap=0.05,
                      margin={"l": 70, "r": 30, "t": 110, "b": 60 + 40 * len(notes)})
    for k, note in enumerate(notes):  # below the panels: why a curve looks surprising
        fig.add_annotation(text=f"note: {note}", xref="paper", yref="paper", x=0, y=-0.08 - 0.05 * k,
                           xanchor="left", showarrow=False, font={"size": 11, "color": "#b00"}, align="left")
    for ann in fig.layout.annotations[:3]:
        ann.update(font={"size": 13})
    return fig
