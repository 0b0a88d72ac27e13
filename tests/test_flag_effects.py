"""Every `pipesim simulate` flag changes the result, is refused in one line, or is a no-op for a stated reason, in
each of bench/flag_effects.py's contexts: a flag added without an effect (or a refusal) fails here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipesim.cli import main

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import flag_effects  # noqa: E402

SIM = ["simulate", "1f1b", "--stages", "2", "--microbatches", "4"]
GPT = [*SIM, *flag_effects.GPT, "--hardware", "dgx-h100"]


@pytest.mark.parametrize("context", sorted(flag_effects.CONTEXTS))
def test_no_flag_is_silently_ignored(context):
    rows = flag_effects.outcomes(context)
    bad = [f"{r['outcome']} {r['flag']} {r['message']}" for r in rows if r["outcome"] in ("IGNORED", "CRASH")]
    assert bad == []
    assert {r["outcome"] for r in rows} >= {"changed", "refused"}  # the contexts exercise both
    assert not [r for r in rows if r["outcome"] == "no-op" and "FIXME" in r["message"]]


def test_a_reason_is_given_only_where_the_result_is_unchanged():
    # an explanation never hides an effect: --sequence-parallel at tp 2 changes the layers, at tp 1 it is a no-op
    ctx = "gpt, dgx-h100"
    assert flag_effects.explained(ctx, ["--sequence-parallel"]) == "needs --tp > 1"
    assert flag_effects.explained("llama3-8b, tp 2, sp, dgx-h100", ["--zero", "1"]) == "needs --dp > 1"
    assert flag_effects.explained("moe, dgx-h100, ep 2", ["--zero", "1"]) is None  # dp 2: it must act
    row = next(r for r in flag_effects.outcomes("moe, dgx-h100, ep 2") if r["flag"] == "--zero 1")
    assert row["outcome"] == "changed"


@pytest.mark.parametrize(("argv", "line"), [
    ([*GPT, "--jitter-seed", "3"], "--jitter-seed seeds --jitter's draws: it needs --jitter SIGMA > 0"),
    ([*GPT, "--overlap-p2p-communication"],
     "--overlap-p2p-communication lets an interleaved schedule's sends go without holding their rank: it needs "
     "--blocking-p2p (or --framework megatron-core), where they hold it"),
    ([*SIM, "--cost", "F=1,B=2", "--comm", "links"],
     "--comm links needs --hardware with --cost (the links are the hardware's; without it the messages are free)"),
    ([*SIM, "--cost", "F=1,B=2", "--blocking-p2p"],
     "--blocking-p2p acts on --cost's pipeline messages, which are free without links: give --hardware (and not "
     "--comm none)"),
    ([*SIM, "--cost", "F=1,B=2", "--hardware", "dgx-h100", "--comm", "none", "--boundary-bytes", "100"],
     "--boundary-bytes acts on --cost's pipeline messages, which are free without links: give --hardware (and not "
     "--comm none)"),
    ([*SIM, "--cost", "F=1,B=2", "--dtensor-tp"], "--dtensor-tp needs a model, but --cost gives the seconds: drop one"),
    ([*SIM, "--cost", "F=1,B=2", "--zero", "0"], "--zero needs a model, but --cost gives the seconds: drop one"),
    ([*SIM, "--cost", "F=1,B=2", "--grad-reduce-in-bf16"],
     "--grad-reduce-in-bf16 needs a model, but --cost gives the seconds: drop one"),
    ([*SIM, "--cost", "F=1,B=2", "--no-cross-entropy-loss-fusion"],
     "--no-cross-entropy-loss-fusion needs a model, but --cost gives the seconds: drop one"),
    ([*SIM, "--model", "mlp", "--compile"],
     "--compile needs a transformer (--model gpt, moe or --model-config): pipesim times the MLP's layers as their "
     "GEMMs alone"),
    ([*SIM, "--model", "mlp", "--attention", "flash"],
     "--attention needs a transformer (--model gpt, moe or --model-config): pipesim times the MLP's layers as "
     "their GEMMs alone"),
    ([*SIM, "--model", "mlp", "--no-gradient-accumulation-fusion"],
     "--no-gradient-accumulation-fusion needs a transformer (--model gpt, moe or --model-config): pipesim times "
     "the MLP's layers as their GEMMs alone"),
    ([*SIM, "--model", "mlp", "--accumulate-allreduce-grads-in-fp32"],
     "--accumulate-allreduce-grads-in-fp32 needs a 16-bit model (--dtype bfloat16 or float16): a float32 model's "
     "gradients are float32 already"),
])
def test_a_flag_that_cannot_act_is_refused_in_one_line(capsys, argv, line):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"pipesim: error: {line}"]


def test_a_profile_still_applies_where_its_switches_cannot_act(capsys):
    # --framework torchtitan's --no-kernel-fusion and --dtensor-tp are not typed: the MLP takes the profile
    assert main([*SIM, "--model", "mlp", "--framework", "torchtitan"]) == 0
    assert main([*SIM, "--cost", "F=1,B=2", "--hardware", "dgx-h100", "--framework", "megatron-core"]) == 0
    capsys.readouterr()
