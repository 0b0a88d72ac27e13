"""`pipesim simulate --from-torchtitan JOB.toml` (pipesim/commands/torchtitan_import.py): a torchtitan job config
read as the flags it stands for, exactly; the plan's own torchtitan export simulates back to the plan's step; what
pipesim does not model refused in one line."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

import schedules
from pipesim.cli import main
from pipesim.commands.torchtitan_import import expand
from pipesim.errors import PipesimError
from pipesim.ir import torch_csv

# the shipped example: the keys of torchtitan v0.2.2's llama3_8b.toml with float8, compile and context parallelism
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torchtitan_llama3_8b.toml"


def _file(tmp_path, text: str, name: str = "job.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_job_config_reads_as_its_flags_exactly():
    path = str(EXAMPLE)
    # WORLD_SIZE from the hardware: 2 nodes of 8 GPUs; data_parallel_shard_degree -1 takes 16 / cp 2 = 8
    assert expand(["simulate", "--from-torchtitan", path, "--hardware", "dgx-h100", "--nodes", "2"]) == [
        "simulate", "1f1b", "--framework", "torchtitan", "--model-config", "llama3.1-8b", "--seq", "65536",
        "--dtype", "bfloat16", "--dp", "8", "--zero", "3", "--fsdp-reshard-after-forward", "default",
        "--cp", "2", "--cp-comm-type", "all_gather", "--batch", "8", "--stages", "1", "--microbatch-size", "1",
        "--recompute", "full", "--compile", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
        "--fp8-param-gather", "--fp8-impl", "torchao", "--hardware", "dgx-h100", "--nodes", "2"]
    # a schedule typed first replaces the file's; flags typed after the file come after its own, so they win
    argv = expand(["simulate", "zb-h1", f"--from-torchtitan={path}", "--cp", "4"])
    assert argv[:2] == ["simulate", "zb-h1"] and argv[-2:] == ["--cp", "4"]


def test_a_typed_degree_resizes_the_data_parallel_rest(tmp_path):
    """data_parallel_shard_degree -1 is what the degrees leave of WORLD_SIZE, the typed ones over the file's (as
    torchtitan's ParallelDims with a command-line override): 8 GPUs at tp 2 (typed) x cp 2 leave FSDP 2, and the typed
    tp brings apply_tp's sequence-parallel norms as the file's would."""
    argv = expand(["simulate", "--from-torchtitan", str(EXAMPLE), "--hardware", "dgx-h100", "--tp", "2"])
    assert argv[argv.index("--dp") + 1] == "2" and argv[argv.index("--batch") + 1] == "2"
    assert argv[argv.index("--tp") + 1:argv.index("--tp") + 3] == ["2", "--sequence-parallel"]
    out = tmp_path / "sim.json"
    assert main([*argv, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["parallel"]["dp"] == 2


def test_the_plans_torchtitan_export_simulates_back_to_the_plans_step(tmp_path):
    """`pipesim plan --framework torchtitan` exports a whole job config (the model's flavor, float8 in one [model]
    table); read back, it is the very run the plan timed (a pipeline of 16 uneven model parts, interleaved zero
    bubble, tp 4)."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--model-config", "llama3.1-70b", "--seq", "8192", "--batch", "32", "--hardware",
                 "dgx-h100", "--nodes", "2", "--framework", "torchtitan", "--fp8-format", "hybrid", "--fp8-recipe",
                 "tensorwise", "--top", "1", "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    winner = shlex.split(plan["winner"]["simulate_command"])
    assert winner[2] == "interleaved-zb" and "--virtual" in winner  # a pipeline with uneven parts, as below
    toml = plan["winner"]["torchtitan_toml"]
    assert toml.startswith('[model]\nname = "llama3"\nflavor = "70B"\nconverters = ["quantize.linear.float8"]\n\n')
    job = _file(tmp_path, toml)
    again = tmp_path / "again.json"
    assert main(["simulate", "--from-torchtitan", job, "--hardware", "dgx-h100", "--nodes", "2", "--json",
                 str(again)]) == 0
    assert json.loads(again.read_text())["step_time"] == plan["rows"][0]["step_time"]
    argv = expand(["simulate", "--from-torchtitan", job, "--hardware", "dgx-h100", "--nodes", "2"])
    assert argv[argv.index("--layer-split") + 1] == "5,6" + ",5" * 13 + ",4"  # the first and last part lighter
    # a model changed by a flag is no torchtitan flavor: the export leaves [model] out
    assert main(["plan", "--model-config", "llama3.1-8b", "--layers", "16", "--seq", "8192", "--batch", "16",
                 "--hardware", "dgx-h100", "--framework", "torchtitan", "--top", "1", "--json", str(out)]) == 0
    assert not json.loads(out.read_text())["winner"]["torchtitan_toml"].startswith("[model]")


@pytest.mark.parametrize("text, message", [
    ('[model]\nflavor = "8B"\n[bogus]\nx = 1', "unknown section [bogus]"),
    ('[model]\nflavor = "8B"\n[training]\nbogus = 1', "unknown key training.bogus"),
    ('[model]\nflavor = "8B_flex"', "torchtitan's llama3 8B_flex has no bundled config"),
    ('[model]\nflavor = 8', "model.flavor = 8 is not a string"),
    ('[model]\nflavor = "8B"\n[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4',
     "HSDP (data_parallel_replicate_degree 2 x shard 4) is not modelled"),
    ('[model]\nflavor = "8B"', "selective_ac_option = '2' (one layer in every 2 checkpointed) is not modelled"),
    ('[model]\nflavor = "8B"\n[activation_checkpoint]\nmode = "memory_budget"\nmemory_budget = 0.3',
     "activation_checkpoint.memory_budget = 0.3: the memory-budget policy is not modelled"),
    ('[model]\nflavor = "8B"\n[parallelism]\ntensor_parallel_degree = 3',
     "8 GPUs are not a multiple of replicate x tp x pp x cp = 3"),
    ('[model]\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nglobal_batch_size = 12',
     "global_batch_size 12 is not a multiple of local_batch_size x dp = 1 x 8"),
    ('[model]\nflavor = "8B"\nconverters = ["float8"]\n[activation_checkpoint]\nmode = "full"\n'
     '[quantize.linear.float8]\nrecipe_name = "rowwise_with_gw_hp"',
     "recipe_name 'rowwise_with_gw_hp': tensorwise or rowwise"),
    ('[model]\nflavor = "8B"\nconverters = ["quantize.grouped_mm.float8"]\n[activation_checkpoint]\nmode = "none"',
     "quantized grouped GEMMs"),
    ('[model]\nflavor = "8B"\n[training]\ndtype = "bfloat16"', "without float32 master weights is not modelled"),
    ('[model]\nflavor = "8B"\n[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "ZBV"',
     "pipeline_parallel_schedule 'ZBV': pipesim runs"),
    ('[model]\nflavor = "8B"\n[parallelism]\npipeline_parallel_degree = 2\nmodule_fqns_per_model_part = '
     '[["tok_embeddings", "layers.0"], ["layers.2", "norm", "output"]]', "part 1 holds layers [2]"),
    ("not toml [", "not valid TOML"),
    # torchtitan v0.1's spelling (llama3_8b.toml @ e7c0cae, June 2025): its split rule differs, so it is refused
    ('[model]\nflavor = "8B"\n[training]\ncompile = false\n[float8]\nfilter_fqns = ["output"]',
     "[float8] is torchtitan v0.1's spelling; pipesim reads v0.2's job_config.py keys"),
])
def test_what_pipesim_does_not_model_is_refused_in_one_line(tmp_path, capsys, text, message):
    path = _file(tmp_path, text)
    assert main(["simulate", "--from-torchtitan", path, "--hardware", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"pipesim: error: --from-torchtitan {path}: ") and message in err


def test_the_file_is_torchtitans(tmp_path):
    path = _file(tmp_path, '[model]\nflavor = "8B"')
    with pytest.raises(PipesimError, match="the file is torchtitan's; drop --framework"):
        expand(["simulate", "--from-torchtitan", path, "--framework", "nemo"])
    with pytest.raises(PipesimError, match="no such file"):
        expand(["simulate", "--from-torchtitan", str(tmp_path / "none.toml")])


def test_layers_per_stage_count_the_stages_as_pipeline_llm_does(tmp_path):
    """ceil((80 layers + the embedding's 1 + the head's 1) / 11) = 8 stages over pp 4: 2 per rank, split by the
    torchtitan weights; 9 layers per stage give 10 stages, which 4 ranks cannot take."""
    text = ('[model]\nflavor = "70B"\n[training]\nseq_len = 8192\nlocal_batch_size = 16\n[parallelism]\n'
            'tensor_parallel_degree = 4\npipeline_parallel_degree = 4\npipeline_parallel_schedule = "Interleaved1F1B"\n'
            'pipeline_parallel_layers_per_stage = {}\n[activation_checkpoint]\nmode = "full"\n')
    argv = expand(["simulate", "--from-torchtitan", _file(tmp_path, text.format(11)), "--hardware", "dgx-h100",
                   "--nodes", "2"])
    assert argv[1] == "interleaved-1f1b" and argv[argv.index("--virtual") + 1] == "2"
    assert argv[argv.index("--pipeline-parallel-first-stage-less-layers") + 1] == "1"
    assert argv[argv.index("--dp") + 1] == "1" and argv[argv.index("--zero") + 1] == "0"  # 16 / (tp 4 x pp 4)
    with pytest.raises(PipesimError, match="gives 10 stages, not a multiple of pipeline_parallel_degree 4"):
        expand(["simulate", "--from-torchtitan", _file(tmp_path, text.format(9)), "--hardware", "dgx-h100",
                "--nodes", "2"])


def test_plan_takes_the_files_job_and_searches_its_layout(tmp_path):
    """`pipesim plan --from-torchtitan`: the file's model, batch (torchtitan's local x dp on these 16 GPUs: 1 x 8),
    sequence and precision, exactly as typed; its layout (FSDP 8 x CP 2, full AC, 1F1B) is what the plan searches.
    The plan's command line takes the flag (a short search: the job, not the ranking, is under test)."""
    argv = expand(["plan", "--from-torchtitan", str(EXAMPLE), "--gpus", "16", "--hardware", "dgx-h100"])
    assert argv == ["plan", "--framework", "torchtitan", "--model-config", "llama3.1-8b", "--seq", "65536", "--dtype",
                    "bfloat16", "--batch", "8", "--compile", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
                    "--fp8-param-gather", "--fp8-impl", "torchao", "--gpus", "16", "--hardware", "dgx-h100"]
    searched = expand(["plan", "--from-torchtitan", str(EXAMPLE), "--gpus", "16", "--cp", "1,2"])  # plan's list
    assert searched[searched.index("--batch") + 1] == "8" and searched[-2:] == ["--cp", "1,2"]  # the file's batch
    out = tmp_path / "plan.json"
    assert main(["plan", "--from-torchtitan", str(EXAMPLE), "--gpus", "16", "--hardware", "dgx-h100",
                 "--max-candidates", "3", "--top", "1", "--json", str(out)]) == 0
    winner = json.loads(out.read_text())["winner"]["simulate_command"].split()
    for flag, value in (("--model-config", "llama3.1-8b"), ("--seq", "65536"), ("--batch", "8"),
                        ("--dtype", "bfloat16"), ("--fp8-format", "hybrid"), ("--fp8-recipe", "tensorwise"),
                        ("--fp8-impl", "torchao")):
        assert winner[winner.index(flag) + 1] == value, flag  # the file's job, planned
    assert "--fp8-param-gather" in winner


def test_a_schedule_csv_is_read_beside_the_file_and_a_typed_schedule_replaces_it(tmp_path):
    """pipeline_parallel_schedule_csv: the CSV beside the TOML, simulated as pipesim's zb-h1 (whose order it is);
    a schedule typed before --from-torchtitan replaces the CSV."""
    torch_csv.dump(schedules.build("zb-h1", 2, 4).compute_only(), tmp_path / "zb.csv")
    job = _file(tmp_path, '[model]\nflavor = "8B"\n[training]\nseq_len = 4096\nlocal_batch_size = 4\n'
                          '[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule_csv = "zb.csv"\n'
                          '[activation_checkpoint]\nmode = "full"\n')
    argv = expand(["simulate", "--from-torchtitan", job, "--hardware", "dgx-h100"])
    assert argv[1] == "--framework" and argv[argv.index("--from-csv") + 1] == str(tmp_path / "zb.csv")
    typed = expand(["simulate", "zb-h1", "--from-torchtitan", job, "--hardware", "dgx-h100"])
    assert typed[1] == "zb-h1" and "--from-csv" not in typed
    read, named = tmp_path / "read.json", tmp_path / "named.json"
    assert main([*argv, "--json", str(read)]) == 0 and main([*typed, "--json", str(named)]) == 0
    assert json.loads(read.read_text())["step_time"] == json.loads(named.read_text())["step_time"]
