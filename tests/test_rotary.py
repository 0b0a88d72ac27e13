"""RoPE's frequencies as a config.json defines them (pipesim.model.rotary) and as the executor turns q and k by them
(each scaling kind's closed form, the bundled files' values, what the executor refuses), and the norms' epsilon."""

from __future__ import annotations

import json
import math

import pytest
import torch

from executor.transformer import rope_of, rotate
from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig
from pipesim.model.executor_scope import unbuilt_structure
from pipesim.model.hf_config import model_from_hf, read_hf_config, resolve_model_config
from pipesim.model.rotary import Rotary, rotary_from_config


def _plain(theta: float, d: int) -> list[float]:
    return [theta ** (-2 * i / d) for i in range(d // 2)]


def test_plain_and_linear_rope():
    assert Rotary(theta=10_000).inverse_frequencies(4) == [1.0, 0.01]
    assert Rotary(scaling="linear", factor=4).inverse_frequencies(8) == [f / 4 for f in _plain(10_000, 8)]


def test_llama3_keeps_the_fast_pairs_divides_the_slow_ones_and_blends_between():
    """Llama 3.1's (theta 500,000, factor 8, low 1, high 4, 8,192 original positions) at head_dim 128: wavelengths
    under 8192 / 4 kept, over 8192 / 1 divided by 8, between them (1 - s) f / 8 + s f, s = (8192 / wavelength - 1)
    / 3."""
    rot = Rotary(theta=500_000, scaling="llama3", factor=8, low_freq_factor=1, high_freq_factor=4,
                 original_context=8192)
    regions = set()
    for f, g in zip(_plain(500_000, 128), rot.inverse_frequencies(128), strict=True):
        wavelength = 2 * math.pi / f
        if wavelength < 2048:
            regions.add("kept")
            assert g == f
        elif wavelength > 8192:
            regions.add("divided")
            assert g == f / 8
        else:
            regions.add("blended")
            s = (8192 / wavelength - 1) / 3
            assert g == (1 - s) * f / 8 + s * f and f / 8 < g < f
    assert regions == {"kept", "divided", "blended"}


@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_ramps_from_extrapolation_to_interpolation(truncate):
    """GPT-OSS's (theta 150,000, factor 32, beta 32 / 1, 4,096 original positions) at head_dim 64: the ramp runs from
    c(32) to c(1), c(r) = 64 ln(4096 / (2 pi r)) / (2 ln 150000) (about 8.09 and 17.40; floored and ceiled to 8 and
    18 with truncate); pairs below it keep f, above it f / 32, inside f / 32 x ramp + f x (1 - ramp)."""
    rot = Rotary(theta=150_000, scaling="yarn", factor=32, original_context=4096, truncate=truncate)
    c = [64 * math.log(4096 / (2 * math.pi * r)) / (2 * math.log(150_000)) for r in (32, 1)]
    low, high = (math.floor(c[0]), math.ceil(c[1])) if truncate else c
    assert 8 < c[0] < 8.1 and 17.3 < c[1] < 17.5
    out = rot.inverse_frequencies(64)
    for i, (f, g) in enumerate(zip(_plain(150_000, 64), out, strict=True)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        assert g == f / 32 * ramp + f * (1 - ramp)
    plain = _plain(150_000, 64)
    assert out[8] == plain[8] and out[9] < plain[9] and out[17] > plain[17] / 32 and out[18] == plain[18] / 32


def test_the_bundled_files_rope():
    def rotary(name: str) -> Rotary | None:
        return model_from_hf(read_hf_config(resolve_model_config(name)), where=name).rotary

    oss = rotary("gpt-oss-120b")
    assert (oss.theta, oss.scaling, oss.factor, oss.original_context, oss.truncate) == (150000, "yarn", 32, 4096, False)
    llama = rotary("llama3.1-8b")
    assert (llama.theta, llama.scaling, llama.factor, llama.original_context) == (500000, "llama3", 8, 8192)
    assert rotary("llama3-8b") == Rotary(theta=500000)  # Llama 3: no scaling
    assert rotary("nemotron4-15b") == Rotary(fraction=0.5)  # base 10,000, half of each head rotated


def test_a_model_config_keeps_its_rotary_through_json():
    model = model_from_hf(read_hf_config(resolve_model_config("gpt-oss-20b")), where="gpt-oss-20b")
    assert ModelConfig(**json.loads(json.dumps(model.to_dict()))) == model
    assert "rotary" not in ModelConfig(kind="gpt").to_dict()  # at its default: left out, older files read the same


def test_a_scaling_the_executor_does_not_build_is_kept_for_costs_and_refused_for_runs():
    cfg = json.loads(resolve_model_config("llama3-8b").read_text())
    cfg["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
    model = model_from_hf(cfg, where="dynamic.json")
    assert model.rotary.scaling == "dynamic"
    assert unbuilt_structure(model) == ["rotary scaling 'dynamic' (the executor builds linear, llama3, yarn)"]
    with pytest.raises(PipesimError, match="llama3 rotary scaling needs original_max_position_embeddings"):
        rotary_from_config({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "x.json")
    with pytest.raises(PipesimError, match="rotates 3 of a head's 6 features"):
        Rotary(fraction=0.5).rotated_width(6)


def test_the_executor_turns_by_the_files_frequencies_and_attention_factor():
    """Position t turns pair i by t x inverse frequency i; YaRN's attention factor scales cos and sin (position 0:
    x times it); a partial rotation passes the features after the rotated ones through."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 6, 8, generator=gen)  # float32: rotate computes in it
    yarn = ModelConfig(kind="gpt", hidden=16, heads=2, positions="rope", rope_mscale=1.5,
                       rotary=Rotary(theta=150_000, scaling="yarn", factor=32, original_context=4))
    rope = rope_of(yarn)
    assert rope == (tuple(yarn.rotary.inverse_frequencies(8)), 1.5)
    y = rotate(x, rope)
    torch.testing.assert_close(y[..., 0, :], 1.5 * x[..., 0, :])
    t, i = 5, 3  # pair 3: features 3 and 7
    angle = t * torch.tensor(rope[0][i], dtype=torch.float32).item()
    a, b = x[0, 0, t, i], x[0, 0, t, i + 4]
    torch.testing.assert_close(y[0, 0, t, [i, i + 4]], 1.5 * torch.stack([a * math.cos(angle) - b * math.sin(angle),
                                                                        b * math.cos(angle) + a * math.sin(angle)]))
    half = ModelConfig(kind="gpt", hidden=16, heads=2, positions="rope", rotary=Rotary(fraction=0.5))
    z = rotate(x, rope_of(half))
    torch.testing.assert_close(z[..., 4:], x[..., 4:], rtol=0, atol=0)
    torch.testing.assert_close(z[..., :4], rotate(x[..., :4]), rtol=0, atol=0)


def test_the_files_norm_epsilon_reaches_the_executors_norms():
    """Qwen3's rms_norm_eps 1e-6, Nemotron's norm_eps 1e-5: every norm the executor builds for the block takes it."""
    from executor.transformer import Block

    def model(name: str) -> ModelConfig:
        return model_from_hf(read_hf_config(resolve_model_config(name)), where=name)

    assert (model("qwen3-30b-a3b").norm_eps, model("nemotron4-15b").norm_eps) == (1e-6, 1e-5)
    small = ModelConfig(kind="gpt", hidden=16, heads=4, norm="rmsnorm", qk_norm=True, norm_eps=1e-6)
    block = Block(small, 0)
    assert [n.eps for n in (block.ln1, block.ln2, block.q_norm, block.k_norm)] == [1e-6] * 4
    assert "norm_eps" not in ModelConfig(kind="gpt").to_dict()


def _flags_model(*flags: str) -> ModelConfig:
    from pipesim.cli import build_parser
    from pipesim.commands.common import model_config

    return model_config(build_parser().parse_args(["simulate", "1f1b", *flags]))


GPT_ROPE = ("--model", "gpt", "--hidden", "256", "--heads", "2", "--layers", "2", "--position-embedding-type", "rope")


def test_megatrons_rotary_flags_build_what_megatrons_rotary_embedding_computes():
    """--rotary-base theta, --rotary-percent the rotated share, --use-rope-scaling Llama 3.x's scaling with Megatron's
    low 1, high 4 and original context 8192 (rotary_pos_embedding.py `_apply_scaling`, its factor
    --rope-scaling-factor, 8 unless given), --rotary-seq-len-interpolation-factor positions / N: the same angles."""
    model = _flags_model(*GPT_ROPE, "--rotary-base", "500000", "--rotary-percent", "0.5", "--use-rope-scaling",
                         "--rope-scaling-factor", "4")
    assert model.rotary == Rotary(theta=500_000, scaling="llama3", factor=4, low_freq_factor=1, high_freq_factor=4,
                                  original_context=8192, fraction=0.5)
    d = model.rotary.rotated_width(model.head_dim)  # half of 128
    assert d == 64
    plain = torch.tensor(_plain(500_000, d), dtype=torch.float64)  # Megatron's _apply_scaling, written out
    wavelength = 2 * math.pi / plain
    scaled = torch.where(wavelength > 8192 / 1, plain / 4, plain)
    smooth = (8192 / wavelength - 1) / (4 - 1)
    blended = (1 - smooth) * scaled / 4 + smooth * scaled
    medium = (wavelength >= 8192 / 4) & (wavelength <= 8192 / 1)
    expected = torch.where(medium, blended, scaled)
    torch.testing.assert_close(torch.tensor(rope_of(model)[0], dtype=torch.float64), expected, rtol=1e-12, atol=0)
    assert _flags_model(*GPT_ROPE, "--use-rope-scaling").rotary.factor == 8  # Megatron's default factor
    linear = _flags_model(*GPT_ROPE, "--rotary-seq-len-interpolation-factor", "4").rotary
    assert linear.inverse_frequencies(128) == pytest.approx([f / 4 for f in _plain(10_000, 128)], rel=1e-15)
    assert _flags_model(*GPT_ROPE, "--rotary-base", "10000").rotary is None  # Megatron's default: plain RoPE
    assert _flags_model(*GPT_ROPE, "--norm-epsilon", "1e-6").norm_eps == 1e-6


def test_the_rotary_flags_override_a_files_rotary_embedding():
    """llama3.1-8b's file: theta 500,000 with llama3 scaling of factor 8; --rotary-base replaces the base only,
    --rotary-seq-len-interpolation-factor the scaling, typed learned positions drop the file's rotary."""
    file = _flags_model("--model-config", "llama3.1-8b").rotary
    assert (file.theta, file.scaling, file.factor) == (500_000, "llama3", 8)
    based = _flags_model("--model-config", "llama3.1-8b", "--rotary-base", "1000000").rotary
    assert based == Rotary(**{**file.__dict__, "theta": 1_000_000})
    linear = _flags_model("--model-config", "llama3.1-8b", "--rotary-seq-len-interpolation-factor", "2").rotary
    assert (linear.theta, linear.scaling, linear.factor) == (500_000, "linear", 2)


@pytest.mark.parametrize("flags, line", [
    (["--model", "gpt", "--rotary-base", "500000"],
     "--rotary-base sets the rotary embedding: it needs rope positions (--position-embedding-type rope)"),
    ([*GPT_ROPE, "--rope-scaling-factor", "4"],
     "--rope-scaling-factor is --use-rope-scaling's factor: give --use-rope-scaling"),
    ([*GPT_ROPE, "--use-rope-scaling", "--rotary-seq-len-interpolation-factor", "2"],
     "--use-rope-scaling and --rotary-seq-len-interpolation-factor scale RoPE two ways at once; pipesim builds one "
     "scaling: give one"),
    ([*GPT_ROPE, "--rotary-percent", "0.15"],
     "a rotary share of 0.15 (--rotary-percent; config.json's partial_rotary_factor) rotates 19 of a head's 128 "
     "features: rotary embeddings pair an even number of them"),
    (["--model", "mlp", "--rotary-base", "500000"],
     "--rotary-base needs a transformer (--model gpt or --model-config)"),
])
def test_a_rotary_flag_that_cannot_act_is_refused_in_one_line(capsys, flags, line):
    from pipesim.cli import main

    assert main(["simulate", "1f1b", "--stages", "2", *flags]) == 2
    assert capsys.readouterr().err == f"pipesim: error: {line}\n"


def test_megatrons_rotary_flags_reach_the_import_and_a_plans_export(tmp_path):
    """--from-megatron passes the rotary flags with rope positions (Megatron reads none of them with learned ones); a
    plan's exported commands type them again."""
    from pipesim.cli import main
    from pipesim.commands.megatron_import import expand

    base = ("--num-layers 2 --hidden-size 256 --num-attention-heads 2 --seq-length 512 --max-position-embeddings 512 "
            "--micro-batch-size 1 --vocab-size 1024 --rotary-base 500000 --use-rope-scaling --rope-scaling-factor 4 "
            "--rotary-percent 0.5 --norm-epsilon 1e-6 ")
    for positions, passed in (("--position-embedding-type rope", True), ("", False)):
        path = tmp_path / "run.sh"
        path.write_text(base + positions + "\n")
        argv = expand(["simulate", "--from-megatron", str(path), "--hardware", "dgx-h100"])
        rotary = ["--rotary-base", "500000", "--rotary-percent", "0.5", "--use-rope-scaling", "--rope-scaling-factor",
                  "4"]
        assert any(argv[i:i + len(rotary)] == rotary for i in range(len(argv))) is passed
        assert argv[argv.index("--norm-epsilon") + 1] == "1e-6"
    out = tmp_path / "plan.json"
    assert main(["plan", *GPT_ROPE, "--seq", "512", "--vocab", "8000", "--batch", "8", "--dtype", "bfloat16",
                 "--rotary-base", "500000.0", "--use-rope-scaling", "--norm-epsilon", "1e-06", "--hardware",
                 "dgx-h100", "--gpus", "8", "--max-candidates", "3", "--top", "1", "--json", str(out)]) == 0
    winner = json.loads(out.read_text())["winner"]
    assert "--norm-epsilon 1e-06 --rotary-base 500000.0 --use-rope-scaling" in winner["simulate_command"]
    assert "--rotary-base 500000.0 --use-rope-scaling" in winner["run_command"]
