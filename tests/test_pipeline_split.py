"""The stacks' layer splits (pipesim/model/pipeline_split.py): Megatron-core's account-for and first / last rank
counts, torchtitan's weighted split, exact against their sources' rules; the flags through simulate and plan."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest
import tomllib

import schedules
from pipesim.cli import build_parser, main
from pipesim.commands.run_args import config_from_args
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.model.config import ModelConfig
from pipesim.model.hf_config import model_from_hf, read_hf_config, resolve_model_config
from pipesim.model.megatron_layout import MAX_LETTERS, layout_split, megatron_layout, parse_layout
from pipesim.model.pipeline_split import (
    BalancedSplit,
    SplitRule,
    account_split,
    balanced_split,
    rank_split,
    torchtitan_fqns,
    torchtitan_split,
)
from pipesim.plan.balance import balanced_rule
from pipesim.plan.exports import megatron_args, run_command
from pipesim.plan.space import PlanRequest, enumerate_candidates
from pipesim.plan.torchtitan_export import torchtitan_toml

SMALL = ["--model", "gpt", "--dtype", "bfloat16", "--hidden", "512", "--layers", "14", "--heads", "8", "--seq", "512",
         "--vocab", "32000", "--batch", "8", "--microbatch-size", "1", "--hardware", "dgx-h100"]


def _sim(tmp_path, name: str, *argv: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["simulate", *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_megatron_account_for_split_is_the_recipes_one():
    # Llama 3.1 405B's 126 layers + embedding + loss over 8 x 8 chunks: NeMo's 405B recipe (source DGXC25)
    assert account_split(126, 64, embedding=True, loss=True) == [1] + [2] * 62 + [1]
    assert account_split(15, 4, embedding=True, loss=False) == [3, 4, 4, 4]
    assert account_split(15, 4, embedding=False, loss=True) == [4, 4, 4, 3]
    assert account_split(32, 1, embedding=True, loss=True) == [32]
    with pytest.raises(PipesimError, match="do not split evenly over 4 pipeline chunks"):
        account_split(32, 4, embedding=True, loss=True)


def test_megatron_rank_counts_follow_the_interleaved_placement():
    looped = tuple(s % 4 for s in range(8))  # p 4, v 2: stage s on rank s mod 4
    assert rank_split(32, looped, 6, 6) == [3, 5, 5, 3, 3, 5, 5, 3]
    assert rank_split(32, (0, 1, 2, 3), None, 2) == [10, 10, 10, 2]
    assert rank_split(16, (0, 1), 6, 10) == [6, 10]
    with pytest.raises(PipesimError, match="32 layers less 3 on the last rank leave 29 for 3 other rank"):
        rank_split(32, (0, 1, 2, 3), None, 3)
    with pytest.raises(PipesimError, match="rank 1's 9 layers do not split over its 2 chunks"):
        rank_split(32, looped, 4, 10)
    v_shape = schedules.build("zb-v", 4, 8).placement
    with pytest.raises(PipesimError, match="this schedule places its stages otherwise"):
        rank_split(32, v_shape, None, 2)


def test_torchtitan_split_is_generate_llm_fqn_per_model_parts():
    # its docstring's example: 3 layers over 2 stages, the embedding and the output weighing 2 layers each
    assert torchtitan_split(3, 2, 2, 2) == [2, 1]
    # v0.2.2's default weights (1, 1): 34 effective layers over 8 stages, 4 each and the 2 left to the first two
    assert torchtitan_split(32, 8, 1, 1) == [4, 5, 4, 4, 4, 4, 4, 3]
    assert torchtitan_split(32, 4, 1, 1) == [8, 9, 8, 7]
    assert torchtitan_split(32, 1, 1, 1) == [32]
    with pytest.raises(PipesimError, match="9 pipeline stages exceed torchtitan's 8 effective layers"):
        torchtitan_split(6, 9, 1, 1)
    with pytest.raises(PipesimError, match="exceed the 2 layers per stage of 4 stages"):
        torchtitan_split(6, 4, 3, 0)
    assert torchtitan_fqns([1, 2, 1]) == [["tok_embeddings", "layers.0"], ["layers.1", "layers.2"],
                                          ["layers.3", "norm", "output"]]


def test_megatron_layout_strings_parse_as_megatron_parses_them():
    # parse_str_to_list's docstring example: "Ettt|(tt|)*29,m|L" is [E t t t] + [t t] x 29 + [m] + [L]
    assert parse_layout("Ettt|(tt|)*29,m|L") == ["Ettt"] + ["tt"] * 29 + ["m", "L"]
    with pytest.raises(PipesimError, match="a standalone MTP stage is not modelled"):
        layout_split("Ettt|(tt|)*29,m|L", 61, 32, mtp_layers=1)
    # Megatron-Bridge @ 067f987df recipes/deepseek/h100/deepseek_v3.py, PP 16: the embedding with 4 layers, 14
    # stages of 4, the last layer with the MTP module and the loss (the split bench rows give as 4 x 15, 1)
    assert layout_split("Et*4|(t*4|)*14tmL", 61, 16, mtp_layers=1) == [4] * 15 + [1]
    assert layout_split("E|t*3|t*3|t*2L", 8, 4) == [0, 3, 3, 2]
    for bad, message in (("Et*4|t*4", "the embedding E must come first and the loss L last"),
                         ("|Et*4|t*4L", "an empty stage before E or after L is not modelled"),
                         ("Et*4|t*3L", "holds 7 decoder and 0 MTP layers; the model has 8 and 0"),
                         ("Et*4|mt*4L", "decoder layers must come before the MTP layers"),
                         ("Et*4|t*4q", "unknown layer letter 'q'")):
        with pytest.raises(PipesimError, match=message):
            layout_split(bad, 8, len(parse_layout(bad)) if "q" not in bad else 2, mtp_layers=1 if "m" in bad else 0)
    with pytest.raises(PipesimError, match="has 2 stages; the schedule has 4"):
        layout_split("Et*4|t*4L", 8, 4)
    # repeat counts are unrolled only up to a bound: no overflow, no gigabyte string, no int() of 5,000 digits
    assert parse_layout(f"Et*{MAX_LETTERS - 2}L") == ["E" + "t" * (MAX_LETTERS - 2) + "L"]
    for huge in (f"Et*{MAX_LETTERS - 1}L", "Et*100000000000000000000|L", "(Et*100000|)*100000L",
                 "Et*" + "9" * 5000 + "L"):
        with pytest.raises(PipesimError, match="unrolls to more than 1,048,576 letters"):
            parse_layout(huge)
    with pytest.raises(PipesimError, match="cannot go with the other pipeline layout flags"):
        SplitRule(layout="Et*4|t*4L", account_loss=True)


def test_one_stack_at_a_time_and_their_flags():
    rule = SplitRule(account_embedding=True, account_loss=True)
    assert rule.flags() == ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    assert rule.report() == {"account_for_embedding_in_pipeline_split": True,
                             "account_for_loss_in_pipeline_split": True}
    assert not SplitRule() and SplitRule().split(32, 4) is None
    assert SplitRule(first_less=1, last_less=1).flags() == ["--pipeline-parallel-first-stage-less-layers", "1",
                                                            "--pipeline-parallel-last-stage-less-layers", "1"]
    with pytest.raises(PipesimError, match="cannot go with --account-for-embedding"):
        SplitRule(account_embedding=True, last_layers=2)
    with pytest.raises(PipesimError, match="give one stack's"):
        SplitRule(account_loss=True, first_less=1)


def test_the_flags_simulate_exactly_their_explicit_split(tmp_path):
    layout = ["--stages", "2", "--virtual", "2", "--dp", "1"]
    flags = _sim(tmp_path, "flags", "interleaved-1f1b", *SMALL, *layout,
                 "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
    typed = _sim(tmp_path, "typed", "interleaved-1f1b", *SMALL, *layout, "--layer-split", "3,4,4,3")
    even = _sim(tmp_path, "even", "interleaved-1f1b", *SMALL, *layout)
    assert flags["step_time"] == typed["step_time"] != even["step_time"]
    assert flags["options"]["account_for_loss_in_pipeline_split"] is True
    layout = _sim(tmp_path, "layout", "interleaved-1f1b", *SMALL, *layout,
                  "--pipeline-model-parallel-layout", "Et*3|t*4|t*4|t*3L")
    assert layout["step_time"] == typed["step_time"]
    assert layout["options"]["pipeline_model_parallel_layout"] == "Et*3|t*4|t*4|t*3L"
    last = _sim(tmp_path, "last", "1f1b", *SMALL, "--stages", "2", "--decoder-last-pipeline-num-layers", "5")
    assert last["step_time"] == _sim(tmp_path, "last_typed", "1f1b", *SMALL, "--stages", "2",
                                     "--layer-split", "9,5")["step_time"]


def test_torchtitan_profile_takes_its_split(tmp_path):
    layout = ["--stages", "4", "--dp", "1"]
    titan = _sim(tmp_path, "titan", "1f1b", *SMALL, *layout, "--framework", "torchtitan")
    typed = _sim(tmp_path, "typed", "1f1b", *SMALL, *layout, "--framework", "torchtitan", "--layer-split", "3,4,4,3")
    assert titan["step_time"] == typed["step_time"]  # 14 + 2 over 4: 4 each, less one at either end
    assert titan["options"]["pipeline_parallel_first_stage_less_layers"] == 1
    unweighted = _sim(tmp_path, "unweighted", "1f1b", *SMALL, *layout, "--framework", "torchtitan",
                      "--pipeline-parallel-first-stage-less-layers", "0",
                      "--pipeline-parallel-last-stage-less-layers", "0")
    even = _sim(tmp_path, "even", "1f1b", *SMALL, *layout, "--framework", "torchtitan", "--layer-split", "4,4,3,3")
    assert unweighted["step_time"] == even["step_time"] != titan["step_time"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--layer-split", "7,7", "--decoder-last-pipeline-num-layers", "5"],
     "--layer-split gives every stage's layers: it cannot go with --decoder-last-pipeline-num-layers"),
    (["--framework", "torchtitan", "--account-for-loss-in-pipeline-split"],
     "--framework torchtitan splits the layers by torchtitan's weights"),
    (["--account-for-embedding-in-pipeline-split"], "do not split evenly over 2 pipeline chunks"),
])
def test_refusals_are_one_line(capsys, argv, message):
    assert main(["simulate", "1f1b", *SMALL, "--stages", "2", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_a_split_flag_needs_a_transformer(capsys):
    assert main(["simulate", "1f1b", "--stages", "2", "--decoder-last-pipeline-num-layers", "2"]) == 2
    assert "needs --model gpt, moe or a --model-config" in capsys.readouterr().err


def test_plan_applies_and_exports_the_rule(tmp_path, capsys):
    out = tmp_path / "plan.json"
    base = ["plan", "--model", "gpt", "--hidden", "512", "--layers", "14", "--heads", "8", "--seq", "512",
            "--vocab", "32000", "--batch", "16", "--dtype", "bfloat16", "--hardware", "dgx-h100", "--gpus", "4",
            "--top", "3", "--schedules", "1f1b,interleaved-1f1b"]
    assert main([*base, "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    argv = shlex.split(data["winner"]["simulate_command"])
    assert "--account-for-embedding-in-pipeline-split" in argv and "--account-for-loss-in-pipeline-split" in argv
    again = tmp_path / "again.json"
    assert main([*argv[1:], "--json", str(again)]) == 0  # the exported command re-simulates to the plan's step
    assert json.loads(again.read_text())["step_time"] == data["rows"][0]["step_time"]
    assert data["counts"]["refused_by_model"] > 0  # the p x v that 14 + 2 slots do not divide
    assert main([*base, "--decoder-last-pipeline-num-layers", "2"]) == 2
    assert "fix one layout's layers" in capsys.readouterr().err


def test_torchtitan_export_names_the_simulated_stages():
    req = PlanRequest(ModelConfig(kind="gpt", hidden=1024, layers=16, heads=16, seq=1024, vocab=32000, batch=16,
                                  dtype="bfloat16"), load_hardware("dgx-h100"), 8, ("interleaved-1f1b",))
    c = next(c for c in enumerate_candidates(req) if c.v == 2 and c.p == 2)
    toml = tomllib.loads(torchtitan_toml(c, req))["parallelism"]
    assert toml["module_fqns_per_model_part"] == torchtitan_fqns([4, 4, 4, 4])
    assert "pipeline_parallel_layers_per_stage" not in toml
    titan = replace(req, split_rule=SplitRule(first_less=1, last_less=1))
    toml = tomllib.loads(torchtitan_toml(c, titan))["parallelism"]
    assert toml["module_fqns_per_model_part"] == torchtitan_fqns([4, 5, 4, 3])


def test_a_split_megatrons_flags_cannot_give_is_exported_as_its_layout():
    assert megatron_layout([4] * 15 + [1], 1) == "Et*4|(t*4|)*14tmL"  # Megatron-Bridge's DeepSeek-V3, PP 16
    for split in ([1] + [2] * 62 + [1], [3, 4, 4, 3], [5, 5, 5, 5, 4, 4, 4], [0, 3, 3, 2], [7], [2, 1]):
        assert layout_split(megatron_layout(split), sum(split), len(split)) == split
    model = ModelConfig(kind="gpt", hidden=1024, layers=14, heads=16, seq=1024, vocab=32000, batch=16,
                        dtype="bfloat16")
    req = PlanRequest(model, load_hardware("dgx-h100"), 8, ("interleaved-1f1b",))
    c = next(c for c in enumerate_candidates(req) if c.v == 2 and c.p == 2)  # 14 layers over 4 chunks: 4, 4, 3, 3
    args = megatron_args(c, req)
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "'Et*4|t*4|t*3|t*3L'"  # quoted for the shell
    assert "--num-layers-per-virtual-pipeline-stage" not in args  # the layout gives the chunks per rank
    legacy = megatron_args(c, replace(req, framework="megatron-lm-2021"))
    assert "--pipeline-model-parallel-layout" not in legacy and legacy[0].startswith("# 14 layers over 4 chunks")
    titan = megatron_args(c, replace(req, split_rule=SplitRule(first_less=1, last_less=1)))
    assert titan[titan.index("--pipeline-model-parallel-layout") + 1] == "'Et*3|(t*4|)*2t*3L'"
    # and `pipesim run` trains the stages simulated: the split is typed out where the rule moved it
    run = run_command(c, ["--model", "gpt"], per_node=8, nodes=1, split=[3, 4, 4, 3])
    assert run[run.index("--layer-split") + 1] == "3,4,4,3"
    assert "--layer-split" not in run_command(c, ["--model", "gpt"], per_node=8, nodes=1, split=[4, 4, 3, 3])


def test_balanced_split_minimises_the_busiest_stage():
    # 32 layers, 4 stages, the head weighing 2.4 layers: total load 34.4, so some stage carries 9 at least (eight
    # each and 6 on the last hold 30 only); the surplus leaves the later of the busiest stages first
    assert balanced_split(32, 4, 0.0, 2.4) == [9, 9, 8, 6]
    assert balanced_split(32, 4, 0.0, 0.0) == [8, 8, 8, 8]
    assert balanced_split(80, 8, 0.0, 1.2) == [11] + [10] * 6 + [9]
    assert balanced_split(5, 4, 0.0, 3.0) == [2, 2, 1, 0]
    assert balanced_split(32, 7, 0.0, 2.4) == [5, 5, 5, 5, 5, 5, 2]
    for layers, stages, first, last in ((32, 4, 0.0, 2.4), (126, 16, 0.0, 0.65), (61, 16, 0.5, 1.5), (7, 3, 1.0, 1.0)):
        split = balanced_split(layers, stages, first, last)
        load = max(n + (first if i == 0 else 0) + (last if i == stages - 1 else 0) for i, n in enumerate(split))
        assert sum(split) == layers and min(split) >= 0
        assert load - 1 < (layers + first + last) / stages <= load  # within a layer of the mean: no better cut
    rule = BalancedSplit(0.0, 2.4)
    assert rule and not rule.megatron and not rule.fixes_stages and rule.flags() == []


def test_the_balanced_split_of_deepseek_v3_is_megatron_bridges_own_layout():
    # the last stage carries the head and the MTP module (a projection, a block, a pass through the head): 3.5
    # layers; over 16 stages that is Megatron-Bridge's hand-made PP 16 layout, "Et*4|(t*4|)*14tmL" (067f987df)
    dsv3 = model_from_hf(read_hf_config(resolve_model_config("deepseek-v3")), where="deepseek-v3", seq=4096)
    rule = balanced_rule(dsv3)
    assert 3.4 < rule.last_weight < 3.6 and rule.first_weight == 0.0
    assert megatron_layout(rule.split(61, 16), 1) == "Et*4|(t*4|)*14tmL"


def test_plan_balance_layers_exports_the_split_it_simulated(tmp_path, capsys):
    base = ["plan", "--model-config", "llama3-8b", "--seq", "2048", "--batch", "16", "--hardware", "dgx-h100",
            "--gpus", "4", "--top", "3", "--schedules", "1f1b", "--max-tp", "1", "--zero", "0"]
    out = tmp_path / "plan.json"
    assert main([*base, "--balance-layers", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    best = data["rows"][0]
    argv = shlex.split(data["winner"]["simulate_command"])
    assert best["pp"] == 4  # Llama 3 8B on 4 GPUs without tp or ZeRO: a pipeline
    llama = model_from_hf(read_hf_config(resolve_model_config("llama3-8b")), where="llama3-8b", seq=2048)
    weight = balanced_rule(llama).last_weight
    assert 2.0 < weight < 2.5  # h V against a layer's GEMMs and causal attention at 2k tokens
    assert argv[argv.index("--layer-split") + 1] == ",".join(map(str, balanced_split(32, 4, 0.0, weight))) == "9,9,8,6"
    again = tmp_path / "again.json"
    assert main([*argv[1:], "--json", str(again)]) == 0
    assert json.loads(again.read_text())["step_time"] == best["step_time"]
    even = tmp_path / "even.json"
    assert main([*base, "--json", str(even)]) == 0
    assert json.loads(even.read_text())["rows"][0]["step_time"] > best["step_time"]  # the head's stage was the pace
    assert main([*base, "--balance-layers", "--account-for-loss-in-pipeline-split"]) == 2
    assert "--balance-layers chooses the split itself" in capsys.readouterr().err


def test_run_takes_the_same_flags_and_trains_the_split_simulate_cuts():
    gpt = ["--nproc", "2", "--model", "gpt", "--layers", "6", "--hidden", "16", "--heads", "2", "--seq", "8",
           "--vocab", "32", "--batch", "8", "--microbatches", "4"]
    def cfg(*argv):
        return config_from_args(build_parser().parse_args(["run", *argv]))
    assert cfg("interleaved-1f1b", "--stages", "2", "--virtual", "2", *gpt, "--account-for-embedding-in-pipeline-split",
               "--account-for-loss-in-pipeline-split").layer_split == (1, 2, 2, 1)  # 6 + 2 slots over 4 chunks
    assert cfg("1f1b", "--stages", "2", *gpt, "--pipeline-model-parallel-layout", "Et*4|t*2L").layer_split == (4, 2)
    assert cfg("1f1b", "--stages", "2", *gpt).layer_split is None
    for argv, message in ((["1f1b", *gpt, "--decoder-last-pipeline-num-layers", "2"], "needs --stages and a schedule"),
                          (["zb-v", "--stages", "2", "--virtual", "2", *gpt, "--decoder-last-pipeline-num-layers", "2"],
                           "this schedule places its stages otherwise"),
                          (["1f1b", "--stages", "2", *gpt, "--layer-split", "3,3",
                            "--account-for-loss-in-pipeline-split"], "--layer-split gives every stage's layers")):
        with pytest.raises(PipesimError, match=message):
            cfg(*argv)
