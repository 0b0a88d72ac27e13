"""`--model MODULE:FACTORY` (pipesim.cost.user_model_costs, executor.user_model): the factory's errors up front, FLOP
counting on meta (exact closed forms), the cost table from the counts, and `pipesim run` of the examples
matching the single-process reference."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from executor.user_model import call_factory, count_piece, count_user_model, train_single, workload_from_parts
from pipesim.cost.stage_work import stage_work
from pipesim.errors import PipesimError
from pipesim.model.config import ModelConfig

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def bad_factories(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("factories") / "bad.py"
    path.write_text("import torch\n"
                    "def number():\n    return 3\n"
                    "def raises():\n    raise ValueError('no weights here')\n"
                    "def strings():\n    return {'layers': ['a'], 'example_input': torch.zeros(2, 3)}\n"
                    "def wrong_keys():\n    return {'layer': [], 'example_input': torch.zeros(2, 3)}\n"
                    "def mismatch():\n    return {'layers': [torch.nn.Linear(3, 4), torch.nn.Linear(5, 2)],"
                    " 'example_input': torch.zeros(2, 3)}\n"
                    "NOT_CALLABLE = 3\n")
    return path


@pytest.mark.parametrize("spec, message", [
    ("nosuch_pkg.models:make", "--model nosuch_pkg.models:make: no module named 'nosuch_pkg'"),
    ("examples/conv_net.py:nothere", "--model examples/conv_net.py:nothere: examples/conv_net.py has no attribute "
                                     "'nothere'"),
    ("examples/missing.py:make", "--model examples/missing.py:make: no such file examples/missing.py"),
    ("examples.conv_net:", "--model examples.conv_net:: expected MODULE:FACTORY"),
    ("{bad}:number", "the factory returned a int; expected pipesim.cost.user_model_costs.ModelParts"),
    ("{bad}:raises", "the factory raised ValueError: no weights here"),
    ("{bad}:strings", "layers must be a non-empty list of torch.nn.Module"),
    ("{bad}:wrong_keys", "the factory's dict needs keys layers and example_input"),
    ("{bad}:NOT_CALLABLE", "NOT_CALLABLE is a int, not a function"),
    ("{bad}:mismatch", "shape inference: stage 0 on an input of shape [1, 3] raised RuntimeError: mat1 and mat2 "
                       "shapes cannot be multiplied"),  # found up front
])
def test_a_bad_factory_is_one_line_and_exit_2_before_anything_starts(spec, message, bad_factories, capsys):
    """In process (pipesim.cli.main, torch already loaded: fast); a launch would print its `starting` line."""
    from pipesim.cli import main

    spec = spec.format(bad=bad_factories)
    assert main(["run", "1f1b", "--nproc", "2", "--microbatches", "2", "--batch", "4", "--model", spec]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesim: error: ") and message in lines[0], err
    assert not out  # nothing launched


def test_a_missing_module_is_refused_by_the_command_line_too(monkeypatch, capsys):
    """`python -m pipesim ...` (its __main__, sys.exit and all), run in this process: torch is already loaded."""
    monkeypatch.setattr(sys, "argv", ["pipesim", "run", "1f1b", "--nproc", "2", "--model", "nosuch_pkg.models:make"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("pipesim", run_name="__main__")
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err == ("pipesim: error: --model nosuch_pkg.models:make: no module named "
                                              "'nosuch_pkg'\n"), err


@pytest.mark.parametrize("flags, message", [
    (["--tp", "2"], "--tp needs pipesim's own --model mlp or gpt"),
    (["--hidden", "64"], "--hidden sizes pipesim's own models"),
    (["--layer-split", "5,4"], "layer split [5, 4] must have 2 entries of 0 or more layers summing to the model's 8"),
])
def test_flags_that_do_not_apply_to_a_factory_are_refused(flags, message, capsys):
    from pipesim.cli import main

    argv = ["run", "1f1b", "--nproc", "2", "--microbatches", "2", "--model", "examples/conv_net.py:make", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_other_commands_refuse_a_factory_in_one_line(capsys):
    from pipesim.cli import main

    assert main(["sweep", "--schedules", "1f1b", "--model", "examples/conv_net.py:make", "--stages", "2"]) == 2
    err = capsys.readouterr().err
    assert "a model factory is read by `pipesim run` and `pipesim simulate`" in err and len(err.splitlines()) == 1


def test_linear_flops_split_into_input_and_weight_gradients_exactly():
    """Linear(a, b) on r rows: F = I = W = 2 r a b; with an input that needs no gradient, I = 0 and W = 2 r a b."""
    r, a, b = 6, 5, 7
    lin = nn.Linear(a, b, device="meta")
    counts, out = count_piece(lin, torch.empty(r, a, device="meta", requires_grad=True))
    assert counts.flops == (2 * r * a * b,) * 3 and counts.split_measured
    assert counts.param_count == a * b + b and counts.output_bytes == r * b * 4 and out.shape == (r, b)
    assert counts.activation_bytes == r * a * 4  # the input is saved; the weight (a parameter) is not counted
    first, _ = count_piece(lin, torch.empty(r, a, device="meta"))
    assert first.flops == (2 * r * a * b, 0.0, 2 * r * a * b)


class _NoMetaBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        return x @ w

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError("no meta kernel for this backward")


class _Opaque(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(4, 3, device="meta"))

    def forward(self, x):
        return _NoMetaBackward.apply(x, self.w)


def test_a_backward_that_cannot_run_on_meta_takes_the_one_to_one_rule():
    counts, _ = count_piece(_Opaque(), torch.empty(2, 4, device="meta", requires_grad=True))
    assert not counts.split_measured
    assert counts.flops == (2 * 2 * 4 * 3,) * 3  # I = W = F


def test_the_lecture_mlp_as_a_factory_counts_pipesims_own_flops():
    """examples/lecture_mlp.py builds pipesim's MLP layers: the counted F, I and W FLOPs of every stage equal
    the cost model's closed forms (2 b h^2 each; the first stage's first layer has no input gradient)."""
    counted = count_user_model("examples/lecture_mlp.py:make", batch=64, microbatches=8)
    ours = stage_work(ModelConfig(kind="mlp", hidden=1024, layers=8, batch=64), 2, 8)
    assert [w[0] for w in counted.stage_work(2)] == [w[0] for w in ours]
    assert counted.microbatch_rows == 8 and counted.dtype == "float32"


def test_simulate_costs_a_factory_model_on_the_given_hardware(monkeypatch, capsys):
    from pipesim.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["simulate", "1f1b", "-p", "2", "-m", "4", "--batch", "16", "--model", "examples/conv_net.py:make",
                 "--layer-split", "5,3", "--hardware", "local-cpu", "--json"]) == 0
    out, err = capsys.readouterr()
    assert not err, err
    data = json.loads(out)
    assert data["schedule"]["stages"] == 2 and data["makespan"] > 0
    counted = count_user_model("examples/conv_net.py:make", batch=16, microbatches=4)
    sums = counted.stage_sums(2, [5, 3])
    assert sums[0]["boundary"] == 4 * 16 * 8 * 8 * 4  # 4 rows of 16 x 8 x 8 float32 after the fifth layer
    assert sums[1]["layers"] == 3 and sums[1]["params"] == sum(p.numel() for m in
                                                                 call_factory("examples/conv_net.py:make").layers[5:]
                                                                 for p in m.parameters()) + 8 * 10 + 10


def test_simulate_keeps_torch_out_of_its_start_up_without_a_factory():
    code = ("import sys; from pipesim.cli import main; main(['simulate', '1f1b', '--cost', 'F=1,B=2', '--json', "
            "'-']); print('torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr.strip().splitlines()[-1] == "False", proc.stderr


def test_pipesim_run_trains_the_examples_like_the_reference(tmp_path, monkeypatch, capsys):
    """conv net (FILE.py:FACTORY, --layer-split) then the widths model (MODULE:FACTORY) in one torchrun launch;
    `pipesim run` itself in this process (torch is loaded already), its ranks under a real torchrun."""
    from pipesim.cli import main

    monkeypatch.chdir(ROOT)
    conv, widths = tmp_path / "conv.json", tmp_path / "widths.json"
    code = main(["run", "1f1b", "--nproc", "2", "--microbatches", "4", "--batch", "8", "--steps", "2", "--quiet",
                 "--model", "examples/conv_net.py:make", "--layer-split", "5,3", "--lr", "0.05", "--json", str(conv),
                 "--then", "zb-h1", "--microbatches", "4", "--batch", "8", "--steps", "2", "--quiet",
                 "--model", "examples.widths:make", "--lr", "0.05", "--json", str(widths)])
    assert code == 0, capsys.readouterr().err[-3000:]
    for path, spec, split in ((conv, "examples/conv_net.py:make", [5, 3]), (widths, "examples.widths:make", [4, 4])):
        result = json.loads(path.read_text())
        assert result["model"] == {"factory": spec, "batch": 8} and result["layers_per_stage"] == split
        work = workload_from_parts(call_factory(spec, 0), batch=8, seed=0, split=None)
        ref_losses, _ = train_single(work, 2, lr=0.05)
        assert result["losses"] == pytest.approx(ref_losses, rel=1e-5)


def test_a_factory_needs_example_input():
    parts_spec = "examples/conv_net.py:make"
    parts = call_factory(parts_spec)
    assert parts.example_input.shape == (4, 3, 8, 8)
    with pytest.raises(PipesimError, match="needs example_target"):
        workload_from_parts(type(parts)(parts.layers, parts.example_input, loss=parts.loss), batch=8, seed=0,
                            split=None)
