"""Predicted against measured step time: one marker per configuration, the y = x line, fit and held-out apart."""

from __future__ import annotations

import plotly.graph_objects as go

from pipesim.calibration.validation import Row


def scatter_figure(rows: list[Row]) -> go.Figure:
    """Milliseconds on both axes; hover names the run; a ±10 % band around y = x."""
    fig = go.Figure()
    hi = max(max(r.measured, r.predicted) for r in rows) * 1e3 * 1.05 if rows else 1.0
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="predicted = measured",
                             line={"color": "#888", "dash": "dash"}))
    fig.add_trace(go.Scatter(x=[0, hi, hi, 0], y=[0, hi * 1.1, hi * 0.9, 0], fill="toself", mode="none",
                             name="±10 %", fillcolor="rgba(150,150,150,0.15)"))
    for role, symbol in (("fit", "circle-open"), ("held-out", "circle")):
        sel = [r for r in rows if r.role == role]
        if not sel:
            continue
        fig.add_trace(go.Scatter(
            x=[r.measured * 1e3 for r in sel], y=[r.predicted * 1e3 for r in sel], mode="markers", name=role,
            marker={"symbol": symbol, "size": 9}, text=[f"{r.id}: {r.predicted / r.measured - 1:+.1%}" for r in sel],
            hoverinfo="text"))
    fig.update_layout(title_text="pipesim validate: predicted vs measured step time", width=700, height=620,
                      xaxis_title="measured step (ms)", yaxis_title="predicted step (ms)", template="plotly_white")
    fig.update_xaxes(range=[0, hi])
    fig.update_yaxes(range=[0, hi])
    return fig


__all__ = ["scatter_figure"]
