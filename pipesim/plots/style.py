"""Colours and names per event kind, shared by every figure so F is always the same blue.

Compute kinds get strong colours; communication gets muted ones, so the eye reads work first
and transfers (often waiting time on the recv stream) second.
"""

from __future__ import annotations

# group name -> (colour, label text colour); groups are what the legend lists
GROUPS: dict[str, tuple[str, str]] = {
    "F": ("#4C78A8", "white"),  # forward: blue
    "B": ("#E45756", "white"),  # full backward: red
    "I": ("#F58518", "white"),  # input-grad backward: orange
    "W": ("#54A24B", "white"),  # weight-grad backward: green
    "SEND": ("#B279A2", "white"),  # isend of an activation or gradient: purple
    "RECV": ("#C9C3BE", "#333333"),  # recv (includes waiting for the data): light grey
    "collective": ("#72B7B2", "white"),  # all-reduce etc.: teal
}

LEGEND_NAMES = {
    "F": "F forward",
    "B": "B backward",
    "I": "I input grad",
    "W": "W weight grad",
    "SEND": "send",
    "RECV": "recv (incl. wait)",
    "collective": "collective",
}

FONT = "Inter, Segoe UI, Helvetica, Arial, sans-serif"
SCHEDULE_COLOURS = ("#4C78A8", "#E45756", "#54A24B", "#F58518", "#B279A2", "#72B7B2", "#9D755D", "#FF9DA6")


def group_of(kind: str) -> str:
    """Legend group of an event kind: F, B, I, W, SEND, RECV or collective."""
    if kind in ("F", "B", "I", "W"):
        return kind
    if kind.startswith("SEND"):
        return "SEND"
    if kind.startswith("RECV"):
        return "RECV"
    return "collective"


def colour(kind: str) -> str:
    return GROUPS[group_of(kind)][0]


def base_layout(title: str) -> dict:
    """Layout shared by all figures: white background, readable font, legend on top."""
    return {
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 16}},
        "template": "plotly_white",
        "font": {"family": FONT, "size": 12},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "right", "x": 1.0},
        "hoverlabel": {"font": {"family": FONT}},
    }
