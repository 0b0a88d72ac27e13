"""The transformer structure flags in Megatron's names (pipesim/commands/structure_args.py): each changes the model
as its ModelConfig field says, overrides a --model-config file's field, is refused with --model mlp and beside
--cost, and is typed again in a plan's exported simulate command."""

from __future__ import annotations

import json

import pytest

from pipesim.cli import build_parser, main
from pipesim.commands.common import model_config

H, L, V, S = 256, 2, 1024, 128  # hidden, layers, vocabulary, sequence of the model below
GPT = ["simulate", "1f1b", "--stages", "1", "--microbatches", "1", "--batch", "1", "--model", "gpt", "--layers",
       str(L), "--hidden", str(H), "--heads", "4", "--vocab", str(V), "--seq", str(S)]


def _memory(capsys, *flags: str) -> tuple[int, int]:
    """(parameters, peak activation bytes) of the GPT above in float32 on one rank."""
    assert main([*GPT, *flags, "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    return memory["param_bytes"][0] // 4, memory["peak_activation_bytes"][0]


@pytest.mark.parametrize("flags, fewer", [
    (["--disable-bias-linear"], L * 9 * H),  # QKV 3h, projection h, MLP 4h + h
    (["--tie-embeddings-and-output-weights"], V * H),  # the head's own matrix
    (["--normalization", "RMSNorm"], (2 * L + 1) * H),  # each norm's bias: two a layer and the final one
    (["--position-embedding-type", "rope"], S * H),  # the learned table
    (["--qk-layernorm"], -L * 2 * 2 * (H // 4)),  # a norm's weight and bias over head_dim on q and k
    (["--kv-channels", "128"], -L * (H * 3 * 256 + 3 * 256 + H * 256)),  # heads 128 wide: QKV and projection 2x
])
def test_each_flag_changes_the_parameters_as_its_field_says(capsys, flags, fewer):
    base, _ = _memory(capsys)
    params, _ = _memory(capsys, *flags)
    assert base - params == fewer


def test_dropout_off_stashes_no_masks(capsys):
    (p_on, act_on), (p_off, act_off) = _memory(capsys, "--dropout"), _memory(capsys, "--no-dropout")
    assert p_on == p_off and act_on == _memory(capsys)[1] and act_off < act_on


def _model(*argv: str):
    return model_config(build_parser().parse_args(["simulate", "1f1b", *argv]))


def test_the_flags_override_a_model_configs_fields():
    base = _model("--model-config", "llama3.1-8b")
    assert (base.norm, base.positions, base.biases, base.dropout, base.tied_embeddings) == \
        ("rmsnorm", "rope", False, False, False)
    typed = _model("--model-config", "llama3.1-8b", "--normalization", "LayerNorm", "--position-embedding-type",
                   "learned_absolute", "--dropout", "--qk-layernorm", "--kv-channels", "64",
                   "--tie-embeddings-and-output-weights")
    assert (typed.norm, typed.positions, typed.dropout, typed.qk_norm, typed.head_width, typed.tied_embeddings) == \
        ("layernorm", "learned", True, True, 64, True)
    assert _model("--model", "gpt", "--kv-channels", "128", "--hidden", "1024", "--heads", "8").head_width is None


@pytest.mark.parametrize("flags", [["--disable-bias-linear"], ["--normalization", "RMSNorm"], ["--no-dropout"],
                                   ["--qk-layernorm"], ["--kv-channels", "64"],
                                   ["--untie-embeddings-and-output-weights"], ["--position-embedding-type", "rope"]])
def test_refused_with_an_mlp_and_beside_cost(capsys, flags):
    assert main(["simulate", "1f1b", "--model", "mlp", *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"pipesim: error: {flags[0]} needs a transformer (--model gpt or --model-config)\n"
    assert main(["simulate", "1f1b", "--cost", "F=1,B=2", *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"pipesim: error: {flags[0]} needs a model, but --cost gives the seconds: drop one\n"


def test_a_bad_value_is_argparses_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "1f1b", "--model", "gpt", "--normalization", "rmsnorm"])
    assert exc.value.code == 2
    assert "invalid choice: 'rmsnorm' (choose from LayerNorm, RMSNorm)" in capsys.readouterr().err


def test_a_plans_export_types_them_again(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "gpt", "--hidden", "512", "--layers", "4", "--heads", "8", "--seq", "512",
                 "--vocab", "8000", "--batch", "8", "--dtype", "bfloat16", "--normalization", "RMSNorm",
                 "--disable-bias-linear", "--no-dropout", "--tie-embeddings-and-output-weights", "--hardware",
                 "dgx-h100", "--gpus", "8", "--max-candidates", "3", "--top", "1", "--json", str(out)]) == 0
    command = json.loads(out.read_text())["winner"]["simulate_command"]
    assert "--normalization RMSNorm --disable-bias-linear --no-dropout --tie-embeddings-and-output-weights" in command


def test_sinks_and_windows_in_megatrons_names(capsys, tmp_path):
    """--softmax-type learnable: a sink logit per head (heads parameters a layer); --window-size L,0 a window of L + 1
    keys, --window-attn-skip-freq N every N-th layer full; the skip frequency alone re-patterns a file's window; each
    refused in one line where it means nothing."""
    base, _ = _memory(capsys)
    sinks, _ = _memory(capsys, "--softmax-type", "learnable")
    assert sinks - base == L * 4  # four heads
    model = _model("--model", "gpt", "--window-size", "63,0", "--window-attn-skip-freq", "2", "--seq", "128")
    assert (model.window.size, model.window.full_every, model.windowed_layers(0, 8)) == (64, 2, 4)
    oss = _model("--model-config", "gpt-oss-20b", "--window-attn-skip-freq", "3")
    assert (oss.window.size, oss.window.full_every) == (128, 3)
    assert _model("--model-config", "gpt-oss-20b", "--window-size", "255,0").window.full_every == 2
    for flags, message in ((["--model", "mlp", "--window-size", "63,0"], "--window-size needs a transformer"),
                           (["--model", "gpt", "--window-attn-skip-freq", "2"],
                            "--window-attn-skip-freq needs a sliding window: give --window-size")):
        assert main(["simulate", "1f1b", *flags]) == 2
        assert message in capsys.readouterr().err
    for flags, message in ((["--window-size", "63,1"], "pipesim models causal windows"),
                           (["--window-attn-skip-freq", "1"], "must be >= 2, got 1"),
                           (["--softmax-type", "off-by-one"], "invalid choice: 'off-by-one'")):
        with pytest.raises(SystemExit) as exc:
            main(["simulate", "1f1b", "--model", "gpt", *flags])
        assert exc.value.code == 2 and message in capsys.readouterr().err
    out = tmp_path / "plan.json"  # a plan's export types them again
    assert main(["plan", "--model", "gpt", "--hidden", "512", "--layers", "4", "--heads", "8", "--seq", "512",
                 "--vocab", "8000", "--batch", "8", "--dtype", "bfloat16", "--window-size", "63,0",
                 "--window-attn-skip-freq", "2", "--softmax-type", "learnable", "--attention", "flash", "--hardware",
                 "dgx-h100", "--gpus", "8", "--max-candidates", "3", "--top", "1", "--json", str(out)]) == 0
    command = json.loads(out.read_text())["winner"]["simulate_command"]
    assert "--softmax-type learnable --window-size 63,0 --window-attn-skip-freq 2" in command
