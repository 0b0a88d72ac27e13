"""The published figures each source of bench/published_rows.toml gives, and how its commands relate: what the
papers, tables and logs say, checked row by row (the bench's machinery: tests/test_bench_published.py)."""

from __future__ import annotations

from pipesim.model.pipeline_split import account_split
from tests.published_bench import DATA, MOE_SOURCES, bp


def _published(rows, source: str) -> list:
    return [r.published for r in rows if r.source == source]


def _tokens_per_gpu(runs, digits: int) -> list:
    """Tokens/s per GPU of (global batch, step seconds, GPUs) runs at sequence 8192, rounded as the rows give them."""
    return [round(b * 8192 / (t * g), digits) for b, t, g in runs]


def test_each_sources_published_figures_and_commands():
    rows = DATA["rows"]
    moe = MOE_SOURCES
    assert [(r.id, r.metric, r.published) for r in rows if r.source in moe] == [
        ("mcore-moe-mixtral-8x7b-64gpus", "tflops_per_gpu_megatron", 468),  # core_v0.10.0 MoE README
        ("moezoo-mixtral-8x22b-128gpus-balanced", "tflops_per_gpu_megatron_core", 465),  # run_mixtral_8x22B.sh
        ("deepseek-v3-2048-h800", "tokens_per_sec_per_gpu", 1543.2),  # 1e12 / (180K GPU hours x 3600 s)
        # best_practice/qwen3/readme.md: four step-time rows, then the Long Context table's forced-balance TFLOPS
        ("moezoo-qwen3-235b-tp2-pp8-ep32", "seconds_per_iteration", 19.7),
        ("moezoo-qwen3-235b-tp2-pp8-ep32-a2a-overlap", "seconds_per_iteration", 17.6),
        ("moezoo-qwen3-235b-tp2-pp32-ep8", "seconds_per_iteration", 24.2),
        ("moezoo-qwen3-235b-tp4-pp8-ep8", "seconds_per_iteration", 29.0),
        ("moezoo-qwen3-235b-16k-cp1", "tflops_per_gpu_megatron_core", 295),
        ("moezoo-qwen3-235b-32k-cp2", "tflops_per_gpu_megatron_core", 335),
        ("moezoo-qwen3-235b-64k-cp4", "tflops_per_gpu_megatron_core", 368),
        ("moezoo-qwen3-235b-128k-cp8", "tflops_per_gpu_megatron_core", 389),
        ("mcore-moe-report-qwen3-235b-h100", "tokens_per_sec_per_gpu", 2132),  # arXiv:2603.07685v2 Table 11
        # Megatron-Bridge's 26.02 DGX-GB200 MXFP8 tables
        ("mb26gb200-26.02-qwen3-30b-a3b-mxfp8-8gpus", "tokens_per_sec_per_gpu", 26084),
        ("mb26gb200-26.02-qwen3-235b-a22b-mxfp8-256gpus", "tokens_per_sec_per_gpu", 5448),
        ("mb26gb200-26.02-deepseek-v3-mxfp8-256gpus", "tokens_per_sec_per_gpu", 3955),
        # the same tables' DGX-GB300 and DGX-B300 rows, and the B200 twin of the B300's DeepSeek-V3 preset
        ("mb26gb300-26.02-deepseek-v3-mxfp8-256gpus", "tokens_per_sec_per_gpu", 4612),
        ("mb26gb300-26.02-qwen3-30b-a3b-mxfp8-8gpus", "tokens_per_sec_per_gpu", 30376),
        ("mb26gb300-26.02-qwen3-235b-a22b-mxfp8-256gpus", "tokens_per_sec_per_gpu", 6583),
        ("mb26b300-26.02-deepseek-v3-mxfp8-256gpus", "tokens_per_sec_per_gpu", 2983),
        ("mb26b300-26.02-qwen3-30b-a3b-mxfp8-8gpus", "tokens_per_sec_per_gpu", 29521),
        ("mb26b300-26.02-qwen3-235b-a22b-mxfp8-256gpus", "tokens_per_sec_per_gpu", 2691),
        ("mb26b200-26.02-deepseek-v3-mxfp8-256gpus", "tokens_per_sec_per_gpu", 2689),
        # the 26.02 GPT OSS 120B BF16 table's H100, GB200 and B200 rows
        ("mb26-26.02-gpt-oss-120b-bf16-h100-64gpus", "tokens_per_sec_per_gpu", 5993),
        ("mb26-26.02-gpt-oss-120b-bf16-gb200-64gpus", "tokens_per_sec_per_gpu", 15784),
        ("mb26-26.02-gpt-oss-120b-bf16-b200-64gpus", "tokens_per_sec_per_gpu", 8047),
        # the 26.04 Kimi_K2 table's GB300 row (dist_muon)
        ("mb26-26.04-kimi-k2-mxfp8-gb300-256gpus", "tokens_per_sec_per_gpu", 5332),
        # the 26.06 Nemotron_3_Nano table (a hybrid Mamba model)
        ("mb26-26.06-nemotron-3-nano-mxfp8-gb300-8gpus", "tokens_per_sec_per_gpu", 39749),
        ("mb26-26.06-nemotron-3-nano-mxfp8-gb200-8gpus", "tokens_per_sec_per_gpu", 33522),
        ("mb26-26.06-nemotron-3-nano-mxfp8-b300-8gpus", "tokens_per_sec_per_gpu", 37316),
        ("mb26-26.06-nemotron-3-nano-fp8cs-h100-16gpus", "tokens_per_sec_per_gpu", 14719)]
    # the GB200's and B200's preset is one: their commands differ in the hardware alone
    gb200, b200 = (next(r for r in rows if r.id == f"mb26-26.02-gpt-oss-120b-bf16-{x}-64gpus")
                   for x in ("gb200", "b200"))
    assert gb200.command.replace("gb200-nvl72 --nvlink-domain 64", "hgx-b200 --nodes 8") == b200.command
    # DeepSeek-V3's preset runs unchanged on B300 and B200: the two commands differ in the hardware alone
    b300, b200 = (next(r for r in rows if r.id == f"mb26{x}-26.02-deepseek-v3-mxfp8-256gpus") for x in ("b300", "b200"))
    assert b300.command.replace("hgx-b300", "hgx-b200") == b200.command
    assert [r.published for r in rows if r.source == "MB26GB300"] == [37556, 36108, 6798, 4596, 1333, 931, 988]
    # MLPerf's logged step seconds (median of each file's steps after three, then of the files) as tokens/s/GPU
    assert _published(rows, "MLPERF50") == _tokens_per_gpu(((1152, 55.143, 512), (1152, 14.221, 2048),
                                                            (1536, 5.177, 8192)), 1)
    assert _published(rows, "MLPERF51") == _tokens_per_gpu(((36, 0.1480, 72), (36, 0.17095, 72), (64, 0.08542, 512),
                                                            (64, 0.088905, 512)), 0)
    assert _published(rows, "MLPERF51NVFP4") == _tokens_per_gpu(((1152, 13.1448, 512), (1152, 17.2602, 512),
                                                                 (960, 3.1901, 2560), (1280, 2.2286, 5120)), 1)
    mlperf = [r for r in rows if r.source == "MLPERF51"]  # one configuration on the two systems at each size
    for gb300, gb200 in (mlperf[:2], mlperf[2:]):
        assert gb300.command.replace("gb300-nvl72", "gb200-nvl72") == gb200.command
    report, zoo = (next(r for r in rows if r.id == i) for i in ("mcore-moe-report-qwen3-235b-h100",
                                                                 "moezoo-qwen3-235b-tp2-pp8-ep32-a2a-overlap"))
    # Table 20's layout is the ModelZoo row's, at a later software version with CUDA graphs (its B.2)
    assert report.command == zoo.command + " --cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router " \
        "moe_preprocess"
    for r in (r for r in rows if r.source == "MOEZOOQWEN3"):  # 96 layer slots: embedding and loss take one each
        args = bp.parse_command(r.command)[1]
        assert args.account_embedding and args.account_loss and args.layer_split is None
        slots = account_split(94, args.stages * args.virtual, embedding=True, loss=True)
        assert slots[0] == slots[-1] == slots[1] - 1 and sum(slots) == 94
        assert args.stages * args.tp * args.cp * args.dp == 256 and args.nodes == 32
    in_ref = {k for k, s in DATA["sources"].items() if s["in_published_md"]}
    assert in_ref == {"NAR21", "KOR22"}  # the goal's rows: those of shared/reference/published.md
    # NAR21 T1, KOR22 T5 (2 columns), T4 (3 x 2); Llama 3 Table 4's two 8K rows
    assert sum(r.published is not None and r.source in in_ref for r in rows) == 10 + 8 + 6
    assert [(r.id, r.published) for r in rows if r.source == "LLAMA3"] == [("llama3-405b-8k-8192gpus", 430),
                                                                             ("llama3-405b-8k-16384gpus", 400)]
    assert [(r.id, r.published) for r in rows if r.source == "BLOOM"] == [("bloom-176b", 150)]
    assert [r.published for r in rows if r.source == "MTNLG"] == [126, 121, 113]  # Smith et al. 2022, sec. 2.4
    # KOR22 Table 4's rows that published.md leaves out: sequence parallelism alone, selective alone (F, B in ms)
    assert [r.published for r in rows if r.source == "KOR22T4"] == [7.2, 11.8, 7.7, 13.2]
    for r in (r for r in rows if r.source == "KOR22T4"):  # each is KOR22's Table 4 command with one feature
        base = next(b for b in rows if b.id == "kor22-layer-baseline-" + r.metric.split("_")[1])
        feature = " --sequence-parallel" if "-sp-" in r.id else " --recompute selective"
        assert r.command == base.command.replace(" --scatter-gather", feature + " --scatter-gather"), r.id
