"""What a simulation produced: raw per-action times, the metrics derived from them, and the JSON.

The simulator records only start/end floats per action (cheap in the hot loop); everything a user
reads (busy, waiting, idle, bubble, link bandwidth, memory, critical path) is derived here, once.
The JSON schema (`pipesim.simulate/1`) is documented in docs/simulator.md; units are seconds,
bytes and bytes/s. (A little over 300 lines: every metric of one result and its JSON in one place; the critical
path's walk is pipesim.sim.critical_path.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipesim.cost.table import CostTable
from pipesim.ir.deps import message_slot
from pipesim.ir.gc_pause import no_gc
from pipesim.ir.schedule import COMPUTE, RECVS, Schedule
from pipesim.job import Job
from pipesim.sim.critical_path import critical_path
from pipesim.sim.links import Transfer
from pipesim.sim.records import CollectiveRecord, RunRecord
from pipesim.sim.step import AFTER_PIPELINE, RankStepEnd
from pipesim.timeline import Event, Timeline

SCHEMA = "pipesim.simulate/1"


@dataclass
class SimResult:
    """One simulated step. Times in seconds from the step's start, sizes in bytes."""

    schedule: Schedule  # lowered (with SEND/RECV)
    table: CostTable
    hardware: str | None  # hardware name; None when no hardware was given
    comm: bool  # links modeled
    job: Job  # the layout and options simulated (its pp is the schedule's ranks)
    devices: list[int]  # device id of each pipeline rank (replica 0, TP shard 0)
    starts: list[list[float]]  # seconds, per rank, per action
    ends: list[list[float]]  # seconds, per rank, per action
    tp_time: list[list[float]]  # seconds of TP collectives inside each compute action
    transfers: list[Transfer]
    collectives: list[CollectiveRecord]
    memory_timeline: list[list[tuple[float, int]]]  # per rank: (seconds, activation bytes: stashed + recomputing)
    link_info: dict[str, dict] = field(default_factory=dict)  # link class -> bandwidth, latency
    makespan: float = 0.0  # seconds
    peak_inflight: list[int] = field(default_factory=list)  # per rank: most microbatches stashed at once
    messages: list = field(default_factory=list, repr=False)  # message slot -> Transfer (see recv_transfer)
    slot_stride: int = 1  # microbatch slots per (stage, direction)
    # the step's end (pipesim.sim.step), per rank; [] when the costs model no optimizer (then step_time == makespan)
    step_ends: list[RankStepEnd] = field(default_factory=list)
    step_time: float = 0.0  # seconds to the last rank's optimizer (and parameter all-gather) end
    cp_seconds: dict = field(default_factory=dict)  # (stage, kind) -> exposed ring-attention seconds per action
    sm_shared: list[float] = field(default_factory=list)  # per rank: seconds of compute lost to its DP collectives' SMs
    ep_time: list[list[float]] = field(default_factory=list)  # seconds of EP all-to-alls inside each compute action

    @staticmethod
    def build(run: RunRecord) -> SimResult:
        """The result of one kernel run: its record, the makespan and step time, the links' figures."""
        transfers = run.transfers
        ends = [e[-1] for e in run.ends if e]
        ends += [t.end for t in transfers] + [c.end for c in run.collectives if c.phase not in AFTER_PIPELINE]
        makespan = max(ends, default=0.0)  # the pipeline's span: replicas' swaps and parameter all-gathers follow it
        step_time = max([makespan] + [r.step_end for r in run.step_ends])
        hw, par = run.hardware, run.job.dims
        info = {}
        if hw is not None and run.comm:
            for link in (hw.intra, hw.inter):
                if link is not None:
                    info[link.name] = {"bandwidth": link.bandwidth, "peak_bandwidth": link.peak_bandwidth,
                                       "latency": link.latency, "shared": link.shared}
        return SimResult(
            schedule=run.schedule, table=run.table, hardware=hw.name if hw is not None else None, comm=run.comm,
            job=run.job, devices=[par.rank(pp=r) for r in range(run.schedule.num_ranks)], starts=run.starts,
            ends=run.ends, tp_time=run.tp_time, transfers=transfers, collectives=run.collectives,
            memory_timeline=run.memory, link_info=info, makespan=makespan, peak_inflight=list(run.peak_inflight),
            messages=run.messages, slot_stride=run.slot_stride, step_ends=run.step_ends, step_time=step_time,
            cp_seconds=run.cp_seconds, sm_shared=list(run.sm_shared), ep_time=run.ep_time)

    @property
    def dp(self) -> int:
        return self.job.dims.dp

    @property
    def tp(self) -> int:
        return self.job.dims.tp

    @property
    def cp(self) -> int:
        return self.job.dims.cp

    def recv_transfer(self, recv) -> Transfer:
        """The message a RECV action consumed (`pipesim.ir.deps.message_slot`, as the simulator numbered it)."""
        return self.messages[message_slot(recv.stage, recv.kind, recv.microbatch, self.slot_stride)]

    # -- per-rank metrics ------------------------------------------------------------------------

    def busy(self, rank: int) -> float:
        """Seconds the rank computes (including the blocking TP collectives inside its actions)."""
        return self._per_rank()[rank][0]

    def waiting_comm(self, rank: int) -> float:
        """Seconds the rank sat blocked in a RECV."""
        return self._per_rank()[rank][1]

    def _per_rank(self) -> list[tuple[float, float]]:
        """(busy, waiting) per rank, computed once."""
        cached = self.__dict__.get("_busy_wait")
        if cached is None:
            cached = []
            for prog, s, e in zip(self.schedule.programs, self.starts, self.ends):
                busy = wait = 0.0
                for a, t0, t1 in zip(prog, s, e):
                    if a.kind in COMPUTE:
                        busy += t1 - t0
                    elif a.kind in RECVS:
                        wait += t1 - t0
                cached.append((busy, wait))
            self.__dict__["_busy_wait"] = cached
        return cached

    def idle(self, rank: int) -> float:
        """Seconds of the makespan the rank does not compute (never below 0: a busy sum rounded past the makespan)."""
        return max(0.0, self.makespan - self.busy(rank))

    def rank_bubble(self, rank: int) -> float:
        return self.idle(rank) / self.makespan if self.makespan > 0 else 0.0

    @property
    def bubble_fraction(self) -> float:
        """Idle time over makespan, averaged over ranks."""
        n = self.schedule.num_ranks
        return sum(self.rank_bubble(r) for r in range(n)) / n if n else 0.0

    def cp_exposed(self, rank: int) -> float:
        """Seconds of ring attention's hops on `rank` that its attention compute did not hide (inside busy)."""
        if not self.cp_seconds:
            return 0.0
        get = self.cp_seconds.get
        return sum(get((a.stage, a.kind.value), 0.0) for a in self.schedule.programs[rank] if a.kind in COMPUTE)

    @property
    def virtual(self) -> int:
        """Model chunks per rank (v): DualPipe's two chains of p stages hold p chunks, so v = 1."""
        return self.schedule.model_stages // max(1, self.schedule.num_ranks)

    def peak_activation_bytes(self) -> list[int]:
        return [max(b for _, b in tl) for tl in self.memory_timeline]

    def num_actions(self) -> int:
        return self.schedule.num_actions()

    # -- links -----------------------------------------------------------------------------------

    def link_stats(self) -> list[dict]:
        """Per contended resource: transfers, bytes, busy seconds, achieved bandwidth, utilization."""
        cached = self.__dict__.get("_link_stats")
        if cached is None:
            cached = self.__dict__["_link_stats"] = self._link_stats()
        return [dict(row) for row in cached]

    def _link_stats(self) -> list[dict]:
        per: dict[str, dict] = {}
        for t in self.transfers:
            for name in t.resources:
                row = per.setdefault(name, {"resource": name, "link_class": t.link, "transfers": 0, "bytes": 0,
                                            "busy": 0.0})
                row["transfers"] += 1
                row["bytes"] += t.nbytes
                row["busy"] += t.end - t.start
        return [self._rates(per[k]) for k in sorted(per)]

    def link_class_stats(self) -> dict[str, dict]:
        """Per link class: totals over its transfers (each counted once) and the configured figures."""
        per: dict[str, dict] = {}
        for t in self.transfers:
            if not t.link:
                continue
            row = per.setdefault(t.link, {"transfers": 0, "bytes": 0, "busy": 0.0})
            row["transfers"] += 1
            row["bytes"] += t.nbytes
            row["busy"] += t.end - t.start
        out, resources_all = {}, self.link_stats()
        for name in sorted(per):
            row = per[name]
            row["achieved_bandwidth"] = row["bytes"] / row["busy"] if row["busy"] > 0 else 0.0
            resources = [r for r in resources_all if r["link_class"] == name]
            row["max_utilization"] = max((r["utilization"] for r in resources), default=0.0)
            row.update(self.link_info.get(name, {}))
            out[name] = row
        return out

    def _rates(self, row: dict) -> dict:
        row["achieved_bandwidth"] = row["bytes"] / row["busy"] if row["busy"] > 0 else 0.0  # bytes/s
        row["utilization"] = row["busy"] / self.makespan if self.makespan > 0 else 0.0
        return row

    # -- critical path ---------------------------------------------------------------------------

    def critical_path(self) -> list[dict]:
        """The chain of compute, transfers and collectives that ends at the makespan, first to last
        (pipesim.sim.critical_path)."""
        return critical_path(self.schedule, self.starts, self.ends, self.collectives, self.recv_transfer)

    # -- views -----------------------------------------------------------------------------------

    def timeline(self) -> Timeline:
        """The shared trace schema: compute, send (link occupancy), recv (blocked time), collectives."""
        with no_gc():
            return self._timeline()

    def _timeline(self) -> Timeline:
        sched, events = self.schedule, []
        for r, prog in enumerate(sched.programs):
            s, e, tp = self.starts[r], self.ends[r], self.tp_time[r]
            ep = self.ep_time[r] if self.ep_time else None
            for i, a in enumerate(prog):
                k = a.kind.value
                if a.kind in COMPUTE:
                    x = ep[i] if ep is not None else 0.0  # the all-to-alls: drawn between the compute and the TP bar
                    events.append(Event(r, "compute", k, a.stage, a.microbatch, s[i], e[i] - tp[i] - x))
                    if x > 0:
                        events.append(Event(r, "collective", "ep", a.stage, a.microbatch, e[i] - tp[i] - x,
                                            e[i] - tp[i]))
                    if tp[i] > 0:
                        events.append(Event(r, "collective", "tp", a.stage, a.microbatch, e[i] - tp[i], e[i]))
                elif a.kind in RECVS:
                    t = self.recv_transfer(a)
                    events.append(Event(r, "recv", k, a.stage, a.microbatch, s[i], e[i], t.nbytes, t.src))
        for t in self.transfers:
            events.append(Event(t.src, "send", t.send.kind.value, t.send.stage, t.send.microbatch, t.start, t.end,
                                t.nbytes, t.dst))
        for c in self.collectives:
            events.append(Event(c.rank, "collective", c.kind, c.stage, -1, c.start, c.end, c.nbytes))
        events.sort(key=lambda ev: (ev.start, ev.rank, ev.stream, ev.end))
        return Timeline("simulated", sched.name, sched.num_ranks, events, self.meta())

    def meta(self) -> dict:
        s = self.schedule
        return {"hardware": self.hardware, "p": s.num_ranks, "m": s.num_microbatches,
                "v": self.virtual, "dp": self.dp, "tp": self.tp,
                "comm": "links" if self.comm else "none", "step_time": self.step_time,
                **({"overlaps": s.overlap_labels()} if s.overlaps else {})}  # drawn as one bar each

    def to_dict(self, *, memory_timeline: bool = True) -> dict:
        """The `pipesim.simulate/1` JSON object (see docs/simulator.md)."""
        with no_gc():
            return self._to_dict(memory_timeline)

    def _to_dict(self, memory_timeline: bool) -> dict:
        s, n = self.schedule, self.schedule.num_ranks
        peaks, inflight = self.peak_activation_bytes(), self.peak_inflight
        params = [sum(self.table.stages[st].param_bytes for st in s.stages_of(r)) for r in range(n)]
        ranks = []
        for r in range(n):
            busy, tp = self.busy(r), sum(self.tp_time[r])
            ep = sum(self.ep_time[r]) if self.ep_time else 0.0
            ranks.append({
                "rank": r, "device": self.devices[r], "stages": list(s.stages_of(r)),
                "busy": busy, "compute": busy - tp - ep, "tp_collective": tp, "waiting_comm": self.waiting_comm(r),
                "idle": self.makespan - busy, "bubble_fraction": self.rank_bubble(r),
                "finish": self.ends[r][-1] if self.ends[r] else 0.0,
                "dp_allreduce": sum(c.end - c.start for c in self.collectives
                                    if c.rank == r and c.phase not in ("replicas", "embedding")),
            })
            if ep:
                ranks[-1]["ep_all_to_all"] = ep
            if s.chains > 1 and self.step_ends:
                ranks[-1]["replica_exchange"] = sum(c.end - c.start for c in self.collectives
                                                    if c.rank == r and c.phase == "replicas")
            embedding = [c.end - c.start for c in self.collectives if c.rank == r and c.phase == "embedding"]
            if embedding:  # the tied embedding copy's gradient all-reduce with the first stage (pipesim.sim.step)
                ranks[-1]["embedding_allreduce"] = sum(embedding)
            if self.cp_seconds:
                ranks[-1]["cp_exposed"] = self.cp_exposed(r)
            if any(self.sm_shared):
                ranks[-1]["dp_sm_share"] = self.sm_shared[r]
            if self.step_ends:  # the step's end (only when the costs model the optimizer)
                end = self.step_ends[r]
                ranks[-1].update({"optimizer": end.optimizer, "optimizer_start": end.optimizer_start,
                                  "step_end": end.step_end, "dp_exposed": end.exposed,
                                  "zero3_gather_wait": end.gate_wait})
        memory = {"peak_activation_bytes": peaks, "peak_inflight_microbatches": inflight, "param_bytes": params}
        if memory_timeline:
            memory["timeline"] = [[[t, b] for t, b in tl] for tl in self.memory_timeline]
        collectives = [{"rank": c.rank, "kind": c.kind, "stage": c.stage, "start": c.start, "end": c.end,
                        "bytes": c.nbytes} for c in self.collectives]
        out = {
            "schema": SCHEMA,
            "schedule": {"name": s.name, "ranks": n, "stages": s.num_stages, "microbatches": s.num_microbatches,
                         "virtual": self.virtual, "split_backward": s.split_backward},
            "hardware": self.hardware,
            "comm": "links" if self.comm else "none",
            "parallel": {"pp": n, "dp": self.dp, "tp": self.tp, "devices": self.devices},
            "makespan": self.makespan,
            "bubble_fraction": self.bubble_fraction,
            "actions": self.num_actions(),
            "ranks": ranks,
            "links": self.link_stats(),
            "link_classes": self.link_class_stats(),
            "collectives": collectives,
            "memory": memory,
            "critical_path": self.critical_path(),
        }
        if self.cp > 1:
            out["parallel"]["cp"] = self.cp
        dims = self.job.dims
        if dims.has_experts:  # the expert layout (docs/moe.md)
            out["parallel"].update(ep=dims.ep, etp=dims.expert_tp, edp=dims.edp)
        if self.step_ends:
            for row, c in zip(collectives, self.collectives, strict=True):
                row["phase"] = c.phase
            out["step_time"] = self.step_time
        return out
