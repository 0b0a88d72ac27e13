"""Issue 33's goals in `pipesim bench published` (bench/published_goals.py): which sources form the reference goal,
the ranking pairs, the goal lines, and the modern reference rows with their rank keys."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from pipesim.comm.ub_overlap import UbConfig
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.pipeline_split import account_split
from tests.published_bench import DATA, LAYER_ROWS, _result, bp, pr

pg = bp.goals


def _ranked(row_id, published, predicted, *, cluster="m on hw", work=1.0, metric="seconds_per_iteration",
            source="S", command=None):
    r = _result(row_id, source, published, predicted, metric=metric)
    command = command or f"pipesim simulate 1f1b --batch {len(row_id)} # {row_id}"  # one command per row
    return pr.Result(replace(r.row, cluster=cluster, work=work, command=command), predicted, "f")


def test_source_goal_reads_goal_else_in_published_md_and_refuses_others():
    assert pg.source_goal("A", {}) == "reference"  # in_published_md is true when absent (issue 15's reading)
    assert pg.source_goal("A", {"in_published_md": True}) == "reference"
    assert pg.source_goal("A", {"in_published_md": False}) == "reported"
    assert pg.source_goal("A", {"in_published_md": False, "goal": "reference"}) == "reference"
    assert pg.source_goal("A", {"in_published_md": True, "goal": "reported"}) == "reported"
    with pytest.raises(ValueError, match="source A: goal must be one of reference, reported, got 'all'"):
        pg.source_goal("A", {"goal": "all"})
    assert pg.reference_sources({"A": {}, "B": {"in_published_md": False}, "C": {"goal": "reference"}}) == {"A", "C"}


def test_ranking_pairs_by_cluster_and_metric_with_times_per_gpu():
    rows = [_ranked("a", 10.0, 9.0, work=100.0),  # speed published 10, predicted 11.1
            _ranked("b", 10.0, 8.0, work=50.0),  # speed 5 and 6.25: slower than a in both -> agrees
            _ranked("c", 20.0, 30.0, work=300.0),  # speed 15 and 10: faster than a published, slower predicted
            _ranked("d", 5.0, 4.0, work=50.0, cluster="other"),  # another cluster: never paired
            _ranked("e", 100.0, 90.0, metric="tflops_per_gpu_nar21"),  # another metric: never paired
            _ranked("f", 20.0, 10.0, work=200.0),  # speed 10 as a's published: a tie with a, not ranked
            _ranked("g", 7.0, None, work=100.0)]  # failed: left out
    rk = pg.ranking(rows)
    assert [(p.a, p.b, p.agrees) for p in rk.pairs] == [("a", "b", True), ("a", "c", False), ("b", "c", True),
                                                        ("b", "f", True), ("c", "f", False)]  # f: 10 and 20
    assert (rk.agree, rk.ties, rk.fraction) == (3, 1, 0.6)
    assert pg.speed(rows[4].row, 90.0) == 90.0 and pg.speed(rows[0].row, 9.0) == pytest.approx(100 / 9)
    assert math.isnan(pg.ranking(rows[3:5]).fraction)


def test_a_pair_of_one_command_is_counted_apart_not_ranked():
    """One configuration published twice (two software versions): the simulator gives both one figure, so the pair
    is not ranked either way; the goal line says how many."""
    same = "pipesim simulate 1f1b --batch 8"
    rows = [_ranked("v1", 10.0, 9.0, command=same), _ranked("v2", 11.0, 9.0, command=same),
            _ranked("w", 16.0, 15.0, work=2.0)]  # w against each: ranked, faster (speed 0.125, predicted 0.133)
    rk = pg.ranking(rows)
    assert [(p.a, p.b) for p in rk.pairs] == [("v1", "w"), ("v2", "w")]
    assert (rk.same_command, rk.ties) == (1, 0)
    line = pg.goal_lines({"S": {}}, rows, pr.stats)[2]
    assert line.endswith("**met**; 1 pairs of one command (one configuration at two software versions) not ranked.")


def test_goal_lines_of_issue_33_exactly():
    sources = {"R": {"goal": "reference", "in_published_md": False}, "O": {"in_published_md": False}}
    results = [_ranked("r1", 10.0, 10.4, source="R", work=10.0),  # |error| 4 %, speed 10 / 10.4
               _ranked("r2", 20.0, 19.0, source="R", work=10.0),  # |error| 5 %, order r1 faster kept
               _ranked("o1", 10.0, 8.5, source="O", cluster="x")]  # |error| 15 %, speed ratio 10 / 8.5
    lines = pg.goal_lines(sources, results, pr.stats)
    assert lines[0] == ("Issue 33's reference goal, the reference rows of published.md and published_modern.md "
                        "together (R): 2 of 2 simulated, median |error| 4.5 %, max 5.0 % (goal: median <= 5 %, "
                        "max <= 10 %): **met**.")
    factor = (10 / 10.4 * 20 / 19 * 10 / 8.5) ** (1 / 3)
    assert lines[1] == ("Issue 33's goal on every published row this bench reports: 3 of 3 simulated, median |error| "
                        f"5.0 %, max 15.0 %, geometric mean of predicted / published speed {factor:.3f} (goal: median "
                        "<= 8 %, max <= 20 %, speed factor in [0.95, 1.05]): **not met**.")  # 1.052: optimistic
    assert lines[2] == ("Rankings (issue 33): 1 pairs of published rows of the same model on the same cluster and "
                        "metric (speed per GPU), predicted order as published in 1 (100 %; goal >= 90 %): **met**.")
    flipped = [*results[:1], _ranked("r2", 20.0, 9.0, source="R", work=10.0)]  # r2 now predicted faster than r1
    lines = pg.goal_lines(sources, flipped, pr.stats)
    assert "(goal: median <= 5 %, max <= 10 %): **not met**." in lines[0]  # |error| 55 %
    assert lines[2].endswith("in 0 (0 %; goal >= 90 %): **not met**. Reversed: `r1` / `r2`.")
    assert pg.goal_lines(sources, [], pr.stats) == ["No published row in this run: no issue-33 goal lines."]


def test_the_modern_reference_rows_and_their_rank_keys():
    assert pg.reference_sources(DATA["sources"]) == {"NAR21", "KOR22", "DGXC25"}
    rows = [r for r in DATA["rows"] if r.source == "DGXC25"]
    # shared/reference/published_modern.md's ten rows
    assert [(r.id.removeprefix("dgxc-"), r.published) for r in rows] == [
        ("llama3.1-8b-8gpus", 12.27), ("llama3.1-8b-128gpus", 12.33), ("llama3.1-70b-64gpus", 14.66),
        ("llama3.1-70b-2048gpus", 14.66), ("llama3.1-405b-512gpus", 19.78), ("llama3.1-405b-2048gpus", 19.87),
        ("gpt3-175b-128gpus", 8.309), ("gpt3-175b-2048gpus", 8.49), ("nemotron4-15b-16gpus", 2.66),
        ("nemotron4-340b-256gpus", 4.36)]
    layouts = [(a.tp, a.stages, a.cp, a.dp, a.virtual, a.batch, a.seq) for a in
               (bp.parse_command(r.command)[1] for r in rows)]
    assert layouts == [(1, 1, 2, 4, None, 128, 8192), (1, 1, 2, 64, None, 2048, 8192),
                       (4, 4, 2, 2, 5, 128, 8192), (4, 4, 2, 64, 5, 4096, 8192),
                       (8, 8, 2, 4, 8, 256, 8192), (8, 8, 2, 16, 8, 1024, 8192),
                       (4, 8, 1, 4, 6, 256, 2048), (4, 8, 1, 64, 6, 4096, 2048),
                       (2, 1, 1, 8, None, 64, 4096), (8, 8, 1, 4, 12, 64, 4096)]
    # the FP8 tables beside them: the same commands (70B's own FP8 layout) with NeMo's hybrid delayed recipe
    fp8 = [r for r in DATA["rows"] if r.source == "DGXC25FP8"]
    assert [r.published for r in fp8] == [9.33, 9.86, 12.37, 5.626, 1.98, 2.93]
    assert all(" --fp8-format hybrid --fp8-recipe delayed" in r.command for r in fp8)
    assert all(r.command.endswith(" --fp8-param-gather") for r in fp8)  # fp8_params True (bf16_with_fp8_mixed)
    # the launch scripts' TP communication overlap (userbuffers) wherever tp > 1: the recipes' configurations, and
    # Nemotron-4's, which passes none, TE 1.14's defaults (the TE its NeMo commit pins)
    ub = [(a.tp_comm_overlap_ub, a.tp_comm_overlap_cfg and Path(a.tp_comm_overlap_cfg).stem)
          for a in (bp.parse_command(r.command)[1] for r in rows + fp8)]
    assert ub == [(False, None)] * 2 + [(True, "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192")] * 2 \
        + [(True, "userbuffers_bf16_h100_h16384_tp8_cp2_mbs1_seqlen8192")] * 2 + [(True, "nemo_gpt3_175b_h100")] * 2 \
        + [(True, "te_v1.14_defaults")] * 2 + [(False, None), (True, "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192"),
                                               (True, "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192"),
                                               (True, "nemo_gpt3_175b_h100")] + [(True, "te_v1.14_defaults")] * 2
    # the same model on the same cluster, its GPU count included: weak-scaling rows are not a ranking pair
    assert [r.cluster for r in rows[::2]] == [
        "llama3-8b on 8 x dgx-h100", "llama3-70b on 64 x dgx-h100", "llama3-405b on 512 x dgx-h100",
        "gpt h12288L96a96V50688 on 128 x dgx-h100", "nemotron4-15b on 16 x dgx-h100"]
    assert len({r.cluster for r in rows}) == len(rows)
    assert [r.work for r in rows[:3]] == [128 * 8192 / 8, 2048 * 8192 / 128, 128 * 8192 / 64]


def test_the_405b_proxy_rows_their_layer_splits_and_rank_keys():
    """dgxc-benchmarking's Llama 3.1 405B proxies: the full model's commands with --layers N, Megatron's split of N + 2
    (embedding and loss counted as layers) over pp x vp chunks, DP overlap only where DP (CP not counted) is over 1."""
    assert not DATA["sources"]["DGXC25PROXY"]["in_published_md"]
    assert "DGXC25PROXY" not in pg.reference_sources(DATA["sources"])
    rows = [r for r in DATA["rows"] if r.source == "DGXC25PROXY"]
    assert [(r.id.removeprefix("dgxc-"), r.published) for r in rows] == [
        ("llama3.1-405b-proxy-32gpus", 5.4), ("llama3.1-405b-proxy-64gpus", 10.1),
        ("llama3.1-405b-proxy-128gpus", 19.62), ("fp8-llama3.1-405b-proxy-32gpus", 3.53),
        ("fp8-llama3.1-405b-proxy-64gpus", 6.32), ("fp8-llama3.1-405b-proxy-128gpus", 12.18)]
    args = [bp.parse_command(r.command)[1] for r in rows]
    assert [(a.layers, a.tp, a.stages, a.virtual, a.cp, a.dp, a.batch, a.nodes) for a in args[:3]] == [
        (8, 8, 1, None, 2, 2, 64, 4), (30, 8, 4, 8, 2, 1, 64, 8), (62, 8, 4, 8, 2, 2, 128, 16)]
    # the recipes' account_for_embedding/loss_in_pipeline_split, typed as Megatron-core's flags (since 2026-12-06)
    assert [(a.layer_split, a.account_embedding, a.account_loss) for a in args[:3]] == [
        (None, False, False), (None, True, True), (None, True, True)]
    assert [account_split(a.layers, a.stages * a.virtual, embedding=True, loss=True) for a in args[1:3]] == [
        [0] + [1] * 30 + [0], [1] + [2] * 30 + [1]]
    assert [a.framework for a in args[:3]] == ["nemo", "megatron-core", "nemo"]
    # the profile's switches as resolved: DP 2 overlapped in 128M-parameter buckets, DP 1 (64 GPUs) not overlapped
    assert [(a.overlap_grad_reduce, a.overlap_param_gather, a.zero, a.ddp_bucket_size) for a in args[:3]] == [
        (True, True, 1, 134217728), (False, False, 1, None), (True, True, 1, 134217728)]
    full = next(r for r in DATA["rows"] if r.id == "dgxc-llama3.1-405b-512gpus")
    for r, a in zip(rows, args):  # the full model's command with the proxy's layout, BF16 and FP8 as its sources'
        assert a.model_config == "llama3-405b" and bp.metrics.gpus(a) == a.tp * a.stages * a.cp * a.dp
        assert a.grad_fp32 is False and a.tp_comm_overlap_ub and a.sequence_parallel and a.attention == "flash"
        fp8 = r.id.startswith("dgxc-fp8-")
        assert (" --fp8-format hybrid --fp8-recipe delayed" in r.command) == fp8
        assert Path(a.tp_comm_overlap_cfg).name == (
            f"userbuffers_{'fp8' if fp8 else 'bf16'}_h100_h16384_tp8_cp2_mbs1_seqlen8192.yaml")
        assert r.command.endswith(" --fp8-param-gather") == fp8  # NeMo's fp8_params, stated with FP8
        assert r.command.removesuffix(" --fp8-param-gather").endswith(
            full.command[full.command.index(" --tp-comm-overlap "):].replace("bf16", "fp8" if fp8 else "bf16"))
    # another model than the full 405B: ranked only against its own BF16 / FP8 twin on the same GPUs
    assert [r.cluster for r in rows[:3]] == ["llama3-405b L8 on 32 x dgx-h100", "llama3-405b L30 on 64 x dgx-h100",
                                            "llama3-405b L62 on 128 x dgx-h100"]
    assert [r.cluster for r in rows[3:]] == [r.cluster for r in rows[:3]]
    assert full.cluster == "llama3-405b on 512 x dgx-h100"
    results = [pr.Result(r, r.published * 0.9, "f") for r in rows + [full]]
    assert [(p.a, p.b) for p in pg.ranking(results).pairs] == [(rows[i].id, rows[i + 3].id) for i in range(3)]


def test_the_megatron_bridge_h100_rows_and_their_userbuffers_configs():
    """Megatron-Bridge's DGX-H100 dense Llama rows: FP8 current scaling (tensorwise) on the H100 FP8-CS presets'
    layouts, each its table's global batch, Megatron-Bridge's own userbuffers configs; one configuration published at
    two versions is one command, and its pair is counted apart."""
    assert not DATA["sources"]["MB25"]["in_published_md"]
    rows = [r for r in DATA["rows"] if r.source == "MB25"]
    assert [(r.id.removeprefix("mb25-"), r.metric, r.published) for r in rows] == [
        ("25.11-llama3-70b-64gpus", "tokens_per_sec_per_gpu", 1602),
        ("25.11-llama3.1-405b-1024gpus", "tokens_per_sec_per_gpu", 292),
        ("26.02-llama3-70b-64gpus", "tokens_per_sec_per_gpu", 1621),
        ("26.02-llama3.1-405b-1024gpus", "tokens_per_sec_per_gpu", 311),
        ("26.04-llama3-70b-64gpus", "tokens_per_sec_per_gpu", 1633),
        ("26.06-llama3.1-405b-1024gpus", "tokens_per_sec_per_gpu", 326)]
    args = [bp.parse_command(r.command)[1] for r in rows]
    assert [(a.tp, a.stages, a.virtual, a.cp, a.dp, a.batch) for a in args] == [
        (4, 8, 5, 1, 2, 128), (8, 8, 8, 2, 8, 512), (4, 8, 5, 1, 2, 256), (8, 8, 8, 2, 8, 1536),
        (4, 8, 5, 1, 2, 256), (8, 8, 8, 2, 8, 1536)]
    for a in args:
        assert (a.fp8_format, a.fp8_recipe, a.zero, a.overlap_grad_reduce, a.overlap_param_gather) == (
            "hybrid", "tensorwise", 1, True, True)
        assert a.ddp_bucket_size == 128 * 1024 * 1024 and a.grad_fp32 is False and a.recompute == "none"
        assert Path(a.tp_comm_overlap_cfg).name.startswith("mbridge_userbuffers_fp8_h100_")
        assert a.layer_split is None and a.account_embedding == a.account_loss == (a.tp != 4)
        assert a.tp == 4 or account_split(126, a.stages * a.virtual, embedding=True, loss=True) == [1] + [2] * 62 + [1]
    # Megatron-Bridge's configs of the NeMo names: no aggregation, the reduce-scatters as ring exchanges
    tp_overlap = Path(bp.ROOT) / "bench" / "tp_overlap"
    for name in ("userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192",
                 "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192"):
        mb, nemo = (UbConfig.from_yaml(str(tp_overlap / f"{pre}{name}.yaml")) for pre in ("mbridge_", ""))
        assert [(n, m.method, m.num_sm, m.set_sm_margin, m.aggregate) for n, m in mb.methods
                if n in ("proj_fprop", "fc2_fprop", "qkv_fprop")] == [
            ("qkv_fprop", "ring_exchange", 1, False, False), ("proj_fprop", "ring_exchange", 1, True, False),
            ("fc2_fprop", "ring_exchange", 1, True, False)]
        assert nemo.method("proj_fprop").method == "pipeline"
        assert [mb.method(n) for n in ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")] == [
            nemo.method(n) for n in ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")]
    results = [pr.Result(r, float(r.published), "f") for r in rows]
    rk = pg.ranking(results)
    assert rk.same_command == 2 and [(p.a, p.b) for p in rk.pairs] == [
        (rows[0].id, rows[2].id), (rows[0].id, rows[4].id), (rows[1].id, rows[3].id), (rows[1].id, rows[5].id)]


def test_the_torchtitan_rows_state_their_pages_configurations():
    """torchtitan's H100 benchmark pages: FSDP over every rank (the profile's ZeRO 3, resharded without pipelining),
    FlashAttention-2 (SDPA's flash backend first on Hopper then), Tables 1 and 3 with the per-op checkpointing
    and torch.compile where stated (and with Float8 where stated), Table 2 and the 70B rows with full checkpointing,
    compile and Float8 as stated;
    all on the Grand Teton file (96 GB HBM2e at 2.4 TB/s, the H100 family's 700 W figures)."""
    assert not DATA["sources"]["TT24"]["in_published_md"]
    rows = [r for r in DATA["rows"] if r.source == "TT24"]
    assert [(r.id.split("-", 1)[1], r.published) for r in rows] == [
        ("llama3.1-8b-fsdp-8gpus", 5762), ("llama3.1-8b-fsdp-compile-8gpus", 6667),
        ("llama3.1-8b-fsdp-128gpus", 5605), ("llama3.1-8b-fsdp-compile-128gpus", 6514),
        ("llama3.1-8b-fsdp-compile-float8-8gpus", 8532), ("llama3.1-8b-fsdp-compile-float8-128gpus", 8380),
        ("llama3.1-8b-cp1-32k", 3890), ("llama3.1-8b-cp2-64k", 2540), ("llama3.1-8b-cp4-128k", 1071),
        ("llama3.1-70b-tp8-256gpus", 597.3), ("llama3.1-70b-tp8-float8-256gpus", 809.8),
        ("llama3.1-70b-tp8-async-256gpus", 652.4), ("llama3.1-70b-tp8-float8-async-256gpus", 942.4)]
    args = [bp.parse_command(r.command)[1] for r in rows]
    for r, a in zip(rows, args, strict=True):
        assert (a.framework, a.attention, a.zero, a.stages, r.metric) == (
            "torchtitan", "flash2", 3, 1, "tokens_per_sec_per_gpu")
        assert Path(a.hardware) == Path(bp.ROOT) / "bench" / "hardware" / "grand-teton-h100.toml"
        assert a.recompute == ("op" if "fsdp" in r.id else "full")
        assert (a.kernel_fusion is True) == ("compile" in r.id or "fsdp" not in r.id)
        assert a.eager_rmsnorm == (a.kernel_fusion is not True)  # 9dec370's own RMSNorm, unless compiled
        assert (a.fp8_format is not None) == ("cp" in r.id or "float8" in r.id)
        assert a.batch == a.microbatch_size * a.dp  # the local batch, one microbatch per step
    assert [a.fp8_recipe for a in args if a.fp8_format is not None] == ["tensorwise"] * 7  # torchao's dynamic
    assert [(a.seq, a.dp, a.cp, a.tp) for a in args[6:]] == [
        (32768, 8, 1, 1), (65536, 4, 2, 1), (131072, 2, 4, 1)] + [(8192, 32, 1, 8)] * 4
    assert [a.async_tp for a in args[9:]] == [False, False, True, True]  # the async-TP page's two columns
    hw = load_hardware(str(Path(bp.ROOT) / "bench" / "hardware" / "grand-teton-h100.toml"))
    assert (hw.device.family, hw.device.hbm_bandwidth, hw.device.memory) == ("H100", 2.4e12, 96_000_000_000)


def test_an_unknown_goal_in_a_rows_file_is_refused(tmp_path):
    rows = tmp_path / "rows.toml"
    rows.write_text(f'[sources.KOR22]\ncitation = "K"\ngoal = "sometimes"\n\n{LAYER_ROWS}')
    with pytest.raises(PipesimError, match="source KOR22: goal must be one of reference, reported"):
        bp.main(["--rows", str(rows), "--out", str(tmp_path / "p.md")])
