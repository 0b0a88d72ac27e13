"""pipesim's mixture-of-experts block beside Megatron-core's own measured MoE layer (8 H100, EP 8, 4,096 tokens).

  python bench/moe_layer_check.py [--json FILE]

The peer: NVIDIA/Megatron-LM @ d98e8a64 tests/functional_tests/test_cases/common/moe_perf/baseline.json (added in
cf39a4dd, 2025-12-17), the forward and backward milliseconds of one MoELayer (router, token dispatcher, grouped
experts, shared expert; no attention, no norm) on one H100 node: test_cases.py's MIXTRAL_PROXY (hidden 4096, 8
experts of 14336, top 2) and DEEPSEEK_PROXY (hidden 7168, 32 experts of 2048, top 8 in 4 of 8 groups, a 2048 shared
expert), seq 4096 x micro-batch 1, TP 1, EP 8, forced load balancing, permute and router fusion, BF16 or FP8
blockwise (fp8 "hybrid"), the NCCL all-to-all, DeepEP or Hybrid-EP; __main__.py times CUDA events around layer(x)
and output.backward() after a dummy 8192^2 GEMM that lets the host run ahead, the mean of 20 iterations after 5.

pipesim has no attention-free layer, so its block is a difference: one MoE layer (`--model moe`, the middle stage
of a --layer-split 0,1,0 pipeline, its F and B action) less the same layer with a dense MLP of 128 columns (the
attention block, the norms and residuals, and a negligible MLP). The MoE model's attention is the GPT block's, the
same in both. Ratio = pipesim / measured (above 1: pipesim is slower, pessimistic).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

from pipesim.cli import main as pipesim

# case -> (forward ms, backward ms) as baseline.json records them
MEASURED = {
    "mixtral_a2a_tp1ep8_bf16": (4.32688798904419, 7.684332823753357),
    "mixtral_deepep_tp1ep8_bf16": (4.635550403594971, 7.854356813430786),
    "mixtral_hybridep_tp1ep8_bf16": (4.342604804039001, 7.740782427787781),
    "mixtral_a2a_tp1ep8_fp8": (3.7876319885253906, 6.618246412277221),
    "mixtral_deepep_tp1ep8_fp8": (4.101150441169739, 6.82720000743866),
    "mixtral_hybridep_tp1ep8_fp8": (3.7007392168045046, 6.57167682647705),
    "deepseek_a2a_tp1ep8_bf16": (7.119169592857361, 10.482670497894286),
    "deepseek_deepep_tp1ep8_bf16": (5.681718397140503, 9.055137538909912),
    "deepseek_hybridep_tp1ep8_bf16": (5.390828824043274, 8.795001602172851),
    "deepseek_a2a_tp1ep8_fp8": (7.609272027015686, 10.126460886001587),
    "deepseek_deepep_tp1ep8_fp8": (6.034772801399231, 8.60211353302002),
    "deepseek_hybridep_tp1ep8_fp8": (5.142886424064637, 7.6874864339828495),
}
COMMON = ["--layers", "1", "--stages", "3", "--layer-split", "0,1,0", "--microbatch-size", "1", "--batch", "8",
          "--dp", "8", "--seq", "4096", "--vocab", "32768", "--hardware", "dgx-h100", "--nodes", "3", "--attention",
          "flash", "--dtype", "bfloat16", "--framework", "megatron-core", "--activation", "swiglu"]
MODELS = {  # the proxies' sizes; heads only shape the attention block, which the difference removes
    "mixtral": ["--hidden", "4096", "--heads", "32", "--kv-heads", "8"],
    "deepseek": ["--hidden", "7168", "--heads", "56", "--kv-heads", "8"],
}
EXPERTS = {
    "mixtral": ["--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "14336"],
    "deepseek": ["--num-experts", "32", "--moe-router-topk", "8", "--moe-ffn-hidden-size", "2048",
                 "--moe-shared-expert-intermediate-size", "2048"],
}
DISPATCHERS = {"a2a": [], "deepep": ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"],
               "hybridep": ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep"]}
PRECISIONS = {"bf16": [], "fp8": ["--fp8-format", "hybrid", "--fp8-recipe", "blockwise"]}


def layer_ms(argv: list[str], tmp: Path) -> tuple[float, float]:
    """(F, B) milliseconds of the middle stage's layer: its first microbatch's actions."""
    out = tmp / "layer.json"
    with contextlib.redirect_stdout(io.StringIO()):  # the simulate report; the JSON is what is read
        code = pipesim(["simulate", "1f1b", *argv, "--json", str(out)])
    if code != 0:
        raise SystemExit(f"pipesim refused: {' '.join(argv)}")
    spans = {a["name"]: a["end"] - a["start"] for a in json.loads(out.read_text())["critical_path"]
             if a["kind"] == "compute" and a["rank"] == 1}
    return spans["1F0"] * 1e3, spans["1B0"] * 1e3


def compare(tmp: Path) -> list[dict]:
    rows, dense = [], {}  # the dense twin per (model, precision): the dispatchers share it
    for case, (f_meas, b_meas) in MEASURED.items():
        model, dispatcher, _, precision = case.split("_")
        base = COMMON + MODELS[model] + PRECISIONS[precision]
        moe_f, moe_b = layer_ms(["--model", "moe", *base, *EXPERTS[model], "--ep", "8", *DISPATCHERS[dispatcher]],
                                tmp)
        if (model, precision) not in dense:
            dense[(model, precision)] = layer_ms(["--model", "gpt", *base, "--ffn-hidden", "128"], tmp)
        dense_f, dense_b = dense[(model, precision)]
        f, b = moe_f - dense_f, moe_b - dense_b
        rows.append({"case": case, "measured_ms": [f_meas, b_meas], "pipesim_ms": [f, b],
                     "ratio": [f / f_meas, b / b_meas]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = compare(Path(tmp))
    print(f"{'case':<32} {'measured F / B ms':>18} {'pipesim F / B ms':>18} {'ratio F / B':>13}")
    for r in rows:
        (fm, bm), (fp, bp), (rf, rb) = r["measured_ms"], r["pipesim_ms"], r["ratio"]
        print(f"{r['case']:<32} {fm:8.2f} / {bm:6.2f}   {fp:8.2f} / {bp:6.2f}   {rf:5.2f} / {rb:5.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
