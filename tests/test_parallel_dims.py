"""The rank layout (pipesim.parallel_dims) exactly, and the tie between its two users.

The executor's Mesh and the simulator's device placement both read ParallelDims; the tie tests check
that the simulator's device for each coordinate is the device the executor's rank with those
coordinates runs on (torchrun: node n holds ranks n * nproc_per_node ...), and that every simulated
P2P and collective uses the links that follow. The executor's real process groups are checked against
ParallelDims on gloo in tests/test_data_parallel.py (its 4-process spawn is reused).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

import schedules
from executor.experts import MoeMLP, shard_experts
from executor.mesh import Mesh
from pipesim.comm.collective_algos import collective_seconds
from pipesim.comm.tp_collective import TpCollective
from pipesim.cost.model_costs import ParallelCosts, model_costs
from pipesim.cost.table import CostTable
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.config import ModelConfig
from pipesim.model.moe import MoeConfig
from pipesim.parallel_dims import AXES, EXPERT_AXES, Coords, ExpertCoords, ParallelDims
from pipesim.sim.simulator import simulate

SIZES = (1, 2, 3)  # per axis; every combination of the four axes is tested


def _all_dims():
    for pp, dp, cp, tp in itertools.product(SIZES, repeat=4):
        yield ParallelDims(pp=pp, dp=dp, cp=cp, tp=tp)


# -- ParallelDims alone --------------------------------------------------------------------------------


def test_coords_of_a_2x2x2_grid_pp_outermost_tp_innermost():
    dims = ParallelDims(pp=2, dp=2, tp=2)
    assert [(c.pp, c.dp, c.cp, c.tp) for c in map(dims.coords, range(8))] == [
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 0), (0, 1, 0, 1), (1, 0, 0, 0), (1, 0, 0, 1), (1, 1, 0, 0), (1, 1, 0, 1)]
    assert dims.rank(pp=1, dp=1, tp=0) == 6 and dims.world == 8


def test_rank_and_coords_are_inverse_with_megatron_strides():
    for dims in _all_dims():
        ranks = []
        for pp, dp, cp, tp in itertools.product(range(dims.pp), range(dims.dp), range(dims.cp), range(dims.tp)):
            r = dims.rank(pp=pp, dp=dp, cp=cp, tp=tp)
            assert r == ((pp * dims.dp + dp) * dims.cp + cp) * dims.tp + tp, dims
            assert dims.coords(r) == Coords(pp=pp, dp=dp, cp=cp, tp=tp), (dims, r)
            ranks.append(r)
        assert ranks == list(range(dims.world)), dims  # pp outermost ... tp innermost: row-major order


def test_group_members_of_a_2x2x2_grid():
    dims = ParallelDims(pp=2, dp=2, tp=2)
    assert dims.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dims.groups("cp") == [[r] for r in range(8)]
    assert dims.group("dp", 5) == [5, 7] and dims.group("tp", 5) == [4, 5] and dims.group("pp", 5) == [1, 5]
    assert [dims.pp_peer(5, p) for p in range(2)] == [1, 5]


def test_dense_replicas_are_dp_times_cp_as_megatron_cores_data_parallel_group_with_cp():
    # pp 2, dp 2, cp 2, tp 2: rank = ((pp dp + d) cp + c) tp + t; the dense parameters' replicas of rank 5
    # (pp 0, dp 1, cp 0, tp 1) are every (dp, cp) of its pp and tp: 1, 3, 5, 7
    dims = ParallelDims(pp=2, dp=2, cp=2, tp=2)
    assert dims.dp_cp == 4 and dims.group("dp_cp", 5) == [1, 3, 5, 7]
    assert dims.groups("dp_cp") == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert dims.group("dp", 5) == [1, 5] and dims.group("cp", 5) == [5, 7]


def test_groups_partition_the_world_along_one_axis():
    for dims in _all_dims():
        for axis in AXES:
            groups = dims.groups(axis)
            assert sorted(r for g in groups for r in g) == list(range(dims.world)), (dims, axis)
            assert len(groups) == dims.world // getattr(dims, axis)
            for g in groups:
                assert len(g) == getattr(dims, axis) and g == sorted(g)
                coords = [dims.coords(r) for r in g]
                assert [getattr(c, axis) for c in coords] == list(range(len(g)))
                for other in AXES:  # members differ along `axis` only
                    if other != axis:
                        assert len({getattr(c, other) for c in coords}) == 1, (dims, axis, g)
                assert all(dims.group(axis, r) == g for r in g)


def test_pp_peer_keeps_the_replica_and_the_shard():
    for dims in _all_dims():
        for r in range(dims.world):
            me = dims.coords(r)
            for p in range(dims.pp):
                assert dims.coords(dims.pp_peer(r, p)) == replace(me, pp=p)


def test_check_world_shows_the_arithmetic():
    ParallelDims(pp=2, dp=2, tp=2).check_world(8)
    with pytest.raises(PipesimError, match=r"^dp\(2\) \* pp\(2\) \* tp\(2\) != WORLD_SIZE\(6\)$"):
        ParallelDims(pp=2, dp=2, tp=2).check_world(6)
    with pytest.raises(PipesimError, match=r"^dp\(1\) \* pp\(2\) \* cp\(2\) \* tp\(1\) != WORLD_SIZE\(2\)$"):
        ParallelDims(pp=2, cp=2).check_world(2)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: ParallelDims(dp=0), "dp must be a positive integer, got 0"),
    (lambda: ParallelDims(tp=True), "tp must be a positive integer, got True"),
    (lambda: ParallelDims(pp=2).rank(pp=2), "pp coordinate 2 is outside 0..1"),
    (lambda: ParallelDims(pp=2, dp=2).coords(4), "rank 4 is outside 0..3"),
    (lambda: ParallelDims().group("xp", 0),
     "unknown axis 'xp'; choose one of pp, dp, cp, tp, dp_cp, tp_dp_cp, edp, ep, etp"),
    (lambda: ParallelDims(ep=0), "ep must be a positive integer, got 0"),
    (lambda: ParallelDims(etp=0), "etp must be a positive integer, got 0"),
    (lambda: ParallelDims(etp=True), "etp must be a positive integer, got True"),
    (lambda: ParallelDims(dp=4, tp=2, ep=3),
     "dp(4) * tp(2) is not divisible by ep(3) * etp(2): a stage's ranks are etp x ep x edp to its experts"),
    (lambda: ParallelDims(dp=2, cp=2, tp=2, ep=4, etp=4),
     "dp(2) * cp(2) * tp(2) is not divisible by ep(4) * etp(4): a stage's ranks are etp x ep x edp to its experts"),
    (lambda: ParallelDims(dp=4, ep=4).expert_rank(ep=4), "ep coordinate 4 is outside 0..3"),
    (lambda: ParallelDims(dp=4, ep=2).expert_rank(edp=2), "edp coordinate 2 is outside 0..1"),
    (lambda: ParallelDims(dp=4, ep=2).expert_coords(4), "rank 4 is outside 0..3"),
    (lambda: ParallelDims.node_of(3, 0), "devices per node must be >= 1, got 0"),
])
def test_bad_input_is_one_line(call, message):
    with pytest.raises(PipesimError) as info:
        call()
    assert str(info.value) == message


# -- the experts' layout (Megatron-core's expert RankGenerator) ------------------------------------------------------

# world 16 = pp 2 x (dp 4 x tp 2); each case's groups written out by hand from Megatron-core's rules
# (megatron/core/parallel_state.py, initialize_model_parallel: the expert RankGenerator's order is tp-ep-dp-pp with
# tp = etp, dp = edp = world / (etp * ep * pp), so rank = ((pp * edp + e) * ep + x) * etp + t)
MEGATRON_EXPERT_GROUPS = [
    (2, 1, {  # edp 4: experts split over consecutive rank pairs, which are the dense tp pairs
        "ep": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]],
        "etp": [[r] for r in range(16)],
        "edp": [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]}),
    (4, 1, {  # edp 2: an ep group spans two dense tp groups
        "ep": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]],
        "etp": [[r] for r in range(16)],
        "edp": [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]]}),
    (2, 2, {  # edp 2: etp pairs are the dense tp pairs; ep strides over them
        "ep": [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]],
        "etp": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]],
        "edp": [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]]}),
    (4, 2, {  # edp 1: the ep groups are the dense dp groups; nothing is replicated
        "ep": [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]],
        "etp": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]],
        "edp": [[r] for r in range(16)]}),
    (1, 1, {  # ep 1, etp 1: every expert whole on every rank, replicated over the stage's 8 ranks
        "ep": [[r] for r in range(16)],
        "etp": [[r] for r in range(16)],
        "edp": [list(range(8)), list(range(8, 16))]}),
]


@pytest.mark.parametrize(("ep", "etp", "want"), MEGATRON_EXPERT_GROUPS)
def test_expert_groups_are_megatron_cores(ep, etp, want):
    dims = ParallelDims(pp=2, dp=4, tp=2, ep=ep, etp=etp)
    assert (dims.world, dims.ep, dims.expert_tp, dims.edp) == (16, ep, etp, 8 // (ep * etp))
    for axis, groups in want.items():
        assert dims.groups(axis) == groups, axis
    assert dims.groups("pp") == [[r, r + 8] for r in range(8)]  # Megatron asserts the expert pp groups are these
    assert dims.groups("tp") == [[r, r + 1] for r in range(0, 16, 2)]  # the dense layout is untouched
    assert dims.groups("dp") == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]


def test_etp_defaults_to_tp_as_megatron_core():
    dims = ParallelDims(pp=2, dp=4, tp=2, ep=2)
    assert dims.etp is None and dims.expert_tp == 2 and dims.edp == 2
    assert dims.groups("ep") == MEGATRON_EXPERT_GROUPS[2][2]["ep"]  # as etp 2
    assert ParallelDims(dp=4, tp=2).groups("etp") == ParallelDims(dp=4, tp=2).groups("tp")


@pytest.mark.parametrize(("dims", "want"), [
    # etp wider than tp: an expert's shards span two dense tp groups (two dp replicas)
    (ParallelDims(dp=4, tp=2, etp=4), {"etp": [[0, 1, 2, 3], [4, 5, 6, 7]], "ep": [[r] for r in range(8)],
                                        "edp": [[0, 4], [1, 5], [2, 6], [3, 7]]}),
    # cp ranks are expert-data-parallel ones to the experts (Megatron-core's expert generator has cp 1)
    (ParallelDims(dp=2, cp=2, ep=2), {"ep": [[0, 1], [2, 3]], "etp": [[0], [1], [2], [3]], "edp": [[0, 2], [1, 3]]}),
    (ParallelDims(pp=3, dp=2, cp=2, tp=2, ep=4, etp=1),
     {"ep": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19], [20, 21, 22, 23]],
      "edp": [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15], [16, 20], [17, 21], [18, 22],
              [19, 23]]}),
])
def test_expert_groups_of_other_layouts(dims, want):
    for axis, groups in want.items():
        assert dims.groups(axis) == groups, axis


def test_docstring_worked_example():
    """tp 2, dp 4, ep 4, etp 1 on the 8 ranks of a stage (pipesim/parallel_dims.py's docstring)."""
    dims = ParallelDims(dp=4, tp=2, ep=4, etp=1)
    assert dims.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]] and dims.groups("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert dims.groups("ep") == [[0, 1, 2, 3], [4, 5, 6, 7]] and dims.edp == 2
    assert dims.groups("edp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dims.groups("etp") == [[r] for r in range(8)]
    assert dims.group("ep", 6) == [4, 5, 6, 7] and dims.expert_coords(6) == ExpertCoords(pp=0, edp=1, ep=2, etp=0)
    wide = ParallelDims(dp=4, tp=2, ep=4, etp=2)
    assert wide.groups("etp") == [[0, 1], [2, 3], [4, 5], [6, 7]] and wide.groups("ep") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert wide.groups("edp") == [[r] for r in range(8)]


def _expert_dims():
    for pp, dp, cp, tp, ep, etp in itertools.product((1, 2), (1, 2, 4), (1, 2), (1, 2), (1, 2, 4), (None, 1, 2, 4)):
        if (dp * cp * tp) % (ep * (tp if etp is None else etp)) == 0:
            yield ParallelDims(pp=pp, dp=dp, cp=cp, tp=tp, ep=ep, etp=etp)


def test_expert_groups_partition_the_world_and_keep_the_dense_layout():
    count = 0
    for dims in _expert_dims():
        count += 1
        dense = ParallelDims(pp=dims.pp, dp=dims.dp, cp=dims.cp, tp=dims.tp)
        assert dims.expert_tp * dims.ep * dims.edp == dims.tp * dims.cp * dims.dp
        for axis in AXES:  # ep/etp change nothing of the dense layout
            assert dims.groups(axis) == dense.groups(axis), (dims, axis)
        for axis in EXPERT_AXES:
            size = {"pp": dims.pp, "edp": dims.edp, "ep": dims.ep, "etp": dims.expert_tp}[axis]
            groups = dims.groups(axis)
            assert sorted(r for g in groups for r in g) == list(range(dims.world)), (dims, axis)  # each rank once
            assert all(len(g) == size and g == sorted(g) for g in groups) and len(groups) == dims.world // size
            for g in groups:
                coords = [dims.expert_coords(r) for r in g]
                assert [getattr(c, axis) for c in coords] == list(range(size)), (dims, axis, g)
                for other in EXPERT_AXES:  # members differ along `axis` only
                    if other != axis:
                        assert len({getattr(c, other) for c in coords}) == 1, (dims, axis, g)
                assert all(dims.group(axis, r) == g for r in g)
        for r in range(dims.world):
            c = dims.expert_coords(r)
            assert dims.expert_rank(pp=c.pp, edp=c.edp, ep=c.ep, etp=c.etp) == r
            assert c.pp == dims.coords(r).pp
    assert count > 100


def test_node_of_is_torchruns_node_major_numbering():
    assert [ParallelDims.node_of(r, 4) for r in (0, 3, 4, 13)] == [(0, 0), (0, 3), (1, 0), (3, 1)]


def test_executor_mesh_reads_its_place_off_parallel_dims():
    """Mesh(dims, rank) without groups: the executor's coordinates, group members and pipeline peers."""
    mesh = Mesh(ParallelDims(pp=2, dp=2, tp=2), 5)
    assert mesh.coords == Coords(pp=1, dp=0, cp=0, tp=1)
    assert (mesh.dp, mesh.pp, mesh.tp, mesh.world) == (2, 2, 2, 8)
    assert mesh.members("dp") == [5, 7] and mesh.members("tp") == [4, 5]
    assert [mesh.pp_peer(p) for p in range(2)] == [1, 5]
    assert mesh.dp_group is None and mesh.tp_group is None


# -- the tie: simulator placement == executor placement ---------------------------------------------------

# (dp, pp, tp)
GRIDS = [(1, 2, 1), (2, 2, 1), (1, 2, 2), (2, 4, 1), (2, 2, 2), (4, 2, 1), (1, 4, 2), (2, 3, 2), (3, 2, 1)]
NODE_SIZES = (1, 2, 4, 8)  # devices (torchrun's nproc_per_node) per node
NBYTES = 2**20  # bytes of every boundary activation and TP collective


def _hardware(world: int, per_node: int):
    """2x-dgx-h100's devices and links (nvswitch inside, infiniband across) in nodes of `per_node`."""
    return replace(load_hardware("2x-dgx-h100"), devices_per_node=per_node, num_nodes=-(-world // per_node))


def _costs(dp: int, pp: int, tp: int) -> ParallelCosts:
    tp_colls = {(s, kind): (TpCollective("all_reduce", NBYTES),) * n for s in range(pp)
                for kind, n in (("F", 1), ("B", 2))}
    return ParallelCosts(CostTable.uniform(pp, 1e-3, 1e-3, 1e-3, boundary_bytes=NBYTES),
                         Job(ParallelDims(dp=dp, tp=tp)), tp_collectives=tp_colls,
                         dp_grad_bytes=tuple(2**24 + s for s in range(pp)),
                         layers_per_stage=(1,) * pp)


@pytest.mark.parametrize(("dp", "pp", "tp"), GRIDS)
def test_simulator_places_each_coordinate_where_the_executor_runs_it(dp, pp, tp):
    dims = ParallelDims(pp=pp, dp=dp, tp=tp)
    executor = {(m.coords.pp, m.coords.dp, m.coords.tp): m for m in (Mesh(dims, r) for r in range(dims.world))}
    sched = schedules.build("1f1b", pp, 2 * pp)
    costs = _costs(dp, pp, tp)
    for per_node in NODE_SIZES:
        hw = _hardware(dims.world, per_node)
        result = simulate(sched, costs, hw)
        where = f"dp {dp} pp {pp} tp {tp}, {per_node} per node"
        # the simulator runs replica 0, shard 0 of each pipeline rank: on the executor's rank with those coords
        pipeline = [executor[(p, 0, 0)] for p in range(pp)]
        assert result.devices == [m.rank for m in pipeline], where
        assert [hw.node_of(d) for d in result.devices] == [m.rank // per_node for m in pipeline], where
        # each P2P: between the executor's sender and the peer it sends to, over the link between their nodes
        assert len(result.transfers) == 2 * (pp - 1) * 2 * pp, where
        for t in result.transfers:
            src = pipeline[t.src]
            dst = src.pp_peer(t.dst)
            assert dst == pipeline[t.dst].rank, where
            assert t.link == hw.link_between(src.rank, dst).name, (where, t.send)
        # each TP collective inside F/B: over the executor's TP group of that rank
        for p, prog in enumerate(result.schedule.programs):
            for i, a in enumerate(prog):
                colls = costs.tp_collectives.get((a.stage, a.kind.value), ()) if tp > 1 else ()
                want = sum(collective_seconds(hw, c.kind, pipeline[p].members("tp"), c.nbytes) for c in colls)
                assert result.tp_time[p][i] == want, (where, a)
        # each DP all-reduce: over the executor's DP group of that rank
        assert len(result.collectives) == (pp if dp > 1 else 0), where
        for c in result.collectives:
            want = collective_seconds(hw, "all_reduce", pipeline[c.rank].members("dp"), c.nbytes)
            assert c.end - c.start == pytest.approx(want, rel=1e-12), where
            assert c.nbytes == costs.dp_grad_bytes[c.stage]


@pytest.mark.parametrize(("dp", "pp", "tp"), GRIDS)
def test_the_order_keeps_tp_then_dp_inside_a_node(dp, pp, tp):
    """Why tp innermost, pp outermost: when a node holds whole TP groups (whole dp x tp slices), no TP
    (DP) collective leaves it; only pipeline P2P may cross nodes."""
    dims = ParallelDims(pp=pp, dp=dp, tp=tp)
    meshes = [Mesh(dims, r) for r in range(dims.world)]
    for per_node in NODE_SIZES:
        def nodes(ranks, n=per_node):
            return {r // n for r in ranks}
        for m in meshes:
            if per_node % tp == 0:
                assert len(nodes(m.members("tp"))) == 1, (dims, per_node, m.rank)
            if per_node % (dp * tp) == 0:
                assert len(nodes(m.members("dp"))) == 1, (dims, per_node, m.rank)


def test_issue_example_pipeline_crosses_nodes_and_dp_stays_inside():
    """`pipesim simulate 1f1b -p 8 -m 16 --dp 2 --model gpt --hardware 2x-dgx-h100`: 32 transfers over
    InfiniBand (boundary 3 -> 4, 16 microbatches each way), which is what the executor's ranks do too."""
    hw = load_hardware("2x-dgx-h100")
    dims = ParallelDims(pp=8, dp=2)
    costs = model_costs(ModelConfig(kind="gpt"), 8, 16, hw, Job(ParallelDims(dp=2)))
    result = simulate(schedules.build("1f1b", 8, 16), costs, hw)
    assert result.devices == [0, 2, 4, 6, 8, 10, 12, 14]
    crossing = [t for t in result.transfers if t.link == "infiniband"]
    assert len(crossing) == 32 and {(t.src, t.dst) for t in crossing} == {(3, 4), (4, 3)}
    assert {t.link for t in result.transfers} == {"infiniband", "nvswitch"}
    meshes = [Mesh(dims, r) for r in range(16)]  # torchrun --nnodes 2 --nproc-per-node 8
    executor_crossing = {(m.coords.pp, m.coords.pp + 1) for m in meshes if m.coords.pp < 7
                         and hw.link_between(m.rank, m.pp_peer(m.coords.pp + 1)).name == "infiniband"}
    assert executor_crossing == {(3, 4)}
    assert all(len({r // 8 for r in m.members("dp")}) == 1 for m in meshes)  # DP all-reduce on NVSwitch
    dp_time = collective_seconds(hw, "all_reduce", [0, 1], result.collectives[0].nbytes)
    assert result.collectives[0].end - result.collectives[0].start == pytest.approx(dp_time, rel=1e-12)


def test_executor_expert_groups_and_experts_come_from_parallel_dims():
    """pp 2 x dp 4 with ep 2 (etp 1, edp 2): rank 5 is stage 1's (edp 0, ep 1); it exchanges tokens with rank 4,
    averages expert gradients with rank 7, and its MoE layers keep experts 2 and 3 of 4 (executor.experts)."""
    dims = ParallelDims(pp=2, dp=4, ep=2)
    mesh = Mesh(dims, 5)
    assert mesh.expert_coords == dims.expert_coords(5) == ExpertCoords(pp=1, edp=0, ep=1, etp=0)
    assert mesh.members("ep") == [4, 5] and mesh.members("edp") == [5, 7]
    layer = MoeMLP(8, MoeConfig(experts=4, top_k=2, expert_ffn=8))
    shard_experts(layer, mesh.expert_coords.ep, dims.ep, group=object())
    assert list(layer.experts.keys()) == ["2", "3"]
