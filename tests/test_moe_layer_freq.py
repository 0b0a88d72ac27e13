"""`--moe-layer-freq` (pipesim.model.moe_layer_freq): Megatron-core's spellings read exactly, a placement pipesim
cannot spell refused in one line, the dense layers timed as dense, and a plan's Megatron export with dense layers
simulated back through --from-megatron to the plan's step."""

from __future__ import annotations

import json
import shlex

import pytest

from pipesim.cli import main
from pipesim.errors import PipesimError
from pipesim.model.moe_layer_freq import megatron_pattern, parse_pattern, placement

SIZES = ["--hidden", "1024", "--heads", "8", "--layers", "4", "--seq", "1024", "--batch", "16", "--dtype",
         "bfloat16"]
SIM = ["simulate", "1f1b", "--stages", "2", "--microbatches", "4", *SIZES, "--hardware", "dgx-h100"]


@pytest.mark.parametrize(("text", "layers", "pattern"), [
    ("1", 4, [1, 1, 1, 1]),
    ("2", 5, [1, 0, 1, 0, 1]),  # Megatron's integer N: layer i when i % N == 0
    ("([0]*3+[1]*5)", 8, [0, 0, 0, 1, 1, 1, 1, 1]),
    ("[0, 1] * 2", 4, [0, 1, 0, 1]),
    ("[0,1,1,1]", 4, [0, 1, 1, 1]),
])
def test_megatrons_spellings(text, layers, pattern):
    assert parse_pattern(text, layers) == pattern


@pytest.mark.parametrize(("text", "message"), [
    ("[0, 1, 1]", "--moe-layer-freq [0, 1, 1]: 3 entries of 0 and 1 for 4 layers (one per layer)"),
    ("[0, 2, 1, 1]", "--moe-layer-freq [0, 2, 1, 1]: 4 entries of 0 and 1 for 4 layers (one per layer)"),
    ("__import__('os')", "--moe-layer-freq __import__('os'): not an integer or a list of at most 4 0s and 1s"),
    ("[1] * 10**9", "--moe-layer-freq [1] * 10**9: not an integer or a list of at most 4 0s and 1s"),
    ("[1] * 2000000", "--moe-layer-freq [1] * 2000000: not an integer or a list of at most 4 0s and 1s"),
    ("[1]*3+[1]*3", "--moe-layer-freq [1]*3+[1]*3: not an integer or a list of at most 4 0s and 1s"),
    ("[1]" + "+[1]" * 3000, "--moe-layer-freq " + ("[1]" + "+[1]" * 3000)[:60] + ": not an integer or a list of 0 "
     "and 1"),  # deeper than Python's parser goes
    ("0", "--moe-layer-freq 0: an integer frequency is at least 1"),
    ("[0,", "--moe-layer-freq [0,: not an integer or a list of 0 and 1"),
    ("[0.5, 1, 1, 1]", "--moe-layer-freq [0.5, 1, 1, 1]: not an integer or a list of at most 4 0s and 1s"),
])
def test_what_is_not_a_pattern_is_refused(text, message):
    with pytest.raises(PipesimError) as err:
        parse_pattern(text, 4)
    assert str(err.value) == message


def test_placements_pipesim_can_spell_and_cannot():
    assert placement([0, 0, 1, 1]) == (2, 1)
    assert placement([0, 1, 0, 1]) == (0, 2)  # (l + 1) % 2 == 0
    assert placement([0, 0, 0, 1, 0, 1]) == (2, 2)
    assert placement([0, 0, 1, 0, 0, 1]) == (0, 3)  # also (1, 3) or (2, 3): the fewest dense layers
    for dense, every in ((0, 1), (3, 1), (1, 3), (0, 4), (5, 2)):  # the exports' list reads back to the same layers
        text = megatron_pattern(dense, every, 12)
        assert megatron_pattern(*placement(parse_pattern(text, 12)), 12) == text
    with pytest.raises(PipesimError, match=r"experts on layers \[0, 2\]; pipesim places them after"):
        placement([1, 0, 1, 0])  # Megatron's --moe-layer-freq 2
    long = [0] * 60000 + [1, 0, 1] + [0] * 5533  # 65,536 layers: refused at once, the pattern's gcd is 1
    with pytest.raises(PipesimError, match=r"experts on layers \[60000, 60002\]"):
        placement(long)
    assert placement([0] * 65535 + [1]) == (65535, 1)  # the least period first, in linear time
    with pytest.raises(PipesimError, match="no layer has experts"):
        placement([0, 0, 0])


def _sim(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_dense_layers_are_timed_and_held_as_a_dense_models(capsys):
    two = _sim(capsys, *SIM, "--model", "moe", "--moe-layer-freq", "([0]*2+[1]*2)")
    assert two == _sim(capsys, *SIM, "--model", "moe", "--moe-layer-freq", "[0, 0, 1, 1]")
    dense = _sim(capsys, *SIM, "--model", "gpt")
    every = _sim(capsys, *SIM, "--model", "moe")
    params = [r["parameters"] for r in two["memory"]["ranks"]]
    assert params[0] == dense["memory"]["ranks"][0]["parameters"]  # stage 0: layers 0 and 1, dense
    assert params[1] == every["memory"]["ranks"][1]["parameters"]  # stage 1: layers 2 and 3, experts


def test_refused_without_experts_and_over_a_dense_config(capsys):
    assert main([*SIM, "--model", "gpt", "--moe-layer-freq", "1"]) == 2
    assert capsys.readouterr().err.strip() == "pipesim: error: --moe-layer-freq needs --model moe"
    assert main([*SIM[:-2], "--model-config", "llama3-8b", "--moe-layer-freq", "1"]) == 2
    assert capsys.readouterr().err.strip().startswith("pipesim: error: --moe-layer-freq: --model-config llama3-8b is "
                                                      "a dense model")


# the model of the plan below in Megatron's words: its GeLU MLP 4h wide, LayerNorm, learned positions, biases,
# dropout 0.1 (Megatron's defaults), an untied head (--model moe's), vocabulary 1024
MODEL = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --max-position-embeddings 1024 --vocab-size 1024 "
         "--untie-embeddings-and-output-weights --bf16")


def test_a_plans_export_with_dense_layers_simulates_back(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "moe", *SIZES, "--num-experts", "8", "--moe-layer-freq", "[0,1,1,1]",
                 "--hardware", "dgx-h100", "--framework", "megatron-core", "--max-candidates", "3", "--top", "1",
                 "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    lines = plan["winner"]["megatron_args"]
    assert "--moe-layer-freq '[0, 1, 1, 1]'" in lines
    path = tmp_path / "run.sh"
    path.write_text("\n".join(lines) + "\n" + MODEL + "\n")
    again = _sim(capsys, "simulate", "--from-megatron", str(path), "--hardware", "dgx-h100")
    assert again["step_time"] == plan["rows"][0]["step_time"]
    typed = shlex.split(plan["winner"]["simulate_command"])[1:]  # the exported command: --model moe, the layers too
    assert typed[typed.index("--model") + 1] == "moe" and "--moe-layer-freq" in typed
    assert _sim(capsys, *typed)["step_time"] == plan["rows"][0]["step_time"]
    # plan --from-megatron keeps the file's placement (it is the model's, not the layout's)
    replan = tmp_path / "replan.json"
    assert main(["plan", "--from-megatron", str(path), "--hardware", "dgx-h100", "--max-candidates", "3", "--top", "1",
                 "--json", str(replan)]) == 0
    assert "--moe-layer-freq" in shlex.split(json.loads(replan.read_text())["winner"]["simulate_command"])
