"""Compare view: the simulated and the measured timeline of one schedule on one time axis.

The measured run has several steps; the view shows one (the median step by duration unless told)
rebased to 0, and puts the prediction error (makespan and per-rank compute time) in the figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from pipesim.errors import PipesimError
from pipesim.plots.timeline import busy_by_rank, fmt_time, pick_unit, stacked_figure, summary
from pipesim.timeline import Timeline, trimmed_step


def step_durations(timeline: Timeline) -> dict[int, float]:
    """Seconds of each step: for a measured run its pipeline span (first compute start to last compute
    end, as `pipesim validate` and the simulator count it), otherwise first start to last end."""
    measured = timeline.source == "measured" and any(e.stream == "compute" for e in timeline.events)
    spans: dict[int, list[float]] = {}
    for e in timeline.events:
        if measured and e.stream != "compute":
            continue
        lo_hi = spans.setdefault(e.step, [e.start, e.end])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], e.start), max(lo_hi[1], e.end)
    return {step: hi - lo for step, (lo, hi) in spans.items()}


def median_step(timeline: Timeline) -> int:
    """The step whose duration is the (lower) median; ties go to the earlier step."""
    durations = step_durations(timeline)
    if not durations:
        raise PipesimError(f"the {timeline.source} timeline has no events")
    ordered = sorted(durations, key=lambda s: (durations[s], s))
    return ordered[(len(ordered) - 1) // 2]


def pick_step(timeline: Timeline, step: int | None) -> Timeline:
    """One step of `timeline` rebased to 0: `step`, or the median step when None.

    A measured step starts at its first compute (always 0F0 on rank 0): ranks that entered the step
    earlier and wait in a RECV are clipped to that moment, since the simulator starts every rank at
    0 and does not see that wait either.
    """
    steps = timeline.steps()
    if step is None:
        step = median_step(timeline)
    elif step not in steps:
        raise PipesimError(f"the {timeline.source} timeline has no step {step} (steps: {steps})")
    if timeline.source == "measured" and any(e.stream == "compute" and e.step == step for e in timeline.events):
        chosen = trimmed_step(timeline, step)
    else:
        chosen = timeline.only_step(step)
    chosen.meta = {**chosen.meta, "shown_step": step}
    return chosen


@dataclass(frozen=True)
class PredictionError:
    """Relative errors of the prediction: (predicted - measured) / measured."""

    makespan: float  # signed fraction
    busy_by_rank: tuple[float, ...]  # signed fraction per rank (compute time)

    @property
    def makespan_abs(self) -> float:
        return abs(self.makespan)


def prediction_error(simulated: Timeline, measured: Timeline) -> PredictionError:
    """Makespan and per-rank compute-time errors of `simulated` against `measured` (one step each)."""
    if simulated.num_ranks != measured.num_ranks:
        raise PipesimError(f"cannot compare: simulated run has {simulated.num_ranks} ranks, "
                           f"measured run has {measured.num_ranks}")
    meas = measured.makespan
    if meas <= 0:
        raise PipesimError("cannot compare: the measured step has zero duration")
    span_err = (simulated.makespan - meas) / meas
    busy = []
    for pred, real in zip(busy_by_rank(simulated), busy_by_rank(measured), strict=True):
        busy.append((pred - real) / real if real > 0 else 0.0)
    return PredictionError(span_err, tuple(busy))


def compare_figure(simulated: Timeline, measured: Timeline, *, step: int | None = None,
                   unit: str | None = None) -> go.Figure:
    """Two stacked timelines (simulated above measured), errors in the title and a line below it."""
    if simulated.source == "measured" and measured.source == "simulated":
        simulated, measured = measured, simulated
    sim = pick_step(simulated, None)
    meas = pick_step(measured, step)
    err = prediction_error(sim, meas)
    unit = pick_unit(max(sim.makespan, meas.makespan), unit)
    titles = [f"simulated · {summary(sim, unit).split(' · ', 2)[2]}",
              f"measured (step {meas.meta['shown_step']} of {len(measured.steps())}) · "
              f"{summary(meas, unit).split(' · ', 2)[2]}"]
    fig = stacked_figure([sim, meas], titles, unit=unit)
    per_rank = " · ".join(f"rank {r} {e:+.1%}" for r, e in enumerate(err.busy_by_rank))
    fig.update_layout(
        title_text=(f"{measured.schedule}: predicted {fmt_time(sim.makespan, unit)} vs measured "
                    f"{fmt_time(meas.makespan, unit)} · makespan error {err.makespan_abs:.1%}"
                    f"<br><span style='font-size:12px;color:#555'>compute-time error per rank "
                    f"(predicted − measured) / measured: {per_rank}</span>"),
        margin={"t": 130},
    )
    fig.layout.meta = {**fig.layout.meta, "makespan_error": err.makespan, "busy_error": list(err.busy_by_rank)}
    return fig
