"""Timeline figure: one row per rank and stream, one bar per event, bubbles as gaps.

plotly's px.timeline only takes dates, so bars are horizontal go.Bar with `base` = start and
`x` = duration on a numeric axis in ms or us. Several timelines stack on one shared time axis.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pipesim.errors import PipesimError
from pipesim.plots.style import GROUPS, LEGEND_NAMES, base_layout, group_of
from pipesim.timeline import STREAMS, Event, Timeline

UNITS = {"ms": 1e3, "us": 1e6}  # unit -> factor from seconds
ROW_PX = 26  # pixels per row of bars
TEXT_MIN_PX = 9  # labels smaller than this are hidden rather than squeezed


def pick_unit(makespan: float, unit: str | None = None) -> str:
    """ms when the run is longer than 1 ms, else us; an explicit `unit` wins."""
    if unit is not None:
        if unit not in UNITS:
            raise PipesimError(f"unknown time unit {unit!r}: use ms or us")
        return unit
    return "ms" if makespan > 1e-3 else "us"


def row_name(rank: int, stream: str) -> str:
    return f"rank {rank} · {stream}"


def row_names(timeline: Timeline) -> list[str]:
    """Rows top to bottom: every rank, each with the streams this timeline uses anywhere."""
    streams = [s for s in STREAMS if any(e.stream == s for e in timeline.events)] or ["compute"]
    return [row_name(r, s) for r in range(timeline.num_ranks) for s in streams]


def busy_by_rank(timeline: Timeline) -> list[float]:
    """Seconds of compute per rank."""
    busy = [0.0] * timeline.num_ranks
    for e in timeline.events:
        if e.stream == "compute" and 0 <= e.rank < timeline.num_ranks:
            busy[e.rank] += e.duration
    return busy


def bubble_by_rank(timeline: Timeline) -> list[float]:
    """Idle fraction of each rank's compute stream over the makespan."""
    span = timeline.makespan
    if span <= 0:
        return [0.0] * timeline.num_ranks
    return [1.0 - b / span for b in busy_by_rank(timeline)]


def fmt_time(seconds: float, unit: str) -> str:
    """`12.35 ms`, `15,685 ms`: four significant digits, never exponent notation."""
    value = seconds * UNITS[unit]
    return f"{value:,.0f} {unit}" if abs(value) >= 1000 else f"{value:.4g} {unit}"


def fmt_bytes(n: int) -> str:
    size = float(n)
    for suffix in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or suffix == "GiB":
            return f"{size:.4g} {suffix}" if suffix != "B" else f"{n} B"
        size /= 1024
    return f"{n} B"


def short_label(e: Event) -> str:
    """Text drawn on the bar: `0F3` for compute, `F3→r1` / `F3←r0` for transfers."""
    if e.kind.startswith("SEND_"):
        return f"{e.kind[5:]}{e.microbatch}→r{e.peer}" if e.peer >= 0 else f"{e.kind[5:]}{e.microbatch}→"
    if e.kind.startswith("RECV_"):
        return f"{e.kind[5:]}{e.microbatch}←r{e.peer}" if e.peer >= 0 else f"{e.kind[5:]}{e.microbatch}←"
    return e.label


_HOVER = (
    "<b>%{customdata[0]}</b> (%{customdata[1]})<br>"
    "stage %{customdata[2]}, microbatch %{customdata[3]}<br>"
    "start %{customdata[4]}<br>duration %{customdata[5]}<br>"
    "bytes %{customdata[6]}<br>peer rank %{customdata[7]}<extra>%{y}</extra>"
)


def merge_overlaps(timeline: Timeline) -> tuple[list[Event], dict[Event, str]]:
    """Events with each overlapped forward + backward (meta "overlaps", OVERLAP_F_B) as one bar: it spans
    both halves, is coloured as its backward and labelled with both (`0F3;3B1`)."""
    pairs = {f: b for f, b in timeline.meta.get("overlaps", ())}
    if not pairs:
        return list(timeline.events), {}
    compute = {(e.step, e.label): e for e in timeline.events if e.stream == "compute"}
    merged: dict[Event, str] = {}
    halves: set[Event] = set()
    for (step, label), fwd in compute.items():
        bwd = compute.get((step, pairs.get(label, "")))
        if bwd is None:
            continue
        bar = Event(fwd.rank, "compute", bwd.kind, bwd.stage, bwd.microbatch, min(fwd.start, bwd.start),
                    max(fwd.end, bwd.end), step=step)
        merged[bar] = f"{fwd.label};{bwd.label}"
        halves.update((fwd, bwd))
    return [e for e in timeline.events if e not in halves] + list(merged), merged


def add_timeline(fig: go.Figure, timeline: Timeline, *, row: int, unit: str, legend_seen: set[str]) -> None:
    """Add one bar trace per kind group to subplot `row`; the legend lists each group once."""
    scale = UNITS[unit]
    by_group: dict[str, list[Event]] = {}
    events_drawn, overlap_text = merge_overlaps(timeline)
    for e in sorted(events_drawn, key=lambda e: (e.rank, e.start)):
        by_group.setdefault(group_of(e.kind), []).append(e)
    for group in GROUPS:
        events = by_group.get(group)
        if not events:
            continue
        fill, text_colour = GROUPS[group]
        compute = group in ("F", "B", "I", "W")
        fig.add_trace(
            go.Bar(
                orientation="h",
                name=LEGEND_NAMES[group],
                legendgroup=group,
                showlegend=group not in legend_seen,
                y=[row_name(e.rank, e.stream) for e in events],
                base=[e.start * scale for e in events],
                x=[e.duration * scale for e in events],
                width=0.8,
                # compute bars get a white edge to separate neighbours; transfers an edge of their own
                # colour, so a transfer much shorter than a pixel still shows as a thin line
                marker={"color": fill, "line": {"color": "white" if compute else fill, "width": 0.5 if compute else 1}},
                text=[overlap_text.get(e) or short_label(e) for e in events],
                textposition="inside",
                insidetextanchor="middle",
                textangle=0,
                textfont={"color": text_colour},
                customdata=[
                    [overlap_text.get(e) or e.label, e.kind, e.stage, e.microbatch, fmt_time(e.start, unit),
                     fmt_time(e.duration, unit),
                     fmt_bytes(e.bytes) if e.bytes else "-", e.peer if e.peer >= 0 else "-"]
                    for e in events
                ],
                hovertemplate=_HOVER,
            ),
            row=row,
            col=1,
        )
        legend_seen.add(group)
    _add_blame(fig, timeline, row=row, unit=unit, legend_seen=legend_seen)
    rows = row_names(timeline)
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=rows, autorange="reversed",
                     showgrid=False, ticks="", ticklabelstandoff=8, row=row, col=1)
    yref = fig.get_subplot(row, 1).yaxis.plotly_name.replace("axis", "")
    per_rank = len(rows) // max(1, timeline.num_ranks)
    for rank in range(1, timeline.num_ranks, 2):  # shade every other rank so its rows read as one block
        fig.add_shape(type="rect", xref="paper", x0=0, x1=1, yref=yref, y0=rank * per_rank - 0.5,
                      y1=(rank + 1) * per_rank - 0.5, fillcolor="#f3f5f8", line={"width": 0}, layer="below")
    for rank, idle in enumerate(bubble_by_rank(timeline)):
        fig.add_annotation(x=1.0, xref="paper", xanchor="left", xshift=6, y=row_name(rank, "compute"), yref=yref,
                           text=f"idle {idle:.0%}", showarrow=False, font={"size": 11, "color": "#555555"})


BLAME_COLOUR = "#d62728"


def _add_blame(fig: go.Figure, timeline: Timeline, *, row: int, unit: str, legend_seen: set[str]) -> None:
    """A what-if's attributed waits (meta "blame", pipesim.sim.blame) drawn over the waiting rank's recv row:
    hatched red where it waits on a rank (the root of the late chain), hatched grey where on a link."""
    rows = timeline.meta.get("blame") or []
    if not rows:
        return
    scale = UNITS[unit]
    for on_rank in (True, False):
        picked = [r for r in rows if str(r[3]).startswith("rank") == on_rank]
        if not picked:
            continue
        name = "waits on a rank (blame)" if on_rank else "waits on a link (blame)"
        colour = BLAME_COLOUR if on_rank else "#7f7f7f"
        fig.add_trace(go.Bar(
            orientation="h", name=name, legendgroup=name, showlegend=name not in legend_seen,
            y=[row_name(int(r[0]), "recv") for r in picked], base=[r[1] * scale for r in picked],
            x=[(r[2] - r[1]) * scale for r in picked], width=0.5,
            marker={"color": "rgba(0,0,0,0)", "line": {"color": colour, "width": 1},
                    "pattern": {"shape": "/", "fgcolor": colour, "size": 5}},
            customdata=[[r[3], fmt_time(r[2] - r[1], unit)] for r in picked],
            hovertemplate="waits on <b>%{customdata[0]}</b> for %{customdata[1]}<extra>%{y}</extra>"),
            row=row, col=1)
        legend_seen.add(name)


def summary(timeline: Timeline, unit: str) -> str:
    """`1f1b · simulated · 2 ranks · makespan 12.3 ms · bubble 23%`."""
    bubbles = bubble_by_rank(timeline)
    mean = sum(bubbles) / len(bubbles) if bubbles else 0.0
    return (f"{timeline.schedule} · {timeline.source} · {timeline.num_ranks} ranks · "
            f"makespan {fmt_time(timeline.makespan, unit)} · bubble {mean:.1%}")


def stacked_figure(timelines: Sequence[Timeline], titles: Sequence[str], *, unit: str | None = None) -> go.Figure:
    """Timelines one above the other on a shared time axis (the compare view builds on this)."""
    if not timelines:
        raise PipesimError("no timeline to plot")
    unit = pick_unit(max(t.makespan for t in timelines), unit)
    heights = [len(row_names(t)) for t in timelines]
    fig = make_subplots(rows=len(timelines), cols=1, shared_xaxes=True, subplot_titles=list(titles),
                        row_heights=[h / sum(heights) for h in heights], vertical_spacing=0.22 / len(timelines))
    for ann in fig.layout.annotations:  # subplot titles: left-aligned
        ann.update(x=0, xanchor="left", font={"size": 13})
    seen: set[str] = set()
    for i, t in enumerate(timelines, start=1):
        add_timeline(fig, t, row=i, unit=unit, legend_seen=seen)
    span = max(t.makespan for t in timelines) * UNITS[unit]
    fig.update_xaxes(range=[0, span * 1.005], showgrid=True, gridcolor="#e5e5e5", zeroline=False,
                     exponentformat="none", separatethousands=True)
    fig.update_xaxes(title_text=f"time ({unit})", row=len(timelines), col=1)
    fig.update_layout(**base_layout(""), barmode="overlay", bargap=0.15,
                      height=140 + ROW_PX * sum(heights) + 60 * len(timelines),
                      margin={"l": 130, "r": 80, "t": 110, "b": 50},
                      uniformtext={"minsize": TEXT_MIN_PX, "mode": "hide"})
    fig.layout.meta = {"unit": unit}
    return fig


def timeline_figure(timelines: Timeline | Sequence[Timeline], *, unit: str | None = None,
                    title: str | None = None) -> go.Figure:
    """One timeline, or several stacked on one time axis; title says schedule, makespan, bubble."""
    items = [timelines] if isinstance(timelines, Timeline) else list(timelines)
    if not items:
        raise PipesimError("no timeline to plot")
    unit = pick_unit(max(t.makespan for t in items), unit)
    titles = [summary(t, unit) for t in items] if len(items) > 1 else [""]
    fig = stacked_figure(items, titles, unit=unit)
    head = title or (summary(items[0], unit) if len(items) == 1 else f"{len(items)} timelines")
    fig.update_layout(title_text=head)
    return fig
