"""bench/published_metrics.py: the papers' conversion formulas (NAR21's eq. 3, PaLM's, Megatron's counts), the
unit conversions and the action times the rows read."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.published_bench import DATA_ROW, LAYER, bp


def test_nar21_flops_formula_exactly():
    # 1.7B row: B 512, s 2048, l 24, h 2304, V 51200; eq. 3 term by term
    b, s, l, h, v = 512, 2048, 24, 2304, 51200
    expected = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert bp.metrics.nar21_flops_per_iteration(b, s, l, h, v) == pytest.approx(expected, rel=1e-15)
    # 1 + 2048/13824 + 51200/884736 = 1.2059...: the integer part is exact
    assert bp.metrics.nar21_flops_per_iteration(1, 6, 1, 1, 0) == 96 * 6 * (1 + 1.0)
    assert bp.metrics.nar21_flops_per_iteration(1, 1, 1, 1, 16) == 96 * (1 + 1 / 6 + 1.0)

def test_tflops_per_gpu_and_iteration_seconds():
    assert bp.metrics.tflops_per_gpu(4e15, 2.0, 10) == pytest.approx(200.0, rel=1e-15)
    assert bp.metrics.iteration_seconds({"step_time": 3.5, "makespan": 3.0}) == 3.5
    assert bp.metrics.iteration_seconds({"makespan": 3.0}) == 3.0  # older JSON without step_time
    # NeMo's unit: 256 sequences of 4096 tokens in 8 s on 64 GPUs
    assert bp.metrics.tokens_per_gpu_second(256, 4096, 8.0, 64) == 2048.0
    assert bp.metrics.METRICS["tokens_per_sec_per_gpu"].faster_is_higher

def test_nar21_metric_reads_the_command_flags():
    _, args = bp.parse_command(DATA_ROW("nar21-39.1b").command)
    assert (args.batch, args.seq, args.layers, args.hidden, args.vocab, bp.metrics.gpus(args)) == (1536, 2048, 48, 8192,
                                                                                          51200, 512)
    metric = bp.metrics.METRICS["tflops_per_gpu_nar21"]
    flops = 96 * 1536 * 2048 * 48 * 8192**2 * (1 + 2048 / (6 * 8192) + 51200 / (16 * 48 * 8192))
    assert (metric.unit, metric.faster_is_higher) == ("TFLOP/s per GPU", True)
    assert metric.convert({"step_time": 10.0, "makespan": 9.0}, args) == pytest.approx(flops / (10.0 * 512) / 1e12,
                                                                                      rel=1e-15)

def test_layer_times_from_the_middle_stage():
    _, args = bp.parse_command(LAYER)
    assert bp.metrics.layer_stage(args) == 1
    sim = {"critical_path": [{"name": "0F0", "kind": "compute", "start": 0.0, "end": 0.001},
                             {"name": "0SEND_F0", "kind": "transfer", "start": 0.001, "end": 0.002},
                             {"name": "1F0", "kind": "compute", "start": 0.002, "end": 0.0095},
                             {"name": "1B0", "kind": "compute", "start": 0.02, "end": 0.0325}]}
    assert bp.metrics.METRICS["layer_forward_ms"].convert(sim, args) == pytest.approx(7.5, rel=1e-12)
    assert bp.metrics.METRICS["layer_backward_ms"].convert(sim, args) == pytest.approx(12.5, rel=1e-12)
    _, two = bp.parse_command(LAYER.replace("--layers 1", "--layers 2").replace("0,1,0", "0,2,0"))
    with pytest.raises(ValueError, match="one stage of one layer"):
        bp.metrics.layer_stage(two)

def test_without_optimizer_takes_the_latest_rank_less_its_optimizer():
    sim = {"step_time": 10.0, "makespan": 8.0, "ranks": [{"step_end": 10.0, "optimizer": 1.0},
                                                          {"step_end": 9.5, "optimizer": 0.2}]}
    assert bp.metrics.without_optimizer(sim)["step_time"] == pytest.approx(9.3)
    # no per-rank optimizer
    assert bp.metrics.without_optimizer({"step_time": 3.0, "makespan": 2.0})["step_time"] == 3.0

def test_palm_flops_and_the_llama3_405b_count():
    assert bp.metrics.palm_flops_per_token(10, 2, 3, 4, 5) == 6 * 10 + 12 * 2 * 3 * 4 * 5
    _, args = bp.parse_command(DATA_ROW("llama3-405b-8k-16384gpus").command)
    h, f, hkv, layers, vocab = 16384, 53248, 8 * 128, 126, 128256  # the llama3-405b config
    n = layers * (h * (h + 2 * hkv) + h * h + 3 * h * f + 2 * h) + h + h * vocab  # no embedding table; RMSNorms
    expected = (6 * n + 12 * layers * 128 * 128 * 8192) * 2048 * 8192
    assert bp.metrics.palm_flops_per_iteration(args) == pytest.approx(expected, rel=1e-15)

def _mixtral_args(extra: str = "") -> object:
    _, args = bp.parse_command("pipesim simulate 1f1b --model-config mixtral-8x7b --seq 4096 --batch 256 "
                               "--microbatch-size 1 --stages 4 --dp 16 --ep 8 --hardware dgx-h100 --nodes 8" + extra)
    return args

def test_megatron_flop_counts_of_mixtral_8x7b_by_hand():
    # Mixtral 8x7B: h 4096, L 32, A 32, G 8, head dim 128, expert width 14336, top-2, SwiGLU, V 32000
    b, s, h, layers, f, v = 256, 4096, 4096, 32, 14336, 32000
    old = 12 * b * s * layers * h * h * ((1 + 8 / 32 + s / h) + f / h * 2 * 1.5 + v / (2 * layers * h))
    assert bp.metrics.megatron_flops_per_iteration(_mixtral_args()) == pytest.approx(old, rel=1e-14)
    # core_v0.12.0 on: the causal half of the square; the MLP and logit terms unchanged for an all-MoE model
    new = b * s * (12 * layers * h * (f * 2 * 1.5) + 12 * layers * h * h * (1 + 8 / 32 + s / (2 * h)) + 6 * h * v)
    assert bp.metrics.megatron_core_flops_per_iteration(_mixtral_args()) == pytest.approx(new, rel=1e-14)
    assert old - new == pytest.approx(12 * b * s * layers * h * h * s / (2 * h), rel=1e-12)  # exactly half the square

def test_megatron_core_count_of_dense_and_shared_expert_layers(monkeypatch):
    # a toy MoE: 4 layers, the first dense (width 64), 3 with 4 experts top-1 of width 16 and one shared of width 8
    args = _mixtral_args()
    m = bp.metrics.model_config(args)
    moe = replace(m.moe, experts=4, top_k=1, expert_ffn=16, shared_experts=1, shared_ffn=8, dense_layers=1)
    toy = replace(m, hidden=32, layers=4, heads=4, kv_heads=2, ffn_hidden=64, vocab=100, seq=64, batch=2, moe=moe)
    monkeypatch.setattr(bp.metrics, "model_config", lambda _args: toy)
    mlp = 1.5 * (64 * 1 + (16 * 1 + 8) * 3) / 4
    attention = 12 * 4 * 32 * 32 * (1 + 2 / 4 + 64 / 64) * (4 * 8 / 32)  # head dim 32 / 4 = 8
    assert bp.metrics.megatron_core_flops_per_iteration(args) == pytest.approx(
        2 * 64 * (12 * 4 * 32 * mlp + attention + 6 * 32 * 100), rel=1e-14)
    assert bp.metrics.METRICS["tflops_per_gpu_megatron_core"].faster_is_higher
