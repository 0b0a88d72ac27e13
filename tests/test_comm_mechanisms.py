"""Issue 15's communication mechanisms in the simulator, in closed form: Megatron's scatter/gather of pipeline
messages, blocking and held pipeline sends, and NCCL's algorithms as the one collective dispatch
(pipesim.comm.comm_options, pipesim.comm.collective_algos, pipesim.sim.step). The data-parallel buckets and SM
sharing: tests/test_dp_bucket_mechanism.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

import schedules
from pipesim.comm.collective_algos import collective_seconds, collective_time
from pipesim.comm.collective_costs import KINDS, group_collective_time
from pipesim.comm.comm_options import CommOptions
from pipesim.comm.tp_collective import TpCollective
from pipesim.cost.model_costs import uniform_costs
from pipesim.cost.step_costs import RingExchange
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.ir.schedule import Kind
from pipesim.job import Job
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.blame import exposed_comm
from pipesim.sim.program import cp_exposed
from pipesim.sim.simulator import simulate

US = 1e-6  # seconds per microsecond
MS = 1e-3  # seconds per millisecond
A100X2 = load_hardware("dgx-a100").with_nodes(2)  # NVSwitch 240 GB/s in a node, one 23.75 GB/s HDR NIC per GPU
H100 = load_hardware("dgx-h100")
CPU = load_hardware("local-cpu")


def _index(res, rank: int, kind: Kind, stage: int) -> int:
    return next(i for i, a in enumerate(res.schedule.programs[rank]) if a.kind == kind and a.stage == stage)


# -- mechanism 3: Megatron's scatter/gather of pipeline messages ------------------------------------------------

def _two_stage(nbytes: int, *, tp: int = 8, sp: bool = False):
    """p = 2 (one dgx-a100 node each), one microbatch, 1 ms per F / I / W, an S = `nbytes` boundary."""
    costs = uniform_costs(2, {"F": MS, "I": MS, "W": MS}, boundary_bytes=nbytes)
    return replace(costs, job=Job(ParallelDims(tp=tp), sp=sp))


def test_scatter_gather_sends_one_tth_per_nic_then_all_gathers_in_the_receiving_node():
    s = 64 * 2**20  # bytes: b s h x 2 of a message
    sched = schedules.build("1f1b", 2, 1)
    res = simulate(sched, _with_comm(_two_stage(s), CommOptions(scatter_gather=True)), A100X2)
    nic, nvlink = A100X2.inter, A100X2.intra
    send = nic.latency + (s // 8) / nic.bandwidth  # each tp rank's part over its own NIC, side by side
    # the receiving node's 8 ranks all-gather S: NCCL's ring with Simple, base 8.4 us + 7 NVLink steps of 3.4 us
    gather = (8.4 + 7 * 3.4) * US + 7 / 8 * s / nvlink.bandwidth
    assert collective_time("all_gather", s, list(range(8, 16)), A100X2).protocol == "Simple"
    tr = res.transfers[0]
    assert (tr.nbytes, tr.start, tr.link) == (s // 8, MS, "infiniband")
    assert tr.end == pytest.approx(MS + send, rel=1e-12)
    assert tr.resources == ("n0.d0.infiniband.tx", "n1.d8.infiniband.rx")  # tp rank 0's rail
    f1 = _index(res, 1, Kind.F, 1)
    assert res.starts[1][f1] == pytest.approx(MS + send + gather, rel=1e-12)  # RECV ends after the all-gather
    link = next(r for r in res.link_stats() if r["resource"] == "n0.d0.infiniband.tx")
    assert link["bytes"] == s // 8 and link["busy"] == pytest.approx(send, rel=1e-12)  # NIC bytes shrink by t


def test_without_scatter_gather_one_rank_sends_the_whole_boundary_over_one_nic():
    s = 64 * 2**20
    sched = schedules.build("1f1b", 2, 1)
    res = simulate(sched, _two_stage(s), A100X2)
    tr = res.transfers[0]
    assert tr.nbytes == s and tr.end - tr.start == pytest.approx(A100X2.inter.latency + s / 23.75e9, rel=1e-12)
    assert res.starts[1][_index(res, 1, Kind.F, 1)] == tr.end
    assert res.makespan == simulate(sched, _with_comm(_two_stage(s), CommOptions()), A100X2).makespan


@pytest.mark.parametrize("costs", [_two_stage(2**24, sp=True), _two_stage(2**24, tp=1)], ids=["sp", "tp1"])
def test_scatter_gather_changes_nothing_with_sequence_parallelism_or_one_tp_rank(costs):
    sched = schedules.build("1f1b", 2, 4)
    plain = simulate(sched, costs, A100X2)
    split = simulate(sched, _with_comm(costs, CommOptions(scatter_gather=True)), A100X2)
    assert (split.starts, split.ends, split.makespan) == (plain.starts, plain.ends, plain.makespan)


def test_a_late_receiver_still_pays_the_all_gather():
    """The gather runs on the receiving ranks after the bytes are in: a RECV reached late is not free."""
    s = 2**20
    sched = schedules.build("1f1b", 2, 4)
    res = simulate(sched, _with_comm(_two_stage(s), CommOptions(scatter_gather=True)), A100X2)
    gather = collective_seconds(A100X2, "all_gather", list(range(8, 16)), s)
    for i, a in enumerate(res.schedule.programs[1]):
        if a.kind == Kind.RECV_F:
            arrive = res.recv_transfer(a).end
            assert res.ends[1][i] == max(res.starts[1][i], arrive) + gather


def test_blocking_p2p_holds_the_sender_until_its_bytes_have_arrived():
    """Megatron's p2p_communication waits on every isend (batch_isend_irecv, wait, synchronize): the sender's
    next action starts when its message's bytes are in; pipesim's default isend lets it start at once."""
    s = 64 * 2**20
    sched = schedules.build("1f1b", 2, 2)
    free = simulate(sched, _two_stage(s), A100X2)
    held = simulate(sched, _with_comm(_two_stage(s), CommOptions(blocking_p2p=True)), A100X2)
    hop = A100X2.inter.latency + s / A100X2.inter.bandwidth  # the whole boundary over one HDR NIC
    prog = held.schedule.programs[0]
    send = next(i for i, a in enumerate(prog) if a.kind == Kind.SEND_F)  # F0's activation
    assert prog[send + 1].kind == Kind.F and prog[send + 1].microbatch == 1
    assert free.starts[0][send + 1] == free.ends[0][send] == MS  # the isend costs its rank nothing
    assert held.ends[0][send] == held.starts[0][send + 1] == pytest.approx(MS + hop, rel=1e-12)
    assert held.transfers[0].end == held.ends[0][send]
    # critical path: F0 (1 ms), hop, stage 1's F0 + B0 (3 ms), [held: stage 1 sends B0's gradient (hop) before
    # its F1], F1 + B1 (3 ms), hop, stage 0's B1 (2 ms)
    assert free.makespan == pytest.approx(9 * MS + 2 * hop, rel=1e-12)
    assert held.makespan == pytest.approx(9 * MS + 3 * hop, rel=1e-12)
    # exposed communication (the planner's): every held send, and the in-flight part of each wait; stage 0's RECV_B0
    # begins 2 ms before stage 1's gradient arrives (its F1 and held SEND_F1 against stage 1's F0 and B0)
    assert exposed_comm(free)[1] == pytest.approx(hop, rel=1e-12)
    assert exposed_comm(held) == pytest.approx([3 * hop + 2 * MS, 3 * hop], rel=1e-12)
    assert CommOptions(blocking_p2p=True).flags() == ["--blocking-p2p"]
    assert CommOptions(blocking_p2p=True).report()["blocking_p2p"] is True


@pytest.mark.parametrize("hw", [A100X2, CPU], ids=["gpu", "host-cores"])
def test_every_blocking_send_ends_with_its_transfer_and_its_rank_waits(hw):
    """On a GPU preset and on host cores (gloo: posting the isend is CPU work first), a held SEND's action ends
    when its bytes arrive, and its rank's next action starts no earlier."""
    sched = schedules.build("interleaved-1f1b", 2, 4, virtual=2)
    costs = uniform_costs(4, {"F": MS, "I": MS, "W": MS}, boundary_bytes=2**22)
    held = simulate(sched, _with_comm(costs, CommOptions(blocking_p2p=True)), hw)
    free = simulate(sched, costs, hw)
    assert len(held.transfers) == len(free.transfers) == 2 * 4 * (2 * 2 - 1)  # F and B messages between chunks
    for tr in held.transfers:
        i = tr.send_index
        assert held.ends[tr.src][i] == tr.end >= tr.post
        if i + 1 < len(held.starts[tr.src]):
            assert held.starts[tr.src][i + 1] >= tr.end
    assert any(free.ends[tr.src][tr.send_index] < tr.end for tr in free.transfers)  # there the rank went on
    assert held.makespan > free.makespan


def test_megatrons_interleaved_schedule_holds_only_its_warm_up_and_flush_sends():
    """--overlap-p2p-communication overlaps the steady state's sends; the warm-up's and the flush's wait (Megatron-core
    schedules.py, unless --overlap-p2p-communication-warmup-flush). p = 2, v = 2, m = 4 (`pipesim schedule`): rank 0
    runs 0F0 0F1 2F0 2F1 | 0F2 2B0 ... 2F3 0B1 | 2B2 2B3 0B2 0B3, rank 1 1F0 1F1 | 3F0 3B0 ... 3F3 3B3 | 1B2 1B3."""
    sched = schedules.build("interleaved-1f1b", 2, 4, virtual=2)
    costs = uniform_costs(4, {"F": MS, "I": MS, "W": MS}, boundary_bytes=2**22)

    def held(comm: CommOptions) -> set[tuple[int, str, int, int]]:
        res = simulate(sched, _with_comm(costs, comm), A100X2)
        out = set()
        for tr in res.transfers:
            a = res.schedule.programs[tr.src][tr.send_index]
            assert res.ends[tr.src][tr.send_index] in (tr.post, tr.end) and tr.end > tr.post
            if res.ends[tr.src][tr.send_index] == tr.end:
                out.add((tr.src, a.kind.value, a.stage, a.microbatch))
        return out

    edges = {(0, "SEND_F", 0, 0), (0, "SEND_F", 0, 1), (0, "SEND_F", 2, 0), (0, "SEND_F", 2, 1),
             (0, "SEND_B", 2, 2), (0, "SEND_B", 2, 3),
             (1, "SEND_F", 1, 0), (1, "SEND_F", 1, 1), (1, "SEND_B", 1, 2), (1, "SEND_B", 1, 3)}
    assert held(CommOptions(blocking_p2p=True, overlap_p2p_comm=True)) == edges
    assert held(CommOptions(blocking_p2p=True, overlap_p2p_comm=True, overlap_p2p_warmup_flush=True)) == set()
    assert len(held(CommOptions(blocking_p2p=True))) == 2 * 4 * (2 * 2 - 1)  # every send
    assert CommOptions(blocking_p2p=True, overlap_p2p_comm=True, overlap_p2p_warmup_flush=True).flags()[-1] == \
        "--overlap-p2p-communication-warmup-flush"
    with pytest.raises(PipesimError) as err:
        CommOptions(blocking_p2p=True, overlap_p2p_warmup_flush=True)
    assert str(err.value) == "--overlap-p2p-communication-warmup-flush needs --overlap-p2p-communication (as " \
        "Megatron-core)"


def test_blocking_p2p_changes_nothing_without_links():
    sched = schedules.build("interleaved-1f1b", 2, 4, virtual=2)
    costs = uniform_costs(4, {"F": MS, "I": MS, "W": MS}, boundary_bytes=2**20)
    plain = simulate(sched, costs, A100X2, comm=False)
    held = simulate(sched, _with_comm(costs, CommOptions(blocking_p2p=True)), A100X2, comm=False)
    assert (held.starts, held.ends, held.makespan) == (plain.starts, plain.ends, plain.makespan)


def _with_comm(costs, options: CommOptions):
    """The same costs with the job's communication switches set to `options`."""
    return replace(costs, job=replace(costs.job, comm=options))


# -- mechanism 5: one collective dispatch, NCCL's algorithms on GPU presets --------------------------------------

@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"])
def test_dispatch_is_nccls_choice_on_gpu_presets(kind):
    two = load_hardware("2x-dgx-h100")
    for devices in ([0, 1], list(range(8)), [0, 8], list(range(16))):
        group = devices[:2] if kind == "send_recv" else devices
        assert collective_seconds(two, kind, group, 2**26) == collective_time(kind, 2**26, group, two).seconds


@pytest.mark.parametrize("kind", KINDS)
def test_dispatch_is_comm_costs_bit_for_bit_on_the_cpu_preset(kind):
    devices = [0, 1] if kind == "send_recv" else list(range(min(4, CPU.num_devices)))
    for nbytes in (1, 4096, 3 * 2**20 + 7):
        assert collective_seconds(CPU, kind, devices, nbytes) == group_collective_time(CPU, kind, devices, nbytes)


def test_simulated_dp_and_tp_collectives_are_timed_by_the_dispatch():
    two = load_hardware("2x-dgx-h100")
    g = 2**28  # bytes of gradients, all-reduced across the two nodes (dp = 2, one rank per node, tp = 8)
    costs = replace(uniform_costs(1, {"F": MS, "I": MS, "W": MS}), job=Job(ParallelDims(tp=8, dp=2)),
                    dp_grad_bytes=(g,), tp_collectives={(0, "F"): (TpCollective("all_reduce", 2**24),)})
    res = simulate(schedules.build("1f1b", 1, 1), costs, two)
    (rec,) = res.collectives
    nccl = collective_time("all_reduce", g, [0, 8], two)
    assert rec.end - rec.start == pytest.approx(nccl.seconds, rel=1e-12)
    assert nccl.seconds != group_collective_time(two, "all_reduce", [0, 8], g)  # not the alpha-beta ring any more
    f = _index(res, 0, Kind.F, 0)
    assert res.tp_time[0][f] == collective_seconds(two, "all_reduce", list(range(8)), 2**24)


def test_ring_attention_hops_are_timed_by_the_dispatch():
    par = ParallelDims(pp=1, cp=2)
    sched = schedules.build("1f1b", 1, 1)
    hop = RingExchange(2**24, 3, 0.0)  # three hops with nothing to hide behind
    got = cp_exposed(sched, H100, True, par, {(0, "F"): (hop,)})
    assert got == {(0, "F"): 3 * collective_seconds(H100, "send_recv", [0, 1], 2**24)}
