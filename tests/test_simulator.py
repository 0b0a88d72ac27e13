"""The simulator kernel and its plug-ins against exact references: critical paths, closed forms, hand-computed runs."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

import schedules
from pipesim.comm.collective_algos import collective_seconds
from pipesim.comm.tp_collective import TpCollective
from pipesim.cost.model_costs import ParallelCosts, model_costs
from pipesim.cost.table import CostTable, StageCosts
from pipesim.hardware.machine import DeviceSpec, Hardware, HostProfile, LinkClass
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.graph import critical_path
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.blame import exposed_comm
from pipesim.sim.simulator import simulate
from pipesim.timeline import Timeline


def toy_hardware(latency: float, bandwidth: float, *, shared: bool = False, devices: int = 4) -> Hardware:
    """One node whose link costs exactly latency + bytes / bandwidth (dyadic numbers: exact floats)."""
    device = DeviceSpec("toy", {"float32": 1e12}, 1e12, 2**34, 1.0)
    link = LinkClass("toylink", bandwidth, bandwidth, latency, shared)
    return Hardware("toy", device, devices, 1, link, None)


def admitted(name: str, ps=(1, 2, 3, 4), ms=(1, 2, 3, 4, 5, 8), vs=(2, 3)):
    """Every (p, m, v) the schedule builds for."""
    spec = schedules.spec(name)
    for p in ps:
        for m in ms:
            for v in (vs if spec.virtual else (1,)):
                try:
                    yield schedules.build(name, p, m, v)
                except Exception:  # noqa: BLE001  (combination not admitted, e.g. m % p for interleaved)
                    continue


@pytest.mark.parametrize("name", schedules.names())
def test_comm_none_makespan_equals_critical_path_exactly(name):
    built = list(admitted(name))
    assert built, f"{name} admitted no combination"
    for sched in built:
        # uneven, non-dyadic per-stage costs so equality is not an accident of round numbers
        table = CostTable(tuple(StageCosts(0.1 * (s + 1), 0.3 + 0.07 * s, 0.2 + 0.01 * s)
                                for s in range(sched.num_stages)))
        result = simulate(sched, table, comm=False)
        assert result.makespan == critical_path(sched, table.duration).makespan, (name, sched.num_ranks,
                                                                                  sched.num_microbatches)


def closed_form(name: str, p: int, m: int, v: int) -> Fraction:
    """formulas.md with t_F = t_I = t_W = 1 per stage (an interleaved rank holds v stages)."""
    t_f, t_b = 1, 2
    return {
        "naive": m * p * (t_f + t_b),
        "gpipe": (m + p - 1) * (t_f + t_b),
        "1f1b": (m + p - 1) * (t_f + t_b),
        "interleaved-1f1b": (m + Fraction(p - 1, v)) * v * (t_f + t_b),
        "zb-h1": m * 3 + (p - 1) * (1 + 1 - 1),
    }[name]


@pytest.mark.parametrize("name,p,m,v", [
    ("naive", 3, 4, 1), ("gpipe", 4, 8, 1), ("gpipe", 2, 1, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1),
    ("1f1b", 8, 32, 1), ("interleaved-1f1b", 4, 8, 2), ("interleaved-1f1b", 2, 6, 3), ("zb-h1", 4, 8, 1),
    ("zb-h1", 3, 3, 1),
])
def test_uniform_costs_reproduce_closed_forms(name, p, m, v):
    sched = schedules.build(name, p, m, v)
    result = simulate(sched, CostTable.uniform(sched.num_stages, 1.0, 1.0, 1.0), comm=False)
    assert result.makespan == closed_form(name, p, m, v)
    if name in ("gpipe", "1f1b"):
        assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-15)


def test_two_ranks_with_links_exact_action_starts():
    # 1f1b p=2 m=2, F=1, B=2, each message 0.25 s latency + 1 byte / 4 B/s = 0.5 s
    sched = schedules.build("1f1b", 2, 2)
    table = CostTable.uniform(2, 1.0, 1.0, 1.0, boundary_bytes=1)
    result = simulate(sched, table, toy_hardware(0.25, 4.0))
    starts = [[(str(a), result.starts[r][i]) for i, a in enumerate(prog)]
              for r, prog in enumerate(result.schedule.programs)]
    assert starts[0] == [("0F0", 0), ("0SEND_F0", 1), ("0F1", 1), ("0SEND_F1", 2), ("0RECV_B0", 2), ("0B0", 5),
                         ("0RECV_B1", 7), ("0B1", 8)]
    assert starts[1] == [("1RECV_F0", 0), ("1F0", 1.5), ("1B0", 2.5), ("1SEND_B0", 4.5), ("1RECV_F1", 4.5),
                         ("1F1", 4.5), ("1B1", 5.5), ("1SEND_B1", 7.5)]
    assert result.makespan == 10
    assert [(str(t.send), t.start, t.end) for t in result.transfers] == [
        ("0SEND_F0", 1, 1.5), ("0SEND_F1", 2, 2.5), ("1SEND_B0", 4.5, 5), ("1SEND_B1", 7.5, 8)]
    assert [result.waiting_comm(r) for r in (0, 1)] == [3 + 1, 1.5]
    assert [result.busy(r) for r in (0, 1)] == [6, 6]
    assert result.bubble_fraction == 0.4


def test_exposed_comm_is_the_in_flight_part_of_each_wait():
    """The run above: rank 1's RECV_F0 waits 0-1.5 (stage 0 computing F0 until 1, its message moving 1-1.5); rank 0's
    RECV_B0 waits 2-5 (stage 1 computing until 4.5, the message 4.5-5) and RECV_B1 7-8 (7.5, 7.5-8). Only the moving
    part is communication; the rest is the pipeline's fill and drain (the planner's bubble)."""
    sched = schedules.build("1f1b", 2, 2)
    result = simulate(sched, CostTable.uniform(2, 1.0, 1.0, 1.0, boundary_bytes=1), toy_hardware(0.25, 4.0))
    assert exposed_comm(result) == [0.5 + 0.5, 0.5]
    assert [result.waiting_comm(r) for r in (0, 1)] == [3 + 1, 1.5]
    alone = simulate(sched, CostTable.uniform(2, 1.0, 1.0, 1.0, boundary_bytes=1), comm=False)
    assert exposed_comm(alone) == [0, 0] and [alone.waiting_comm(r) for r in (0, 1)] == [3, 1]


def test_messages_from_one_port_serialize():
    # gpipe p=2 m=2, F=1, I=W=0.5, every message 2 s: the second send waits for the first on device 0's tx
    sched = schedules.build("gpipe", 2, 2)
    result = simulate(sched, CostTable.uniform(2, 1.0, 0.5, 0.5, boundary_bytes=0), toy_hardware(2.0, 1.0))
    assert [(str(t.send), t.post, t.start, t.end) for t in result.transfers] == [
        ("0SEND_F0", 1, 1, 3), ("0SEND_F1", 2, 3, 5), ("1SEND_B0", 7, 7, 9), ("1SEND_B1", 8, 9, 11)]
    assert result.transfers[1].blocker is result.transfers[0]
    assert result.makespan == 12
    links = {x["resource"]: x for x in result.link_stats()}
    assert links["n0.d0.toylink.tx"]["busy"] == 4 and links["n0.d0.toylink.tx"]["utilization"] == 4 / 12
    path = result.critical_path()
    assert [e["name"] for e in path if e["kind"] == "transfer"] == ["0SEND_F0", "0SEND_F1", "1SEND_B0", "1SEND_B1"]


def _overlaps(transfers) -> int:
    spans = sorted((t.start, t.end) for t in transfers)
    return sum(1 for (a0, a1), (b0, _) in zip(spans, spans[1:]) if b0 < a1)


def test_shared_bus_serializes_all_messages_switched_ports_do_not():
    sched = schedules.build("1f1b", 4, 8)
    table = CostTable.uniform(4, 1.0, 0.5, 0.5, boundary_bytes=4)
    switched = simulate(sched, table, toy_hardware(0.5, 4.0))
    shared = simulate(sched, table, toy_hardware(0.5, 4.0, shared=True))
    assert _overlaps(switched.transfers) > 0  # different rank pairs talk at once on a switch
    assert _overlaps(shared.transfers) == 0  # one bus: every message waits for the one before
    assert [x["resource"] for x in shared.link_stats()] == ["n0.toylink.bus"]
    assert shared.makespan > switched.makespan


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (3, 5)])
def test_peak_activation_memory(p, m):
    act = 1000
    for name, expected in (("gpipe", [m * act] * p), ("1f1b", [min(p - s, m) * act for s in range(p)])):
        sched = schedules.build(name, p, m)
        result = simulate(sched, CostTable.uniform(p, 1.0, 1.0, 1.0, activation_bytes=act), comm=False)
        assert result.peak_activation_bytes() == expected
        for timeline in result.memory_timeline:
            assert timeline[0] == (0.0, 0) and timeline[-1][1] == 0  # all released by the end of the step


def test_dp_allreduce_adds_exactly_its_time_at_the_end():
    hw = load_hardware("dgx-h100")
    sched = schedules.build("1f1b", 1, 4)
    costs = ParallelCosts(CostTable.uniform(1, 1.0, 0.5, 0.5), Job(ParallelDims(dp=2)), tp_collectives={},
                          dp_grad_bytes=(10**9,), layers_per_stage=(0,))
    result = simulate(sched, costs, hw)
    t_ar = collective_seconds(hw, "all_reduce", [0, 1], 10**9)
    assert t_ar > 0
    assert result.makespan == 8.0 + t_ar
    assert [(c.stage, c.start, c.end) for c in result.collectives] == [(0, 8.0, 8.0 + t_ar)]
    assert result.critical_path()[-1]["kind"] == "collective"


def test_tp_collectives_block_inside_compute():
    hw = load_hardware("dgx-h100")
    sched = schedules.build("gpipe", 1, 1)
    ar = TpCollective("all_reduce", 2**20)
    costs = ParallelCosts(CostTable.uniform(1, 1.0, 0.5, 0.5), Job(ParallelDims(tp=4)),
                          tp_collectives={(0, "F"): (ar,), (0, "B"): (ar,) * 2},
                          dp_grad_bytes=(0,), layers_per_stage=(0,))
    result = simulate(sched, costs, hw)
    t = collective_seconds(hw, "all_reduce", [0, 1, 2, 3], 2**20)
    assert result.makespan == (1.0 + t) + (1.0 + 2 * t)
    kinds = [(e.stream, e.kind) for e in result.timeline().events]
    assert kinds == [("compute", "F"), ("collective", "tp"), ("compute", "B"), ("collective", "tp")]


def test_replicas_and_shards_place_ranks_on_megatron_devices():
    hw = load_hardware("2x-dgx-h100")
    model = ModelConfig(kind="gpt", hidden=256, layers=4, heads=4, seq=64, vocab=512, batch=16)
    sched = schedules.build("1f1b", 2, 4)
    costs = model_costs(model, 2, 4, hw, Job(ParallelDims(tp=2, dp=4)))
    result = simulate(sched, costs, hw)
    assert result.devices == [0, 8]  # rank r on device r * dp * tp: the pipeline crosses the node boundary
    assert {t.link for t in result.transfers} == {"infiniband"}
    assert len(result.collectives) == 2 and all(c.nbytes > 0 for c in result.collectives)


def test_critical_path_is_contiguous_and_spans_the_makespan():
    hw = load_hardware("dgx-h100")
    model = ModelConfig(kind="gpt", hidden=512, layers=8, heads=8, seq=128, vocab=1024, batch=32)
    for name in schedules.names():
        sched = next(admitted(name, ps=(4,), ms=(8,)))
        result = simulate(sched, model_costs(model, sched.num_stages, 8, hw), hw)
        path = result.critical_path()
        assert path[0]["start"] == 0 and path[-1]["end"] == result.makespan
        assert all(b["start"] == a["end"] for a, b in zip(path, path[1:])), name


def test_same_input_same_json_bit_for_bit():
    hw = load_hardware("2x-dgx-h100")
    model = ModelConfig(kind="gpt", hidden=256, layers=8, heads=4, seq=64, vocab=512, batch=32)
    sched = schedules.build("interleaved-1f1b", 4, 8, 2)
    costs = model_costs(model, 8, 8, hw, Job(ParallelDims(dp=2)))
    texts = {json.dumps(simulate(sched, costs, hw).to_dict()) for _ in range(2)}
    assert len(texts) == 1


def test_timeline_has_every_action_and_round_trips(tmp_path):
    sched = schedules.build("zb-h1", 3, 4)
    result = simulate(sched, CostTable.uniform(3, 1.0, 1.0, 1.0, boundary_bytes=8), toy_hardware(0.25, 32.0))
    timeline = result.timeline()
    by_stream = {s: [e for e in timeline.events if e.stream == s] for s in ("compute", "send", "recv")}
    assert len(by_stream["compute"]) == sum(1 for prog in sched.programs for a in prog)
    assert len(by_stream["send"]) == len(by_stream["recv"]) == len(result.transfers) > 0
    assert all(e.bytes == 8 and e.peer >= 0 for e in by_stream["send"] + by_stream["recv"])
    assert timeline.source == "simulated" and timeline.makespan == result.makespan
    timeline.write(tmp_path / "t.json")
    assert Timeline.read(tmp_path / "t.json").events == timeline.events


def test_json_schema_keys_and_units():
    sched = schedules.build("1f1b", 2, 4)
    d = simulate(sched, CostTable.uniform(2, 1.0, 1.0, 1.0, boundary_bytes=4, activation_bytes=8),
                 toy_hardware(0.25, 4.0)).to_dict()
    assert d["schema"] == "pipesim.simulate/1"
    for key in ("schedule", "hardware", "comm", "parallel", "makespan", "bubble_fraction", "ranks", "links",
                "link_classes", "collectives", "memory", "critical_path"):
        assert key in d
    assert d["makespan"] == 20.0  # by hand: 1.25 s messages; closed form without them is 15
    rank = d["ranks"][0]
    assert rank["busy"] + rank["idle"] == d["makespan"]
    assert d["memory"]["peak_activation_bytes"] == [16, 8]
    assert d["link_classes"]["toylink"]["bytes"] == 4 * 2 * 4


@pytest.mark.parametrize("name", schedules.names())
def test_peak_inflight_matches_the_schedule_analysis(name):
    from pipesim.ir.inflight import inflight_by_rank

    for sched in admitted(name, ps=(2, 4), ms=(4, 8)):
        result = simulate(sched, CostTable.uniform(sched.num_stages, 1.0, 1.0, 1.0), comm=False)
        assert result.peak_inflight == inflight_by_rank(sched)


def test_a_deadlocked_program_is_reported_not_hung():
    from pipesim.errors import PipesimError
    from pipesim.ir.schedule import Action, Schedule

    progs = (tuple(map(Action.parse, ["0RECV_B0", "0F0", "0SEND_F0", "0B0"])),
             tuple(map(Action.parse, ["1RECV_F0", "1F0", "1B0", "1SEND_B0"])))
    sched = Schedule("stuck", 1, (0, 1), progs)
    with pytest.raises(PipesimError, match=r"deadlocked on ranks \[0, 1\]"):
        simulate(sched, CostTable.uniform(2, 1.0, 1.0, 1.0), comm=False)


def test_send_posting_and_late_recvs_exact_times():
    # the 1f1b p=2 m=2 case above, plus: a SEND holds its rank 0.25 s and its message leaves at the end;
    # a RECV begun after its message was posted lasts at least 1 s (gloo progress), a waiting one does not
    from dataclasses import replace

    sched = schedules.build("1f1b", 2, 2)
    table = CostTable.uniform(2, 1.0, 1.0, 1.0, boundary_bytes=1)
    # a host profile with a core per rank and no slowdown: compute runs as on a device of its own
    hw = replace(toy_hardware(0.25, 4.0), host=HostProfile(cores=2, send_overhead=0.25, late_recv_delay=1.0))
    result = simulate(sched, table, hw)
    spans = [[(str(a), result.starts[r][i], result.ends[r][i]) for i, a in enumerate(prog)]
             for r, prog in enumerate(result.schedule.programs)]
    assert spans[0] == [("0F0", 0, 1), ("0SEND_F0", 1, 1.25), ("0F1", 1.25, 2.25), ("0SEND_F1", 2.25, 2.5),
                        ("0RECV_B0", 2.5, 5.5), ("0B0", 5.5, 7.5), ("0RECV_B1", 7.5, 9.75), ("0B1", 9.75, 11.75)]
    assert spans[1] == [("1RECV_F0", 0, 1.75), ("1F0", 1.75, 2.75), ("1B0", 2.75, 4.75), ("1SEND_B0", 4.75, 5),
                        ("1RECV_F1", 5, 6), ("1F1", 6, 7), ("1B1", 7, 9), ("1SEND_B1", 9, 9.25)]
    assert [(str(t.send), t.post, t.start, t.end) for t in result.transfers] == [
        ("0SEND_F0", 1.25, 1.25, 1.75), ("0SEND_F1", 2.5, 2.5, 3), ("1SEND_B0", 5, 5, 5.5),
        ("1SEND_B1", 9.25, 9.25, 9.75)]
    assert result.makespan == 11.75
    assert [result.busy(r) for r in (0, 1)] == [6, 6]  # posting is idle time, not compute
    # without communication the terms vanish: the critical path of compute alone
    assert simulate(sched, table, hw, comm=False).makespan == 9


def test_p2p_plugins_closed_forms():
    from pipesim.sim.links import GlooP2P, PlainP2P

    plain = PlainP2P()
    assert plain.send_hold == 0.0 and plain.recv_done(5.0, 1.0, 3.0) == 3.0 and plain.recv_done(1.0, 2.0, 4.0) == 4.0
    gloo = GlooP2P(send_hold=0.25, late_recv=1.0)
    assert gloo.recv_done(5.0, 1.0, 3.0) == 6.0  # posted before the RECV began: at least 1 s
    assert gloo.recv_done(5.0, 1.0, 7.0) == 7.0  # still moving longer than that: the arrival
    assert gloo.recv_done(1.0, 2.0, 2.5) == 2.5  # posted after the RECV began (it waited): the arrival
    assert GlooP2P(0.25, 0.0).recv_done(5.0, 1.0, 3.0) == 3.0


def test_plugins_passed_in_replace_the_ones_the_hardware_chooses():
    """1F1B p = 2, m = 1, F = I = W = 1 s, no hardware: plain, F0 [0, 1], F1 [1, 2], B1 [2, 4], B0 [4, 6]. Given
    gloo's P2P plug-in, each SEND holds its rank h = 0.25 s before its message leaves: the forward's and the
    backward's SENDs are both on the path, so 6 + 2 h."""
    from pipesim.sim.links import GlooP2P, PlainP2P
    from pipesim.sim.plugins import Plugins
    from pipesim.sim.program import TableCompute

    sched, table = schedules.build("1f1b", 2, 1), CostTable.uniform(2, 1.0, 1.0, 1.0)
    assert simulate(sched, table).makespan == 6.0
    assert simulate(sched, table, plugins=Plugins(TableCompute(table), PlainP2P())).makespan == 6.0
    held = simulate(sched, table, plugins=Plugins(TableCompute(table), GlooP2P(send_hold=0.25, late_recv=0.0)))
    assert held.makespan == 6.5
    assert [(str(a), held.starts[0][i], held.ends[0][i]) for i, a in enumerate(held.schedule.programs[0])] == [
        ("0F0", 0.0, 1.0), ("0SEND_F0", 1.0, 1.25), ("0RECV_B0", 1.25, 4.5), ("0B0", 4.5, 6.5)]


def test_compute_plugin_adds_split_bookkeeping_only_with_a_host_profile():
    from pipesim.cost.cost_equation import SplitCosts
    from pipesim.ir.schedule import Action, Kind
    from pipesim.sim.program import TableCompute

    stage = StageCosts(1.0, 2.0, 4.0, weight_ops=3, backward_ops=5)
    table = CostTable((stage, stage))
    plain = TableCompute(table)
    assert [plain.seconds(Action(1, k, 0)) for k in (Kind.F, Kind.I, Kind.W, Kind.B)] == [1.0, 2.0, 4.0, 6.0]
    host = TableCompute(table, SplitCosts(0.5, 0.25, 0.125))
    assert host.seconds(Action(1, Kind.I, 0)) == 2.0 + 0.5 + 5 * 0.125  # walks the stage's backward graph
    assert host.seconds(Action(1, Kind.W, 0)) == 4.0 + 0.5 + 3 * 0.25  # autograd once per parameter group
    assert host.seconds(Action(1, Kind.B, 0)) == 6.0 and host.seconds(Action(1, Kind.F, 0)) == 1.0
    assert host.seconds(Action(0, Kind.W, 0)) == 4.0  # the first stage's W is a plain backward
    rerun = StageCosts(1.0, 2.0, 4.0, weight_ops=3, backward_ops=5, split_rerun=0.75)  # full recomputation's forward
    again = TableCompute(CostTable((rerun, rerun)), SplitCosts(0.5, 0.25, 0.125))
    assert again.seconds(Action(1, Kind.W, 0)) == 4.0 + 0.5 + 3 * 0.25 + 0.75  # re-run once more in a split W
    assert again.seconds(Action(1, Kind.I, 0)) == host.seconds(Action(1, Kind.I, 0))
    assert again.seconds(Action(1, Kind.B, 0)) == 6.0 and again.seconds(Action(0, Kind.W, 0)) == 4.0
    assert TableCompute(CostTable((rerun, rerun))).seconds(Action(1, Kind.W, 0)) == 4.0  # no host profile


def test_cpu_plugins_only_for_hardware_with_a_host_profile():
    from dataclasses import replace

    from pipesim.sim.clock import Clock
    from pipesim.sim.host.sharing import HostSharing
    from pipesim.sim.host.slices import HostTimeSlices
    from pipesim.sim.links import GlooP2P, PlainP2P
    from pipesim.sim.plugins import plugins_for

    table = CostTable.uniform(2, 1.0, 1.0, 1.0)
    for name in ("dgx-h100", "2x-dgx-h100", "pcie-4gpu"):
        gpu = plugins_for(table, load_hardware(name), comm=True)
        assert load_hardware(name).host is None and gpu.host is None and isinstance(gpu.p2p, PlainP2P)
        assert gpu.compute.split is None
    cpu = load_hardware("local-cpu")
    plugins = plugins_for(table, cpu, comm=True)
    assert isinstance(plugins.host(Clock(), [[0], [1]]), HostTimeSlices)
    assert plugins.compute.split == cpu.host.split_costs
    assert plugins.p2p == GlooP2P(cpu.host.send_overhead, cpu.host.late_recv_delay)
    assert isinstance(plugins_for(table, cpu, comm=False).p2p, PlainP2P)  # no links: nothing to post or wait for
    fluid = replace(cpu, host=replace(cpu.host, time_slice=0.0))
    assert isinstance(plugins_for(table, fluid, comm=True).host(Clock(), [[0], [1]]), HostSharing)
    assert plugins_for(table, None, comm=True).host is None


def test_message_slots_pair_each_send_with_its_recv():
    from pipesim.ir.deps import message_slot
    from pipesim.ir.lowering import add_p2p

    sched = add_p2p(schedules.build("interleaved-1f1b", 4, 8, 2))
    m = sched.num_microbatches
    comms = [a for p in sched.programs for a in p if a.is_comm]
    sends = {message_slot(a.stage, a.kind, a.microbatch, m): a for a in comms if a.kind.value.startswith("SEND")}
    recvs = {message_slot(a.stage, a.kind, a.microbatch, m): a for a in comms if a.kind.value.startswith("RECV")}
    assert len(sends) == len(recvs) == len(comms) // 2
    assert all(recvs[slot] == send.matching() for slot, send in sends.items())
    assert max(sends) < 2 * sched.num_stages * m
