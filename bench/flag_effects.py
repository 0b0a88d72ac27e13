"""Every `pipesim simulate` flag either changes the result or is refused: a flag that does neither is ignored.

The product's rule is that an input it does not act on is refused in one line, never silently dropped. This script
checks it systematically: for each flag of simulate's parser (read from the parser, so a new flag is covered without
an edit here), with each value it takes (every choice; a table below for the rest), added to each of a few base
commands (contexts), it compares `--json` with and without the flag. The outcome of each (context, flag, value) is

- changed: the result (everything in `--json` but the options' echo) differs;
- refused: exit 2 with one line;
- no-op: exit 0 and the same result, for a reason `EXPLAINED` gives: the value is what the context already has, or
  the flag needs a parallel degree the context lacks (accepted as Megatron-LM accepts it: a --framework's switches
  typed out must stay valid for any layout, tests/test_frameworks.py);
- IGNORED: exit 0 and the same result with no such reason: the defect this script looks for;
- CRASH: a traceback or another exit code.

tests/test_flag_effects.py runs every context and asserts that nothing is IGNORED or CRASH.

    .venv/bin/python bench/flag_effects.py                 # every context, the IGNORED and CRASH lines and a count
    .venv/bin/python bench/flag_effects.py --all --json out/flag_effects.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

from pipesim.cli import OneLineParser, build_parser, main

ROOT = Path(__file__).resolve().parent.parent
GPT = ["--model", "gpt", "--hidden", "256", "--layers", "4", "--heads", "4", "--seq", "128", "--vocab", "1000",
       "--batch", "8", "--dtype", "bfloat16"]
CONTEXTS = {  # name: simulate's argv (before the flag); each small enough to simulate in a fraction of a second
    "gpt, dgx-h100": ["1f1b", "--stages", "2", "--microbatches", "4", *GPT, "--hardware", "dgx-h100"],
    "mlp, default hardware": ["1f1b", "--stages", "2", "--microbatches", "4", "--model", "mlp"],
    # large enough that its layers' GPU time is not hidden under their host's launches (pipesim.model.host_ops)
    "moe, dgx-h100, ep 2": ["1f1b", "--stages", "2", "--microbatches", "4", "--model", "moe", "--hidden", "2048",
                            "--layers", "4", "--heads", "16", "--seq", "2048", "--vocab", "32000", "--batch", "8",
                            "--dtype", "bfloat16", "--dp", "2", "--ep", "2", "--hardware", "dgx-h100"],
    "cost spec": ["1f1b", "--stages", "2", "--microbatches", "4", "--cost", "F=1,B=2"],
    "llama3-8b, tp 2, sp, dgx-h100": ["1f1b", "--stages", "2", "--microbatches", "4", "--model-config", "llama3-8b",
                                      "--seq", "1024", "--batch", "8", "--layers", "4", "--tp", "2",
                                      "--sequence-parallel", "--hardware", "dgx-h100"],
}
SKIP = {  # flags that are not a switch of the simulated job
    "--help", "--json", "--trace", "--from-csv", "--from-torchtitan", "--from-megatron",
    "--stages", "--microbatches",  # the contexts' own sizes
}
VALUES = {  # values for flags whose type gives none (the first non-default value is enough to see an effect)
    "--virtual": ["2"], "--microbatch-size": ["2"], "--hardware": ["dgx-a100"], "--nodes": ["2"],
    "--nvlink-domain": ["4"], "--power-limit": ["500"], "--cost": ["F=2,B=3"], "--boundary-bytes": ["1000000"],
    "--activation-bytes": ["1000000"], "--dp": ["2"], "--tp": ["2"], "--cp": ["2"], "--ep": ["2"], "--etp": ["1"],
    "--layer-split": ["3,1"], "--decoder-first-pipeline-num-layers": ["3"], "--decoder-last-pipeline-num-layers": ["3"],
    "--pipeline-model-parallel-layout": ["Et*3|tL"], "--pipeline-parallel-first-stage-less-layers": ["2"],
    "--pipeline-parallel-last-stage-less-layers": ["2"], "--model": ["gpt"], "--memory-limit": ["2x"], "--ilp": ["1"],
    "--recompute-modules": ["mlp"], "--tp-comm-overlap-cfg": [
        str(ROOT / "bench/tp_overlap/userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192.yaml")],
    "--ddp-bucket-size": ["1000000"], "--moe-hybridep-num-sms": ["16"], "--moe-deepep-num-sms": ["8"],
    "--hidden": ["512"], "--layers": ["6"], "--heads": ["8"], "--seq": ["256"], "--vocab": ["2000"],
    "--batch": ["16"], "--seed": ["1"], "--num-experts": ["8"], "--moe-router-topk": ["1"],
    "--moe-ffn-hidden-size": ["512"], "--moe-shared-expert-intermediate-size": ["512"], "--model-config": ["llama3-8b"],
    "--kv-heads": ["2"], "--ffn-hidden": ["512"], "--moe-load-imbalance": ["1.5"],
    "--moe-expert-capacity-factor": ["1.0"], "--slow": ["1=1.5"], "--slow-link": ["0-1=2"], "--jitter": ["0.1"],
    "--jitter-seed": ["1"], "--num-layers-at-start-in-bf16": ["2"], "--num-layers-at-end-in-bf16": ["2"],
    "--kv-channels": ["32"], "--moe-layer-freq": ["[0,1,1,1]"], "--softmax-type": ["learnable"],
    "--window-size": ["63,0"], "--window-attn-skip-freq": ["2"], "--norm-epsilon": ["1e-6"],
    "--rotary-base": ["500000"], "--rotary-percent": ["0.5"], "--rotary-seq-len-interpolation-factor": ["4"],
    "--rope-scaling-factor": ["4"],
}


DEGREE_ONE = {  # flag: (the degree it needs above 1, its flag) - a no-op where the context's degree is 1
    "--cp-comm-type": "--cp", "--sequence-parallel": "--tp", "--dtensor-tp": "--tp",
    "--no-async-tensor-model-parallel-allreduce": "--tp", "--scatter-gather": "--tp", "--zero": "--dp",
    "--overlap-grad-reduce": "--dp",
}
DEFAULTS = {  # flag and value: why it is what the context already has
    "--comm links": "links are the default with hardware",
    "--attention flash": "the default on GPU hardware at 16 bits",
    "--zero 0": "the default without --framework",
    "--activation gelu": "--model gpt's default",
    "--no-cross-entropy-loss-fusion": "the default without --framework",
    "--accumulate-allreduce-grads-in-fp32": "the default for a bfloat16 model",
    "--compile": "Megatron's fused kernels are the default without an eager --framework",
    "--fp8-impl te": "the default implementation; --fp8-impl stays accepted without FP8 because --framework "
                     "torchtitan's typed-out form carries --fp8-impl torchao",
    "--fp8-impl torchao": "as --fp8-impl te: a profile's typed-out form carries it",
    "--no-overlap-p2p-communication": "the default without --framework megatron-core",
    "--untie-embeddings-and-output-weights": "--model gpt's head is untied already",
    "--transformer-impl local": "the default without --framework megatron-core or nemo",
}
COSTLESS = {  # flag: why it changes no step time or memory anywhere it is accepted
    "--moe-router-load-balancing-type": "the load-balancing loss is a few FLOPs per token on the router's scores, "
                                        "no cost pipesim counts; `pipesim run` trains it",
    "--moe-aux-loss-coeff": "as --moe-router-load-balancing-type: the loss's coefficient",
    "--moe-z-loss-coeff": "the router z-loss, as the load-balancing loss: a few FLOPs per token, not counted",
    "--moe-token-drop-policy": "which tokens a capacity drops, not how many: the same cost (`pipesim run` drops by "
                               "it; dropless routing drops none)",
    "--norm-epsilon": "a number inside the norm kernel, the same work (`pipesim run` builds it)",
    "--rotary-base": "RoPE's frequencies, the same work (`pipesim run` builds them; pipesim.model.rotary)",
    "--use-rope-scaling": "as --rotary-base: Llama 3.x's scaled frequencies",
    "--rotary-seq-len-interpolation-factor": "as --rotary-base: linearly scaled frequencies",
    "--moe-router-score-function": "the router's sigmoid or softmax over its logits: the same kernels' bytes, no "
                                   "cost pipesim counts (`pipesim run`'s router computes it)",
    "--moe-apply-probs-on-input": "the router's weight on the expert's input instead of its output: the same "
                                  "product on the same rows (`pipesim run` applies it there)",
    "--rotary-percent": "on a GPU the RoPE kernel reads and writes every feature of the head, rotated or passed (a "
                        "config.json's partial_rotary_factor the same); a CPU host's executor ops change "
                        "(pipesim.cost.executor_ops 'partial_rope')",
}
WHY = {  # (context, flag and value): why it changes nothing there
    ("gpt, dgx-h100", "--microbatch-size 2"): "the context's own: batch 8 over 4 microbatches",
    ("llama3-8b, tp 2, sp, dgx-h100", "--microbatch-size 2"): "the context's own: batch 8 over 4 microbatches",
    ("llama3-8b, tp 2, sp, dgx-h100", "--activation swiglu"): "llama3-8b's own",
    ("llama3-8b, tp 2, sp, dgx-h100", "--activation geglu"): "GeGLU in place of llama3-8b's SwiGLU: the same three "
                                                             "matrices and, fused, the same bytes (Megatron-core's "
                                                             "bias_geglu; `pipesim run` builds gelu_tanh(gate) x up)",
    ("llama3-8b, tp 2, sp, dgx-h100", "--scatter-gather"): "with sequence parallelism the boundary is already split "
                                                          "over the tp ranks",
    ("mlp, default hardware", "--framework torchtitan"): "each of its switches is a no-op on a 1-degree MLP",
    ("mlp, default hardware", "--dtype float32"): "the default dtype",
    ("cost spec", "--comm none"): "--cost without --hardware has no links: spelling it out is accepted (the "
                                  "closed-form examples do)",
    ("moe, dgx-h100, ep 2", "--etp 1"): "the default, --tp's 1",
    ("moe, dgx-h100, ep 2", "--activation relu2"): "squared ReLU in place of the moe model's GeLU experts: the same "
                                                   "two matrices and, fused (Megatron-core's weighted squared ReLU), "
                                                   "the same bytes",
    ("llama3-8b, tp 2, sp, dgx-h100", "--model gpt"): "--model-config's model is a transformer: gpt agrees with it",
    ("llama3-8b, tp 2, sp, dgx-h100", "--dtype bfloat16"): "llama3-8b's own torch_dtype",
    ("llama3-8b, tp 2, sp, dgx-h100", "--disable-bias-linear"): "llama3-8b has no biases",
    ("gpt, dgx-h100", "--add-qkv-bias"): "the GPT's biases (every linear's) hold QKV's already",
    ("moe, dgx-h100, ep 2", "--add-qkv-bias"): "the GPT's biases (every linear's) hold QKV's already",
    ("moe, dgx-h100, ep 2", "--moe-router-enable-expert-bias"): "E routing-score offsets, added inside the router's "
                                                                "top-k and kept by Megatron-core as a buffer outside "
                                                                "the optimizer: a checkpoint's count holds them "
                                                                "(pipesim.model.param_counts), a step's time and "
                                                                "memory do not",
    ("llama3-8b, tp 2, sp, dgx-h100", "--transformer-impl transformer_engine"): "llama3-8b has no biases: no QKV "
                                                                                "bias for TE's GEMM epilogue to fold",
    ("llama3-8b, tp 2, sp, dgx-h100", "--no-dropout"): "llama3-8b has no dropout",
    ("moe, dgx-h100, ep 2", "--overlap-grad-reduce"): "one bucket (Megatron's default 40M parameters) holds the "
                                                      "model: reduced after the last backward either way",
}


def explained(context: str, piece: list[str]) -> str | None:
    """Why (flag, value) changes nothing in `context`, or None when nothing explains it."""
    ctx, text = CONTEXTS[context], " ".join(piece)
    if (context, text) in WHY:
        return WHY[(context, text)]
    if any(ctx[i:i + len(piece)] == piece for i in range(len(ctx))):
        return "the context's own value"
    if piece[0] in ("--model-config", "--model") and piece[-1] in ctx:
        return "the context's own model"
    if piece[0] == "--cuda-graph-impl" and "moe" not in ctx:
        return "graphs change a mixture-of-experts layer's host launches; a dense layer's host runs ahead"
    if piece[0] in COSTLESS:
        return COSTLESS[piece[0]]
    needs = DEGREE_ONE.get(piece[0])
    if needs is not None and (needs not in ctx or ctx[ctx.index(needs) + 1] == "1"):
        return f"needs {needs} > 1"
    return DEFAULTS.get(text)


def simulate_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["simulate"]


def flag_values(action: argparse.Action) -> list[list[str]]:
    """The argv pieces to try for one flag: its name alone for a switch, else one per value."""
    flag = max(action.option_strings, key=len)
    if action.nargs == 0:
        return [[flag]]
    if flag in VALUES:
        return [[flag, v] for v in VALUES[flag]]
    if action.choices:
        return [[flag, str(c)] for c in action.choices if c != action.default]
    return [[flag, "2"]]


def run(argv: list[str]) -> tuple[int, str, dict | None]:
    """(exit code, stderr's last line, --json's result less the options' echo) of `pipesim simulate argv`."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["simulate", *argv, "--json"])
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # noqa: BLE001 - a crash is this script's finding, reported not raised
        return 99, f"{type(exc).__name__}: {exc}", None
    lines = err.getvalue().strip().splitlines()
    if rc != 0:
        return rc, lines[-1] if lines else "", None
    data = json.loads(out.getvalue())
    data.pop("options", None)
    return 0, "", data


def outcome(context: str, base: dict, piece: list[str]) -> tuple[str, str]:
    """(outcome, its line: the refusal or the no-op's reason) of `piece` added to `context`."""
    rc, line, data = run([*CONTEXTS[context], *piece])
    if rc == 2:
        return "refused", line
    if rc != 0:
        return "CRASH", line
    if data != base:
        return "changed", ""
    why = explained(context, piece)
    return ("no-op", why) if why else ("IGNORED", "")


def outcomes(context: str) -> list[dict]:
    """Every flag's outcomes in `context` (RuntimeError when the context fails on its own)."""
    rc, line, base = run(CONTEXTS[context])
    if rc != 0:
        raise RuntimeError(f"context {context!r} fails on its own: {line}")
    rows = []
    for action in simulate_parser()._actions:
        if not action.option_strings or max(action.option_strings, key=len) in SKIP:
            continue
        for piece in flag_values(action):
            what, line = outcome(context, base, piece)
            rows.append({"context": context, "flag": " ".join(piece), "outcome": what, "message": line})
    return rows


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="bench/flag_effects.py", description=__doc__.splitlines()[0])
    p.add_argument("--all", action="store_true", help="print every outcome, not only IGNORED and CRASH")
    p.add_argument("--context", choices=tuple(CONTEXTS), action="append", help="only these contexts (repeatable)")
    p.add_argument("--json", metavar="FILE", help="write every outcome to FILE")
    return p


def main_(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    rows, counts = [], {}
    for name in a.context or CONTEXTS:
        for row in outcomes(name):
            rows.append(row)
            counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
            if a.all or row["outcome"] in ("IGNORED", "CRASH"):
                print(f"{row['outcome']:8} [{name}] {row['flag']}" + (f"  -- {row['message']}" if row["message"]
                                                                      else ""))
    print("; ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
