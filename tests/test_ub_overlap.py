"""Transformer Engine's userbuffers (pipesim/comm/ub_overlap.py, --tp-comm-overlap): TE's default methods, the YAML
settings, each method's pair time by hand on a 4-SM toy device, and the simulator summing exactly those seconds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import schedules
from pipesim.cli import build_parser, main
from pipesim.comm.collective_algos import collective_seconds, collective_time
from pipesim.comm.overlap_interference import HidingGemm, exposed_collective
from pipesim.comm.ub_overlap import DEFAULT_METHOD, UB_GEMMS, UbConfig, UbMethod, exposed_ub, ub_gemm
from pipesim.commands.setup_args import setup_from_args
from pipesim.device.gemm import gemm_time
from pipesim.errors import PipesimError
from pipesim.model.kernel_types import Gemm
from tests.test_overlap_interference import TILE_FLOPS, toy

T = TILE_FLOPS / 1e12  # seconds of one 128 x 128 x 1024 tile on one toy SM
FC2 = Gemm("FC2", 512, 512, 1024)  # 16 tiles: 4 waves on the toy's 4 SMs
S = 4_000_000  # bytes of the full tensor a collective moves
GATHER = {"kind": "all_gather", "nbytes": S}  # a gather that stages nothing (its producer writes into the buffer)


def _gemm() -> HidingGemm:
    seconds = gemm_time(FC2.m, FC2.n, FC2.k, "bfloat16", toy()).seconds
    assert seconds == pytest.approx(4 * T)
    return HidingGemm("FC2", seconds, FC2, "bfloat16", toy())


def test_defaults_are_transformer_engines():
    """transformer_engine/pytorch/module/base.py @ v2.1 get_default_config: ring_exchange 1 SM, no margin, tp
    splits; pipeline and bulk 16 SMs with the margin, 4 splits."""
    cfg = UbConfig()
    assert {n: cfg.method(n).method for n in DEFAULT_METHOD} == DEFAULT_METHOD
    assert cfg.method("qkv_fprop") == UbMethod("ring_exchange", 1, False, 0)
    assert cfg.method("fc2_fprop") == UbMethod("pipeline", 16, True, 4)
    assert cfg.method("qkv_wgrad") == UbMethod("bulk", 16, True, 4)
    assert cfg.method("qkv_fprop").chunks(8) == 8 and cfg.method("qkv_wgrad").chunks(8) == 1
    assert cfg.method("qkv_fprop").held_sms() == 0  # over the copy engines


def test_te_1_14s_defaults_differ_from_2_1s_only_in_the_sm_margin():
    """bench/tp_overlap/te_v1.14_defaults.yaml (TE @ 3b2a7b00f get_default_config, what the DGX Cloud Nemotron-4
    rows ran): every name as the built-in v2.1 default but without set_sm_margin, which TE 2.0 turned on for the
    pipelined and bulk methods."""
    old, new = UbConfig.from_yaml("bench/tp_overlap/te_v1.14_defaults.yaml"), UbConfig()
    assert {n: old.method(n) for n in DEFAULT_METHOD} == \
        {n: replace(new.method(n), set_sm_margin=False) for n in DEFAULT_METHOD}
    assert [n for n in DEFAULT_METHOD if new.method(n).set_sm_margin] == \
        ["proj_fprop", "fc2_fprop", "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"]


def test_a_config_file_overrides_names_key_by_key(tmp_path):
    path = tmp_path / "ub.yaml"
    path.write_text("fc2_fprop: {method: ring_exchange, num_sm: 1, set_sm_margin: 1}\n"
                    "qkv_wgrad: {method: bulk, num_sm: 8, cga_size: 2, set_sm_margin: 0}\n"
                    "fc2_dgrad: {method: ring_exchange, aggregate: 1}\n")
    cfg = UbConfig.from_yaml(str(path))
    assert cfg.source == str(path)
    assert cfg.method("fc2_fprop") == UbMethod("ring_exchange", 1, True, 0)
    assert cfg.method("fc2_fprop").held_sms() == 1  # the margin keeps its one SM from the GEMM
    assert cfg.method("qkv_wgrad") == UbMethod("bulk", 8, False, 4)
    assert cfg.method("fc2_dgrad").chunks(8) == 4  # two chunks per GEMM
    assert cfg.method("proj_fprop") == UbConfig().method("proj_fprop")  # not named: TE's default


@pytest.mark.parametrize("text,message", [
    ("fc3_fprop: {method: bulk}", "unknown userbuffers name 'fc3_fprop'"),
    ("fc2_fprop: {method: ring}", "fc2_fprop: unknown method 'ring'"),
    ("fc2_fprop: {num_sm: 0}", "fc2_fprop: num_sm must be a positive integer, got 0"),
    ("fc2_fprop: {atomic_gemm: 1}", "fc2_fprop: atomic_gemm is not modelled"),
    ("fc2_fprop: {warp_size: 1}", "fc2_fprop: unknown setting 'warp_size'"),
    ("- fc2_fprop", "expected a mapping of userbuffers names"),
])
def test_a_config_it_cannot_read_is_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "ub.yaml"
    path.write_text(text)
    with pytest.raises(PipesimError, match=message):
        UbConfig.from_yaml(str(path))


def test_pipeline_by_hand():
    """4 chunks of 128 rows on the 3 SMs one comm SM leaves: 4 tiles, 2 waves each (g = 2T); C = 4T: c = T <= g, so
    pair = g + 3 g + c = 9T and the collective adds 5T to the GEMM's 4T."""
    m = UbMethod("pipeline", 1, True, 4)
    assert exposed_ub(4 * T, _gemm(), m, tp=4, kind="reduce_scatter", nbytes=S) == pytest.approx(5 * T)


def test_ring_exchange_by_hand():
    """tp 4 chunks of 128 rows on all 4 SMs (copy engines): 1 wave each, g = T. C = 6T: hops of 2T > g, pair =
    T + 3 x 2T = 7T, 3T over the GEMM; C = 1.5T: hops of T / 2 hide, nothing added. Aggregated: 2 GEMMs of 256 rows
    (2 waves, g = 2T) after the partner's chunk (c = C / 3 = 2T), then one 2-chunk hop: pair = 2T + 2T + 4T."""
    m = UbMethod("ring_exchange", 1, False, 0)
    assert exposed_ub(6 * T, _gemm(), m, tp=4, **GATHER) == pytest.approx(3 * T)
    assert exposed_ub(1.5 * T, _gemm(), m, tp=4, **GATHER) == pytest.approx(0.0, abs=1e-15)
    assert exposed_ub(6 * T, _gemm(), replace(m, aggregate=True), tp=4, **GATHER) == pytest.approx(4 * T)


def test_an_aggregated_ring_waits_for_its_partners_chunk_first():
    """TE's aggregate at tp 8: 4 GEMMs of 128 rows (1 wave, g = T) after one chunk's hop from the pair partner
    (split_overlap_ag's initial 1X exchange). C = 0.7T: hops of c = 0.1T, 2c hides behind each GEMM, but the first
    one is exposed: pair = 0.1T + 4T. C = 7T: c = T, pair = T + T + 3 x 2T = 8T, as the unaggregated ring's g + C."""
    m = UbMethod("ring_exchange", 1, False, 0, aggregate=True)
    assert m.chunks(8) == 4
    assert exposed_ub(0.7 * T, _gemm(), m, tp=8, **GATHER) == pytest.approx(0.1 * T)
    assert exposed_ub(7 * T, _gemm(), m, tp=8, **GATHER) == pytest.approx(4 * T)
    # a reduce-scatter's ring has no aggregated form (TE v2.1 split_overlap_rs): the key changes nothing there
    assert exposed_ub(0.7 * T, _gemm(), m, tp=8, kind="reduce_scatter", nbytes=0) == \
        exposed_ub(0.7 * T, _gemm(), replace(m, aggregate=False), tp=8, kind="reduce_scatter", nbytes=0)


def test_bulk_by_hand():
    """The whole GEMM beside the collective on 3 SMs: 6 waves, G' = 6T. C = 3T: without the margin the GEMM gets
    the SM back when the collective ends, C (1 - G / G') = T; with it it stays on 3 SMs, max(G', C) - G = 2T."""
    m = UbMethod("bulk", 1, False, 4)
    assert exposed_ub(3 * T, _gemm(), m, tp=4, kind="reduce_scatter", nbytes=S) == pytest.approx(T)
    assert exposed_ub(3 * T, _gemm(), replace(m, set_sm_margin=True), tp=4, kind="reduce_scatter",
                      nbytes=S) == pytest.approx(2 * T)


def test_the_staging_kernels_by_hand():
    """S = 4 MB on the toy's 1 TB/s HBM (no launch cost): a ring exchange's reduce-scatter sums its 4 partials after
    the ring, S (1 + 1/4) = 5 MB, 5 us on top of the pair's 3T; an all-gather that copies its local chunk in stages
    2 S / 4 = 2 MB, 2 us, and one whose LayerNorm writes into the buffer (TE's qkv_fprop) nothing; TE copies the
    output gradient in before proj_dgrad's ring and the saved input before qkv_dgrad's bulk re-gather."""
    ring = UbMethod("ring_exchange", 1, False, 0)
    assert exposed_ub(6 * T, _gemm(), ring, tp=4, kind="reduce_scatter", nbytes=S) == pytest.approx(3 * T + 5e-6)
    copying = replace(ring, copies_in=True)
    assert exposed_ub(6 * T, _gemm(), copying, tp=4, kind="all_gather", nbytes=S) == pytest.approx(3 * T + 2e-6)
    assert exposed_ub(6 * T, _gemm(), copying, tp=4, kind="reduce_scatter", nbytes=S) == pytest.approx(3 * T + 5e-6)
    assert not UbConfig().method("qkv_fprop").copies_in and not UbConfig().method("fc1_fprop").copies_in
    assert [n for n in DEFAULT_METHOD if UbConfig().method(n).copies_in] == ["proj_dgrad", "fc2_dgrad", "qkv_dgrad",
                                                                             "fc1_dgrad"]
    pipelined = UbMethod("pipeline", 1, True, 4)  # its reduce-scatter kernel reduces as it scatters: no staging
    assert exposed_ub(4 * T, _gemm(), pipelined, tp=4, kind="reduce_scatter", nbytes=S) == \
        exposed_ub(4 * T, _gemm(), pipelined, tp=4, kind="reduce_scatter", nbytes=0)


def test_the_dense_linears_collectives_ride_on_their_own_gemms():
    assert ub_gemm("attention input (before QKV)") == ("qkv_fprop", "QKV")
    assert ub_gemm("recompute: MLP output") == ("fc2_fprop", "FC2")  # a re-run forward collective: the same GEMM
    assert ub_gemm("attention input gradient") == ("qkv_wgrad", "QKV wgrad")
    assert ub_gemm("KV latent (before KV up)") is None  # latent attention keeps NCCL's model
    assert {name for name, _ in UB_GEMMS.values()} == set(DEFAULT_METHOD)


BASE = ["simulate", "1f1b", "-p", "1", "-m", "2", "--model", "gpt", "--hidden", "1024", "--layers", "2", "--heads",
        "8", "--seq", "1024", "--batch", "2", "--tp", "4", "--hardware", "dgx-h100"]


def _simulate(capsys, *extra: str) -> dict:
    assert main([*BASE, *extra, "--json", "-"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_simulator_adds_exactly_each_collectives_userbuffers_seconds(capsys):

    flags = ["--sequence-parallel", "--tp-comm-overlap"]
    data = _simulate(capsys, *flags)
    args = build_parser().parse_args([*BASE, *flags])
    setup = setup_from_args(args)
    costs = setup.costs(schedules.build("1f1b", 1, 2))
    hw, group = setup.hardware, list(range(4))
    expected, riding = 0.0, {}
    for key in ((0, "F"), (0, "B")):
        for c in costs.tp_collectives[key]:
            if c.ub is not None:  # a dense linear's: its userbuffers seconds
                riding[key] = riding.get(key, 0) + 1
                expected += exposed_ub(collective_time(c.kind, c.nbytes, group, hw).seconds, c.beside, c.ub, 4,
                                       kind=c.kind, nbytes=c.nbytes)
            elif c.beside is not None:  # the embedding's and the head's keep NCCL's model
                expected += exposed_collective(collective_time(c.kind, c.nbytes, group, hw), c.nbytes, 4, c.beside)
            else:
                expected += collective_seconds(hw, c.kind, group, c.nbytes)
    assert riding == {(0, "F"): 2 * 4, (0, "B"): 2 * 6}  # per layer: 2 gathers + 2 scatters; 3 + 3 in backward
    assert data["ranks"][0]["tp_collective"] == pytest.approx(2 * expected, rel=1e-12)
    assert data["ranks"][0]["tp_collective"] != _simulate(capsys, "--sequence-parallel")["ranks"][0]["tp_collective"]


@pytest.mark.parametrize("extra,message", [
    (["--tp-comm-overlap"], "--tp-comm-overlap needs tensor parallelism with --sequence-parallel"),
    (["--sequence-parallel", "--tp-comm-overlap-cfg", "x.yaml"], "--tp-comm-overlap-cfg needs --tp-comm-overlap"),
    (["--sequence-parallel", "--tp-comm-overlap", "--no-async-tensor-model-parallel-allreduce"],
     "--tp-comm-overlap overlaps the backward collectives too"),
    (["--sequence-parallel", "--tp-comm-overlap", "--tp-comm-overlap-cfg", "/nonexistent/ub.yaml"],
     "--tp-comm-overlap-cfg /nonexistent/ub.yaml: No such file or directory"),
    (["--sequence-parallel", "--tp-comm-overlap", "--hardware", "local-cpu"],
     "--tp-comm-overlap times each GEMM kernel by kernel: local-cpu has no GPU device family"),
])
def test_refusals_are_one_line_and_exit_2(capsys, extra, message):
    assert main([*BASE, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_plan_keeps_userbuffers_only_where_tp_and_sp_carry_them(capsys):
    """The planner's tp 1 and no-sp candidates run without it (Megatron-core refuses it there); a tp > 1 winner
    exports it in the simulate command and Megatron-LM's arguments."""
    argv = ["plan", "--model", "gpt", "--hidden", "8192", "--layers", "8", "--heads", "64", "--seq", "4096",
            "--vocab", "32000", "--batch", "16", "--dtype", "bfloat16", "--hardware", "dgx-h100", "--gpus", "8",
            "--top", "3", "--recompute", "none", "--tp-comm-overlap"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    simulate = next(line for line in out.splitlines() if line.strip().startswith("pipesim simulate"))
    assert "--tp 4" in simulate and "--sequence-parallel" in simulate and simulate.endswith(" --tp-comm-overlap")
    megatron = out.split("Megatron-LM arguments:")[1].split("torchtitan job config:")[0].split()
    assert "--tp-comm-overlap" in megatron and "--tp-comm-overlap-cfg" not in megatron
