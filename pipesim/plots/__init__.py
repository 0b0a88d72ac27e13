"""Figures of pipesim timelines and sweeps: interactive plotly, self-contained HTML, optional PNG."""

from pipesim.plots.compare import compare_figure
from pipesim.plots.export import write_html, write_png
from pipesim.plots.sweep_figure import sweep_figure
from pipesim.plots.timeline_figure import timeline_figure

__all__ = ["timeline_figure", "compare_figure", "sweep_figure", "write_html", "write_png"]
