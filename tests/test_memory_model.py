"""Per-rank memory: ZeRO stages exactly (ZeRO paper, Megatron's documented bytes), data-parallel traffic,
the peak breakdown and its refusal, and the published configurations' first ranks against 80 GiB."""

from __future__ import annotations

import pytest

import schedules
from pipesim.cost.model_costs import ParallelCosts
from pipesim.cost.rank_memory import activation_peak
from pipesim.cost.rank_memory import rank_memory as rank_memory_of
from pipesim.cost.table import CostTable, StageCosts
from pipesim.errors import PipesimError
from pipesim.ir.schedule import Kind
from pipesim.job import Job
from pipesim.model.activations import embedding_activation_bytes, layer_activation_bytes, recompute_working_bytes
from pipesim.model.config import ModelConfig
from pipesim.model.hf_config import load_hf_config
from pipesim.model.memory import (
    PRECISIONS,
    MemoryBreakdown,
    ModelState,
    check_rank_fits,
    comm_buffer_bytes,
    dp_collectives,
    model_state_bytes,
    optimizer_step_bytes,
    rank_memory,
    stage_memory,
    step_peak_state,
    zero3_chunk_collectives,
)
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import block_params, embedding_params, stage_params
from pipesim.parallel_dims import ParallelDims
from pipesim.sim.simulator import simulate

GiB = 2**30
H100 = A100 = 80 * GiB


# --- ZeRO stages ---

@pytest.mark.parametrize("zero,expected", [
    (0, (2, 2, 12)),  # bytes per parameter, mixed precision Adam (ZeRO paper, section 3.1)
    (1, (2, 2, 12 / 8)),
    (2, (2, 2 / 8, 12 / 8)),
    (3, (2 / 8, 2 / 8, 12 / 8)),
])
def test_zero_stages_divide_the_mixed_precision_state(zero, expected):
    P = 8_000_000
    state = model_state_bytes(P, dp=8, zero=zero)
    assert (state.parameters, state.gradients, state.optimizer_states) == tuple(P * k for k in expected)


def test_fp32_and_megatron_precisions():
    P, dp = 1_000_000, 4
    assert model_state_bytes(P, dp=dp, zero=0, precision=PRECISIONS["fp32"]) == ModelState(4 * P, 4 * P, 8 * P)
    assert model_state_bytes(P, dp=dp, zero=3, precision=PRECISIONS["fp32"]) == ModelState(P, P, 2 * P)
    megatron = PRECISIONS["megatron"]  # Megatron docs: bf16 params, fp32 grads: 18 bytes, 6 + 12/d distributed
    assert model_state_bytes(P, dp=dp, zero=0, precision=megatron).total == 18 * P
    assert model_state_bytes(P, dp=dp, zero=1, precision=megatron).total == 6 * P + 12 * P // dp


def test_an_uneven_shard_is_padded_up():
    state = model_state_bytes(10, dp=4, zero=3)
    assert state == ModelState(3 * 2, 3 * 2, 3 * 12)
    assert model_state_bytes(10, dp=1, zero=3) == model_state_bytes(10, dp=1, zero=0)


@pytest.mark.parametrize("zero,dp,message", [(4, 2, "--zero must be one of 0, 1, 2, 3, got 4"),
                                             (1, 0, "dp must be a positive integer, got 0")])
def test_bad_zero_arguments(zero, dp, message):
    with pytest.raises(PipesimError) as err:
        model_state_bytes(10, dp=dp, zero=zero)
    assert str(err.value) == message


def test_adam_step_moves_28_bytes_per_owned_parameter():
    P = 1_000_000
    assert optimizer_step_bytes(P, dp=8, zero=0) == 28 * P  # read grad 2 + master, m, v 12; write those 12 + bf16 2
    assert optimizer_step_bytes(P, dp=8, zero=1) == 28 * P // 8
    assert optimizer_step_bytes(P, dp=8, zero=3, precision=PRECISIONS["fp32"]) == (16 + 12) * P // 8
    assert optimizer_step_bytes(P, dp=8, zero=1, precision=PRECISIONS["megatron"]) == (4 + 12 + 12 + 2) * P // 8


def test_dp_collectives_per_stage():
    P = 1000
    assert [(c.kind, c.nbytes, c.phase) for c in dp_collectives(P, dp=4, zero=0, microbatches=8)] == \
        [("all_reduce", 2 * P, "step")]
    assert [(c.kind, c.nbytes, c.phase) for c in dp_collectives(P, dp=4, zero=1, microbatches=8)] == \
        [("reduce_scatter", 2 * P, "step"), ("all_gather", 2 * P, "step")]
    # with pipelining gradients accumulate over the microbatches and are reduced once: ZeRO 2 sends what 1 sends
    zero2 = dp_collectives(P, dp=4, zero=2, microbatches=8)  # the gradient shard: reduced after every microbatch
    assert [(c.kind, c.nbytes, c.phase, c.count) for c in zero2] == [("reduce_scatter", 2 * P, "W", 8),
                                                                     ("all_gather", 2 * P, "step", 1)]
    megatron = dp_collectives(P, dp=4, zero=1, microbatches=8, precision=PRECISIONS["megatron"])
    assert [c.nbytes for c in megatron] == [4 * P, 2 * P]  # fp32 gradients reduce-scattered, bf16 params gathered
    assert dp_collectives(P, dp=4, zero=3, microbatches=8) == [] == dp_collectives(P, dp=1, zero=0, microbatches=8)


def test_zero3_gathers_each_chunk_once_per_step():
    C = 5000
    chunk = zero3_chunk_collectives(C, dp=8)
    assert [(c.kind, c.nbytes, c.phase) for c in chunk] == [("all_gather", 2 * C, "F"), ("reduce_scatter", 2 * C, "W")]
    assert zero3_chunk_collectives(C, dp=1) == []


@pytest.mark.parametrize("zero,expected", [
    (0, (2, 2, 12)),  # bytes per parameter held during a pipelined step, mixed precision, dp 8
    (1, (2, 2, 12 / 8)),
    (2, (2, 2 / 8, 12 / 8)),
    (3, (2 / 8 + 2, 2 / 8, 12 / 8)),  # the shard plus the chunk gathered from the step's start to its reduce_scatter
])
def test_step_peak_state_holds_the_gathered_chunks(zero, expected):
    P = 8_000_000
    state = step_peak_state(P, dp=8, zero=zero)
    assert (state.parameters, state.gradients, state.optimizer_states) == tuple(P * k for k in expected)
    assert step_peak_state(P, dp=1, zero=zero) == model_state_bytes(P, dp=1, zero=zero)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_rank_memory_uses_the_step_state_of_the_ranks_chunks(zero):
    """Interleaved, 2 ranks x 2 chunks of 1000 parameters each (fp32 costs: 4 + 4 + 8 bytes), dp 4."""
    sched = schedules.build("interleaved-1f1b", 2, 4, 2)
    stage = StageCosts(1.0, 1.0, 1.0, activation_bytes=10)
    costs = ParallelCosts(CostTable((stage,) * 4), Job(ParallelDims(dp=4), zero=zero), tp_collectives={},
                          dp_grad_bytes=(0,) * 4, layers_per_stage=(1,) * 4, param_counts=(1000,) * 4)
    mem = rank_memory_of(sched, costs)[0]
    owned = 2000 // 4 if zero else 2000
    assert (mem.parameters, mem.gradients, mem.optimizer_states) == (
        4 * (owned + 2000 if zero == 3 else 2000), 4 * (owned if zero >= 2 else 2000), 8 * owned)


# --- breakdown and refusal ---

def test_breakdown_terms_and_total():
    mem = rank_memory(ModelState(10, 20, 30), activations_per_microbatch=7, inflight=4, recompute=5, comm_buffers=1)
    assert mem.to_dict() == {"parameters": 10, "gradients": 20, "optimizer_states": 30, "activations": 28,
                             "recompute": 5, "comm_buffers": 1, "inflight": 4, "total": 94}
    assert mem.largest() == ("optimizer_states", 30)


def test_refusal_names_rank_total_and_largest_term():
    mem = MemoryBreakdown(parameters=4 * GiB, gradients=4 * GiB, optimizer_states=24 * GiB, activations=60 * GiB,
                          inflight=8, comm_buffers=GiB // 2)
    check_rank_fits(mem, rank=3, capacity=93 * GiB, device="H100")  # 92.5 GiB fits
    with pytest.raises(PipesimError) as err:
        check_rank_fits(mem, rank=3, capacity=H100, device="H100", where="stage 3")
    assert str(err.value) == (
        "rank 3 (stage 3) needs 92.50 GiB, the largest term activations 60.00 GiB for up to 8 in-flight "
        "microbatches (parameters 4.00, gradients 4.00, optimizer states 24.00, activations 60.00, comm buffers "
        "0.50 GiB) but H100 has 80.00 GiB")


def test_recompute_and_sharding_order_the_peak():
    model = ModelConfig(kind="gpt", hidden=1024, heads=16, seq=512, layers=8, vocab=1000, batch=8, dtype="bfloat16")
    peaks = [stage_memory(model, 2, LayerOptions(tp=2, recompute=r), layers=4, first=True, last=False,
                          inflight=4).total for r in ("none", "selective", "full")]
    assert peaks[0] > peaks[1] > peaks[2]
    zeros = [stage_memory(model, 2, LayerOptions(tp=2), layers=4, first=True, last=False, inflight=4, dp=4,
                          zero=z).total for z in (0, 1, 2, 3)]
    # ZeRO 3 adds its shard to the gathered chunk: it holds ZeRO 2's memory plus 2P / dp
    params = stage_params(model, 2, layers=4, first=True, last=False)
    assert zeros[0] > zeros[1] > zeros[2] and zeros[3] == zeros[2] + 2 * -(-params // 4)


# --- published configurations (../shared/reference/published.md) on 80 GiB ---

# (heads, hidden, layers, t, p, GPUs, global batch, mbs, interleaving v)
NAR21 = [(24, 2304, 24, 1, 1, 32, 512, 16, 1), (32, 3072, 30, 2, 1, 64, 512, 16, 1),
         (32, 4096, 36, 4, 1, 128, 512, 16, 1), (48, 6144, 40, 8, 1, 256, 1024, 8, 1),
         (64, 8192, 48, 8, 2, 512, 1536, 4, 1), (80, 10240, 60, 8, 4, 1024, 1792, 2, 3),
         (96, 12288, 80, 8, 8, 1536, 2304, 2, 2), (128, 16384, 96, 8, 16, 1920, 2160, 1, 2),
         (128, 20480, 105, 8, 35, 2520, 2520, 1, 3), (160, 25600, 128, 8, 64, 3072, 3072, 1, 1)]
KOR22 = [(64, 6144, 48, 8, 1, 8, 4, 4, 1), (96, 12288, 96, 8, 8, 64, 64, 1, 3),
         (128, 20480, 105, 8, 35, 280, 280, 1, 3), (160, 25600, 128, 8, 64, 512, 512, 1, 1)]


def _first_rank(row: tuple, opts: LayerOptions) -> MemoryBreakdown:
    """Rank 0 of a Megatron run: 1F1B keeps min(p, m) microbatches in flight; interleaved 1F1B keeps
    Megatron's warmup, min(2 (p - 1) + (v - 1) p, m v), plus the one steady-state forward, of chunk-microbatches.
    The embedding's stash is charged to every in-flight chunk-microbatch (an upper bound)."""
    a, h, layers, t, p, gpus, B, mbs, v = row
    dp = gpus // (t * p)
    m = B // (dp * mbs)
    model = ModelConfig(kind="gpt", hidden=h, heads=a, layers=layers, seq=2048, vocab=51200, batch=B, dtype="float16")
    per_chunk = layers // (p * v)
    assert per_chunk * p * v == layers
    if v == 1:
        return stage_memory(model, mbs, opts, layers=per_chunk, first=True, last=p == 1, inflight=min(p, m), dp=dp)
    inflight = min(2 * (p - 1) + (v - 1) * p + 1, m * v)
    params = stage_params(model, t, layers=per_chunk * v, first=True, last=False)
    per_mb = per_chunk * layer_activation_bytes(model, mbs, opts) + embedding_activation_bytes(model, mbs, opts)
    return rank_memory(model_state_bytes(params, dp=dp, zero=0), activations_per_microbatch=per_mb,
                       inflight=inflight, recompute=recompute_working_bytes(model, mbs, opts),
                       comm_buffers=comm_buffer_bytes(model, mbs, opts))


@pytest.mark.parametrize("row", NAR21, ids=lambda r: f"h{r[1]}")
def test_narayanan_table1_first_rank_fits_with_full_recompute_not_without(row):
    t = row[3]
    check_rank_fits(_first_rank(row, LayerOptions(tp=t, recompute="full")), rank=0, capacity=A100, device="A100")
    with pytest.raises(PipesimError, match=r"^rank 0 needs .* GiB, the largest term "):
        check_rank_fits(_first_rank(row, LayerOptions(tp=t)), rank=0, capacity=A100, device="A100")


@pytest.mark.parametrize("row", KOR22, ids=lambda r: f"h{r[1]}")
def test_korthikanti_table5_first_rank_fits_with_either_recompute_not_without(row):
    t = row[3]
    for opts in (LayerOptions(tp=t, recompute="full"), LayerOptions(tp=t, sp=True, recompute="selective")):
        check_rank_fits(_first_rank(row, opts), rank=0, capacity=A100, device="A100")
    with pytest.raises(PipesimError, match="the largest term activations"):
        check_rank_fits(_first_rank(row, LayerOptions(tp=t)), rank=0, capacity=A100, device="A100")


def test_llama3_405b_first_rank_on_16k_h100s():
    """Llama 3 paper, Table 4 (8,192-token phase): tp 8, cp 1, pp 16, dp 128, 16M-token batches (2048 sequences),
    microbatch 1, bf16; 126 layers over 16 ranks x 8 chunks, the first chunk holding only the embedding."""
    model = load_hf_config("llama3-405b", seq=8192, batch=2048)
    s, b, h, a, f, hkv, t = 8192, 1, 16384, 128, 53248, 8 * 128, 8
    opts = LayerOptions(tp=t, sp=True, attention="flash")
    # norms' inputs, QKV input, Q, attention output, MLP input (2 s h / t each); K, V; logsumexp; gate, up, down input
    layer = 6 * 2 * s * b * h // t + 2 * 2 * s * b * hkv // t + 4 * s * b * a // t + 3 * 2 * s * b * f // t
    assert layer_activation_bytes(model, b, opts) == layer == 533_200_896
    assert embedding_activation_bytes(model, b, opts) == 0
    block = (h * (h + 2 * hkv) + h * h + 3 * h * f) // t + 2 * h
    assert block_params(model, t) == block == 398_491_648
    params = 7 * block + embedding_params(model, t)  # chunks 16, 32, ..., 112 hold a layer each; chunk 0 the embedding
    assert params == 7 * block + 128256 // t * h == 3_052_109_824
    dp, m, p, v = 128, 2048 // 128, 16, 8
    inflight = min(2 * (p - 1) + (v - 1) * p + 1, m * v)
    assert inflight == 128  # every forward of the step runs before the first backward: 112 chunks with a layer
    sharded = step_peak_state(params, dp=dp, zero=2)  # optimizer states and gradients sharded; parameters kept
    mem = rank_memory(sharded, activations_per_microbatch=layer, inflight=112,
                      comm_buffers=comm_buffer_bytes(model, b, opts, dp=dp, zero=2))
    assert mem.parameters == 2 * params and mem.optimizer_states == 12 * -(-params // dp)
    check_rank_fits(mem, rank=0, capacity=H100, device="H100")
    assert 61 * GiB < mem.total < 63 * GiB  # 55.6 GiB of activations, 5.7 GiB of parameters
    unsharded = rank_memory(model_state_bytes(params, dp=dp, zero=0), activations_per_microbatch=layer, inflight=112)
    with pytest.raises(PipesimError, match="the largest term activations 55.62 GiB for up to 112 in-flight"):
        check_rank_fits(unsharded, rank=0, capacity=H100, device="H100")


# --- the simulator's memory timeline under recomputation ---

def _recompute_costs(stages: int, act: int, redo: int) -> ParallelCosts:
    stage = StageCosts(1.0, 1.0, 1.0, activation_bytes=act, recompute_bytes=redo)
    return ParallelCosts(CostTable((stage,) * stages), Job(), tp_collectives={}, dp_grad_bytes=(0,) * stages,
                         layers_per_stage=(1,) * stages)


@pytest.mark.parametrize("name,v,bwd", [("1f1b", 1, Kind.B), ("interleaved-1f1b", 2, Kind.B), ("zb-h1", 1, Kind.I)])
def test_timeline_holds_the_recomputed_layer_during_its_backward_only(name, v, bwd):
    """F = I = W = 1 s, 100 bytes stashed per microbatch, 7 re-created: each recomputing backward raises the
    timeline by 7 at its start and drops it by 7 (plus its release) at its end; the peak is the memory check's."""
    p, m, act, redo = 4, 8, 100, 7
    sched = schedules.build(name, p, m, v)
    costs = _recompute_costs(p * v, act, redo)
    plain = simulate(sched, _recompute_costs(p * v, act, 0))
    result = simulate(sched, costs)
    assert result.starts == plain.starts and result.ends == plain.ends  # time is the same
    lowered = result.schedule
    for r in range(p):
        expected, live = [(0.0, 0)], 0
        for i, a in enumerate(lowered.programs[r]):
            if a.kind == bwd:
                expected.append((result.starts[r][i], live + redo))
            if a.kind == Kind.F:
                live += act
            elif a.kind == (Kind.W if bwd == Kind.I else Kind.B):
                live -= act
            if a.kind == Kind.F or a.kind == bwd or a.kind == Kind.W and bwd == Kind.I:
                expected.append((result.ends[r][i], live))
        assert result.memory_timeline[r] == expected
        stash, working, _ = activation_peak(sched, costs, r)
        assert working == redo
        assert result.peak_activation_bytes()[r] == stash + working == max(plain.peak_activation_bytes()[r],
                                                                            max(b for _, b in expected))
