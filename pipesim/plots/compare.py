"""Compare view: the simulated and the measured timeline of one schedule on one time axis.

The measured run has several steps; the view shows one (the median step after warm-up by duration
unless told) rebased to 0, and puts the prediction error (makespan and per-rank compute time) in the
figure. Steps are numbered from 1 everywhere a user reads them (`pipesim run`'s "step 3/4", `--step 3`,
"step 3 of 4"); a shown step spans its first compute start to its last compute end (the simulator's
makespan), while the run's `step_time` is the median after warm-up up to the optimizer's end.
Two runs of different shape (schedule, ranks, stages, chunks, microbatches) are not compared unless
forced; a different model or hardware is said in the title. A measured run with data-parallel replicas (dp > 1,
which an expert-parallel run needs) is compared through its first replica's pipeline ranks (`first_replica`): the
simulator draws one pipeline, the replicas run alongside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import plotly.graph_objects as go

from pipesim.errors import PipesimError
from pipesim.parallel_dims import ParallelDims
from pipesim.plots.timeline_figure import busy_by_rank, fmt_time, pick_unit, stacked_figure, summary
from pipesim.timeline import Timeline, trimmed_step


def first_replica(measured: Timeline) -> Timeline:
    """The pipeline ranks of data-parallel replica 0 (tp rank 0), renumbered 0 .. pp - 1, of a measured run over
    dp x pp x tp ranks (meta "dp", "pp", "tp"), without the collectives after each rank's last compute of a step
    (the data-parallel all-reduce: a rank that finishes early waits there for its replicas, past the pipeline's
    last compute); the timeline itself when dp and tp are 1 or not recorded."""
    meta = measured.meta if isinstance(measured.meta, dict) else {}
    dp, pp, tp = (meta.get(k) for k in ("dp", "pp", "tp"))
    if not all(isinstance(v, int) for v in (dp, pp, tp)) or dp * tp == 1 or dp * pp * tp != measured.num_ranks:
        return measured
    dims = ParallelDims(pp=pp, dp=dp, tp=tp)
    pipeline = {dims.rank(pp=p): p for p in range(pp)}
    last: dict[tuple[int, int], float] = {}  # (step, rank) -> its last compute end: the data-parallel all-reduce
    for e in measured.events:  # after it is left out, as the pipeline span the simulator predicts on a CPU host
        if e.stream == "compute" and e.rank in pipeline:
            key = (e.step, e.rank)
            last[key] = max(last.get(key, e.end), e.end)
    events = [replace(e, rank=pipeline[e.rank], peer=pipeline.get(e.peer, -1)) for e in measured.events
              if e.rank in pipeline and not (e.stream == "collective" and e.stage < 0
                                              and e.start >= last.get((e.step, e.rank), math.inf))]
    shown = f"data-parallel replica 1 of {dp}" + (f", tp rank 1 of {tp}" if tp > 1 else "")
    return Timeline(measured.source, measured.schedule, pp, events, {**meta, "replica": shown})


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


def warmup_steps(timeline: Timeline) -> int:
    """Steps the run left out of its step_time (meta "warmup"), never all of them."""
    warmup = timeline.meta.get("warmup", 0) if isinstance(timeline.meta, dict) else 0
    steps = len(timeline.steps())
    return max(0, min(int(warmup) if isinstance(warmup, int) else 0, steps - 1))


def median_step(timeline: Timeline) -> int:
    """The step after warm-up whose duration is the (lower) median; ties go to the earlier step."""
    durations = step_durations(timeline)
    if not durations:
        raise PipesimError(f"the {timeline.source} timeline has no events")
    skip = set(sorted(durations)[:warmup_steps(timeline)])
    durations = {s: d for s, d in durations.items() if s not in skip}
    ordered = sorted(durations, key=lambda s: (durations[s], s))
    return ordered[(len(ordered) - 1) // 2]


def pick_step(timeline: Timeline, step: int | None) -> Timeline:
    """One step of `timeline` rebased to 0: `step` (numbered from 1), or the median step when None.

    A measured step starts at its first compute (always 0F0 on rank 0): ranks that entered the step
    earlier and wait in a RECV are clipped to that moment, since the simulator starts every rank at
    0 and does not see that wait either.
    """
    steps = timeline.steps()
    if step is None:
        step = median_step(timeline)
    elif step - 1 not in steps:
        raise PipesimError(f"the {timeline.source} timeline has no step {step} (steps 1 to {len(steps)})")
    else:
        step -= 1
    if timeline.source == "measured" and any(e.stream == "compute" and e.step == step for e in timeline.events):
        chosen = trimmed_step(timeline, step)
    else:
        chosen = timeline.only_step(step)
    chosen.meta = {**chosen.meta, "shown_step": step + 1}  # numbered from 1, as `pipesim run` prints it
    return chosen


def _shape(tl: Timeline) -> dict[str, object]:
    """What must agree for two runs to be one schedule's prediction and measurement (None: not recorded)."""
    meta = tl.meta if isinstance(tl.meta, dict) else {}
    if tl.source == "measured":
        stages, pp = meta.get("stages"), meta.get("pp")
        micro = meta.get("microbatches")
    else:
        pp, micro, v = meta.get("p"), meta.get("m"), meta.get("v")
        stages = pp * v if isinstance(pp, int) and isinstance(v, int) else None
    virtual = stages // pp if isinstance(stages, int) and isinstance(pp, int) and pp else None
    return {"schedule": tl.schedule, "ranks": tl.num_ranks, "stages": stages, "virtual chunks": virtual,
            "microbatches": micro}


def shape_mismatches(simulated: Timeline, measured: Timeline) -> list[str]:
    """'schedule 1f1b (simulated) vs zb-h1 (measured)', ... for every recorded field that differs."""
    sim, meas = _shape(simulated), _shape(measured)
    return [f"{k} {sim[k]} (simulated) vs {meas[k]} (measured)" for k in sim
            if sim[k] is not None and meas[k] is not None and sim[k] != meas[k]]


def _model_key(meta: dict) -> dict | None:
    model = meta.get("model") if isinstance(meta, dict) else None
    return {k: v for k, v in model.items() if k != "seed"} if isinstance(model, dict) else None


def setting_notes(simulated: Timeline, measured: Timeline) -> list[str]:
    """What differs between the runs but still compares (model, hardware class): said in the title."""
    notes = []
    sim_model, meas_model = _model_key(simulated.meta), _model_key(measured.meta)
    if sim_model is not None and meas_model is not None and sim_model != meas_model:
        diff = [k for k in sorted(set(sim_model) | set(meas_model)) if sim_model.get(k) != meas_model.get(k)]
        notes.append(f"model differs ({', '.join(diff)})")
    hardware, device = simulated.meta.get("hardware"), measured.meta.get("device")
    if isinstance(hardware, str) and isinstance(device, str):
        if ("cpu" in hardware.lower()) != device.startswith("cpu"):
            notes.append(f"hardware differs (simulated on {hardware}, measured on {device})")
    return notes


def check_comparable(simulated: Timeline, measured: Timeline, *, force: bool = False) -> list[str]:
    """Refuse runs of different shape unless `force`; return the notes for the title (mismatches included)."""
    wrong = shape_mismatches(simulated, measured)
    if wrong and not force:
        raise PipesimError(f"cannot compare: {'; '.join(wrong)} (--force to compare anyway)")
    return [*(f"{w}, compared with --force" for w in wrong), *setting_notes(simulated, measured)]


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
                   unit: str | None = None, force: bool = False) -> go.Figure:
    """Two stacked timelines (simulated above measured), errors in the title and a line below it."""
    if simulated.source == "measured" and measured.source == "simulated":
        simulated, measured = measured, simulated
    measured = first_replica(measured)
    notes = check_comparable(simulated, measured, force=force)
    sim = pick_step(simulated, None)
    meas = pick_step(measured, step)
    err = prediction_error(sim, meas)
    unit = pick_unit(max(sim.makespan, meas.makespan), unit)
    where = f" on {simulated.meta['hardware']}" if simulated.meta.get("hardware") else ""
    replica = f"{measured.meta['replica']}, " if measured.meta.get("replica") else ""
    titles = [f"simulated {simulated.schedule}{where} · {summary(sim, unit).split(' · ', 2)[2]}",
              f"measured {measured.schedule} ({replica}step {meas.meta['shown_step']} of {len(measured.steps())}, "
              f"first to last compute) · {summary(meas, unit).split(' · ', 2)[2]}"]
    fig = stacked_figure([sim, meas], titles, unit=unit)
    per_rank = " · ".join(f"rank {r} {e:+.1%}" for r, e in enumerate(err.busy_by_rank))
    step_time = measured.meta.get("step_time")
    run_line = (f" · the run's step_time {fmt_time(step_time, unit)} (median after warm-up, to the optimizer's "
                f"end)" if isinstance(step_time, float) else "")
    warning = (f"<br><span style='font-size:12px;color:#b00'>{' · '.join(notes)}</span>" if notes else "")
    fig.update_layout(
        title_text=(f"{simulated.schedule}: predicted {fmt_time(sim.makespan, unit)}{where} vs measured "
                    f"{fmt_time(meas.makespan, unit)} (step {meas.meta['shown_step']}, first to last compute) · "
                    f"makespan error {err.makespan_abs:.1%}"
                    f"<br><span style='font-size:12px;color:#555'>compute-time error per rank "
                    f"(predicted − measured) / measured: {per_rank}{run_line}</span>{warning}"),
        margin={"t": 150 if notes else 130},
    )
    fig.layout.meta = {**fig.layout.meta, "makespan_error": err.makespan, "busy_error": list(err.busy_by_rank)}
    return fig
