"""pipesim: pipeline-parallel schedules written once, simulated, executed and plotted."""

__version__ = "0.1.0"
