"""--cp-comm-type (Megatron-core's): all_gather (Llama 3's context parallelism: K/V gathered whole before the attention,
dK/dV reduce-scattered after it) and a2a (DeepSpeed-Ulysses: all-to-alls to head shards and back), both blocking;
their bytes, the compute they lengthen, the buffers they hold and the attention kernel a2a runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import schedules
from pipesim.cli import main
from pipesim.comm.collective_costs import group_collective_time
from pipesim.cost.step_costs import RingExchange, ring_exchanges
from pipesim.device.kernels import attention_flops
from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.cp_exchanges import cp_kv_block_bytes, cp_layer_exchanges, cp_q_block_bytes
from pipesim.model.kernel_types import FlashAttention
from pipesim.model.layer_collectives import Collective
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.memory import comm_buffer_bytes
from pipesim.model.options import LayerOptions
from pipesim.sim.simulator import simulate
from tests.test_step_costs import GB, costs, toy

MODEL = ModelConfig(kind="gpt", hidden=256, heads=8, seq=512, layers=4, batch=8)
GATHER = LayerOptions(cp=4, attention="flash", cp_comm="all_gather")


def test_the_gathers_of_one_layer_by_hand():
    kv = 2 * (512 // 4) * 2 * 256 * 4  # one rank's K and V: 2 x (s / cp) x b x h_kv x 4 bytes (float32), b = 2
    assert cp_kv_block_bytes(MODEL, 2, GATHER) == kv
    assert cp_layer_exchanges(MODEL, 2, GATHER) == [
        Collective("all_gather", 4 * kv, "F", "cp", "K/V, gathered"),
        Collective("all_gather", 4 * kv, "I", "cp", "K/V, gathered again"),
        Collective("reduce_scatter", 4 * kv, "I", "cp", "dK/dV")]
    full = cp_layer_exchanges(MODEL, 2, LayerOptions(cp=4, attention="flash", cp_comm="all_gather", recompute="full"))
    assert full[1] == Collective("all_gather", 4 * kv, "I", "cp", "recompute: K/V, gathered")
    x = ring_exchanges(MODEL, 2, GATHER, layers=3, attention_forward=0.4, attention_backward=0.8)
    assert x == {"F": (RingExchange(4 * kv, 3, 0.0, "all_gather"),),
                 "I": (RingExchange(4 * kv, 3, 0.0, "all_gather"), RingExchange(4 * kv, 3, 0.0, "reduce_scatter"))}
    ring = LayerOptions(cp=4, attention="flash")  # p2p: two blocks in flight; all_gather: every rank's at once
    assert comm_buffer_bytes(MODEL, 2, GATHER) - comm_buffer_bytes(MODEL, 2, ring) == (4 - 2) * kv


def test_the_gathers_lengthen_the_compute_whole():
    """cp = 2 on the toy's 2^30 B/s link: an all-gather of 2^30 bytes moves half of them into each rank (0.5 s),
    nothing hides it; three per microbatch in F lengthen it by 1.5 s."""
    hw = toy()
    exchanges = {(0, "F"): (RingExchange(GB, 3, 0.0, "all_gather"),)}
    result = simulate(schedules.build("gpipe", 1, 1), costs(1, 1.0, 1.0, cp=2, cp_exchanges=exchanges), hw)
    seconds = group_collective_time(hw, "all_gather", [0, 1], GB)
    assert seconds == pytest.approx(0.5)
    assert result.to_dict()["ranks"][0]["cp_exposed"] == pytest.approx(3 * seconds)
    assert result.makespan == pytest.approx(1.0 + 3 * seconds + 1.0)


BASE = ["simulate", "1f1b", "-p", "1", "-m", "2", "--model", "gpt", "--hidden", "1024", "--layers", "2", "--heads",
        "8", "--seq", "4096", "--batch", "2", "--dtype", "bfloat16", "--cp", "2", "--hardware", "dgx-h100", "--json",
        "-"]


def test_simulate_exposes_what_the_ring_hid(capsys):
    assert main(BASE) == 0
    ring = json.loads(capsys.readouterr().out)["ranks"][0]
    assert main([*BASE, "--cp-comm-type", "all_gather"]) == 0
    gathered = json.loads(capsys.readouterr().out)["ranks"][0]
    assert gathered["cp_exposed"] > ring["cp_exposed"]  # the ring's hops hide under the attention blocks


ULYSSES = LayerOptions(cp=4, attention="flash", cp_comm="a2a")


def test_the_all_to_alls_of_one_layer_by_hand():
    kv = 2 * (512 // 4) * 2 * 256 * 4  # as above: the rank's K and V
    q = (512 // 4) * 2 * 256 * 4  # its Q (and O): (s / cp) x b x a d_head x 4 bytes
    assert cp_q_block_bytes(MODEL, 2, ULYSSES) == q
    assert [(c.kind, c.nbytes, c.phase, c.what) for c in cp_layer_exchanges(MODEL, 2, ULYSSES)] == [
        ("all_to_all", q, "F", "Q, to heads"), ("all_to_all", kv, "F", "K/V, to heads"),
        ("all_to_all", q, "F", "O, to tokens"), ("all_to_all", q, "I", "dO, to heads"),
        ("all_to_all", q, "I", "dQ, to tokens"), ("all_to_all", kv, "I", "dK/dV, to tokens")]
    x = ring_exchanges(MODEL, 2, ULYSSES, layers=2, attention_forward=0.4, attention_backward=0.8)
    assert x["F"] == (RingExchange(q, 2, 0.0, "all_to_all"), RingExchange(kv, 2, 0.0, "all_to_all"),
                      RingExchange(q, 2, 0.0, "all_to_all"))
    ring = LayerOptions(cp=4, attention="flash")
    assert comm_buffer_bytes(MODEL, 2, ULYSSES) - comm_buffer_bytes(MODEL, 2, ring) == q + kv - 2 * kv


def test_ulysses_runs_the_whole_sequence_on_a_quarter_of_the_heads():
    """Each rank: all 512 queries on 8 / 4 = 2 heads, instead of 128 load-balanced queries on 8: the same FLOPs."""
    (ring,) = [k for k in layer_kernels(MODEL, 2, LayerOptions(cp=4, attention="flash")).F
               if isinstance(k, FlashAttention)]
    (a2a,) = [k for k in layer_kernels(MODEL, 2, ULYSSES).F if isinstance(k, FlashAttention)]
    assert (a2a.seq, a2a.heads, a2a.kv_seq) == (512, 2, 512) and (ring.seq, ring.heads) == (128, 8)
    flops = [attention_flops(k.batch, k.seq, k.heads, k.head_dim, kv_seq=k.kv_seq, causal=True) for k in (ring, a2a)]
    assert flops[0] == flops[1]


def test_ulysses_needs_heads_that_split_over_cp():
    with pytest.raises(PipesimError, match=r"8 query and 8 key/value heads per tp rank are not divisible by cp\(3\)"):
        LayerOptions(cp=3, attention="flash", cp_comm="a2a").check(replace(MODEL, seq=576))
