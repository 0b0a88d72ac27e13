"""`pipesim simulate --from-megatron ARGS` (pipesim/commands/megatron_import.py): a Megatron-LM launch read as the
flags it stands for, exactly; the plan's own Megatron export simulates back to the plan's step; what pipesim does not
model refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipesim.cli import main
from pipesim.commands.megatron_import import expand

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "megatron_llama3_8b.sh"
# Llama 3.1 70B in Megatron's words (its config.json's shapes); vocab 128256 is a multiple of 16 x tp 8
LLAMA_70B = ("--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 "
             "--group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm --disable-bias-linear "
             "--position-embedding-type rope --untie-embeddings-and-output-weights --hidden-dropout 0 "
             "--attention-dropout 0 --max-position-embeddings 131072 --vocab-size 128256 "
             "--make-vocab-size-divisible-by 16 --bf16")


def _file(tmp_path, text: str, name: str = "run.sh") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _run(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_plans_megatron_export_simulates_back_to_the_plans_step(tmp_path, capsys):
    """`pipesim plan --framework megatron-core` exports pretrain_gpt.py's arguments (one flag a line); with the
    model's own arguments added they are the very run the plan timed: interleaved 1F1B, 2 stages x 4 chunks, tp 8."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--model-config", "llama3.1-70b", "--seq", "4096", "--batch", "32", "--hardware", "dgx-h100",
                 "--nodes", "2", "--framework", "megatron-core", "--schedules", "interleaved-1f1b", "--recompute",
                 "full", "--max-candidates", "3", "--top", "1", "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    lines = plan["winner"]["megatron_args"]
    assert "--num-layers-per-virtual-pipeline-stage 10" in lines  # a pipeline of interleaved chunks, as below
    path = _file(tmp_path, "# the plan's export\n" + "\n".join(lines) + "\n" + LLAMA_70B + "\n")
    argv = expand(["simulate", "--from-megatron", path, "--hardware", "dgx-h100", "--nodes", "2"])
    assert argv[:2] == ["simulate", "interleaved-1f1b"] and argv[argv.index("--virtual") + 1] == "4"
    again = _run(capsys, ["simulate", "--from-megatron", path, "--hardware", "dgx-h100", "--nodes", "2"])
    assert again["step_time"] == plan["rows"][0]["step_time"]


LLAMA_8B_TYPED = ["--model", "gpt", "--layers", "4", "--hidden", "1024", "--heads", "16", "--kv-heads", "4",
                  "--ffn-hidden", "3584", "--activation", "swiglu", "--normalization", "RMSNorm",
                  "--position-embedding-type", "rope", "--disable-bias-linear", "--no-dropout", "--vocab", "32768"]
LLAMA_8B_FILE = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --group-query-attention "
                 "--num-query-groups 4 --ffn-hidden-size 3584 --swiglu --normalization RMSNorm "
                 "--position-embedding-type rope --disable-bias-linear --hidden-dropout 0.0 --attention-dropout 0.0 "
                 "--untie-embeddings-and-output-weights --max-position-embeddings 8192 --vocab-size 32768")
# GPT-3-shaped: Megatron's defaults (LayerNorm, GeLU 4h, learned positions, biases, dropout 0.1, tied)
GPT3_TYPED = ["--model", "gpt", "--layers", "4", "--hidden", "1024", "--heads", "16", "--vocab", "50432",
              "--tie-embeddings-and-output-weights"]
GPT3_FILE = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --max-position-embeddings 2048 "
             "--tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt "
             "--vocab-size 50257")  # padded to 50432 (a multiple of 128 x tp 2)
MOE_TYPED = ["--model", "moe", "--layers", "4", "--hidden", "1024", "--heads", "16", "--ffn-hidden", "2048",
             "--activation", "swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
             "--disable-bias-linear", "--no-dropout", "--vocab", "32768", "--num-experts", "8", "--moe-router-topk",
             "2", "--moe-ffn-hidden-size", "512", "--ep", "4", "--etp", "1", "--zero", "1"]
MOE_FILE = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 2048 --swiglu "
            "--normalization RMSNorm --position-embedding-type rope --disable-bias-linear --hidden-dropout 0 "
            "--attention-dropout 0 --untie-embeddings-and-output-weights --max-position-embeddings 2048 "
            "--vocab-size 32768 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512 "
            "--expert-model-parallel-size 4 --expert-tensor-parallel-size 1 --moe-token-dispatcher-type alltoall "
            "--moe-grouped-gemm --use-distributed-optimizer --moe-aux-loss-coeff 1e-2")


# GPT-OSS-shaped attention on that Llama: a 512-key window on every other layer, a sink logit per head
WINDOWED_TYPED = [*LLAMA_8B_TYPED, "--window-size", "511,0", "--window-attn-skip-freq", "2", "--softmax-type",
                  "learnable", "--attention", "flash"]
WINDOWED_FILE = (LLAMA_8B_FILE + " --window-size 511,0 --window-attn-skip-freq 2 --softmax-type learnable "
                 "--attention-backend fused")


@pytest.mark.parametrize("typed, text, seq", [
    (LLAMA_8B_TYPED, LLAMA_8B_FILE, 4096), (GPT3_TYPED, GPT3_FILE, 2048), (MOE_TYPED, MOE_FILE, 2048),
    (WINDOWED_TYPED, WINDOWED_FILE, 4096),
    ([*LLAMA_8B_TYPED, "--add-qkv-bias"], LLAMA_8B_FILE + " --add-qkv-bias", 4096)],  # Qwen2's q/k/v biases
    ids=["llama", "gpt3", "moe", "windowed", "qkv-bias"])
def test_a_file_equals_the_same_flags_typed(tmp_path, capsys, typed, text, seq):
    """Llama-shaped (RMSNorm, SwiGLU, rope, no biases, untied, GQA, no dropout), GPT-3-shaped (Megatron's defaults:
    the vocabulary padded, embeddings tied, dropout 0.1) and a mixture of experts: step time and peak memory equal
    to the same model and layout typed as pipesim's flags under --framework megatron-core."""
    tp, layout = ("1" if "moe" in typed else "2"), "--pipeline-model-parallel-size 2"
    path = _file(tmp_path, f"torchrun --nproc_per_node=8 pretrain_gpt.py --tensor-model-parallel-size {tp} {layout} "
                           f"--seq-length {seq} --micro-batch-size 1 --global-batch-size 16 --bf16 "
                           f"--recompute-activations {text} --lr 1e-4 --train-iters 10\n")
    dp = str(8 // (int(tp) * 2))
    mine = _run(capsys, ["simulate", "--from-megatron", path, "--hardware", "dgx-h100"])
    theirs = _run(capsys, ["simulate", "1f1b", "--framework", "megatron-core", *typed, "--tp", tp, "--dp", dp,
                           "--stages", "2", "--seq", str(seq), "--microbatch-size", "1", "--batch", "16", "--dtype",
                           "bfloat16", "--recompute", "selective", "--hardware", "dgx-h100"]
                   + (["--moe-token-dispatcher-type", "alltoall"] if "moe" in typed else []))
    assert mine["step_time"] == theirs["step_time"]
    assert mine["memory"]["param_bytes"] == theirs["memory"]["param_bytes"]
    assert mine["memory"]["peak_activation_bytes"] == theirs["memory"]["peak_activation_bytes"]


def test_the_files_flags_come_first_and_typed_ones_win():
    argv = expand(["simulate", "--from-megatron", str(EXAMPLE), "--hardware", "dgx-h100", "--recompute", "full"])
    assert argv[:4] == ["simulate", "1f1b", "--model", "gpt"]
    assert argv[-4:] == ["--hardware", "dgx-h100", "--recompute", "full"]
    for flag, value in (("--framework", "megatron-core"), ("--tp", "2"), ("--dp", "4"), ("--zero", "1"),
                        ("--batch", "128"), ("--microbatch-size", "1"), ("--seq", "8192"), ("--dtype", "bfloat16"),
                        ("--ffn-hidden", "14336"), ("--kv-heads", "8"), ("--kv-channels", "128"),
                        ("--vocab", "128256"), ("--attention", "flash"), ("--recompute", "selective")):
        assert argv[argv.index(flag) + 1] == value, flag
    assert "--untie-embeddings-and-output-weights" in argv and "--no-dropout" in argv


def test_the_example_simulates(capsys):
    data = _run(capsys, ["simulate", "--from-megatron", str(EXAMPLE), "--hardware", "dgx-h100"])
    assert data["parallel"]["dp"] == 4 and data["parallel"]["tp"] == 2


def test_megatrons_defaults_are_read_as_megatron_has_them(tmp_path):
    """No --ffn-hidden-size with SwiGLU: int(8h / 3 / 64) x 64 (4096 -> 10880); the NullTokenizer's vocabulary one
    more (its end-of-document token) padded to 128 x tp; no --global-batch-size: micro x dp; neither --bf16 nor
    --fp16: float32."""
    path = _file(tmp_path, "--num-layers 2 --hidden-size 4096 --num-attention-heads 32 --swiglu --seq-length 1024 "
                           "--max-position-embeddings 1024 --micro-batch-size 2 --tokenizer-type NullTokenizer "
                           "--vocab-size 32000 --tensor-model-parallel-size 2")
    argv = expand(["simulate", "--from-megatron", path, "--hardware", "dgx-h100"])
    for flag, value in (("--ffn-hidden", "10880"), ("--vocab", "32256"), ("--batch", "8"), ("--dtype", "float32"),
                        ("--dp", "4")):
        assert argv[argv.index(flag) + 1] == value, flag
    assert "--dropout" in argv and "--tie-embeddings-and-output-weights" in argv


BASE = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --max-position-embeddings 512 "
        "--micro-batch-size 1 --vocab-size 1024 ")


@pytest.mark.parametrize(("extra", "modules"), [("", ["core_attn", "moe"]),
                                                ("--recompute-modules mlp ", ["mlp", "moe"]),
                                                ("--recompute-activations --recompute-modules moe ", ["moe"])])
def test_moe_layer_recompute_is_megatrons_selective_moe(tmp_path, extra, modules):
    """The deprecated --moe-layer-recompute: transformer_config.py (core_v0.15.3) turns it into selective recomputation
    with "moe" added to the modules (Megatron's default, core_attn, when none is given)."""
    path = _file(tmp_path, BASE + "--bf16 --num-experts 4 --moe-grouped-gemm --moe-token-dispatcher-type alltoall "
                 + extra + "--moe-layer-recompute")
    argv = expand(["simulate", "--from-megatron", path])
    at = argv.index("--recompute-modules")
    assert argv[argv.index("--recompute") + 1] == "selective" and argv[at + 1:at + 1 + len(modules)] == modules


@pytest.mark.parametrize("text, message", [
    (BASE + "--bogus 1", "--bogus is not read: Megatron-LM v0.15.3 has no such flag, or it changes the run and "
                         "pipesim does not model it"),
    (BASE + "--tensor-model-parallel-size $TP", "'$TP' holds a shell variable: expand shell variables first"),
    ("torchrun --nproc-per-node 8 pretrain_bert.py " + BASE,
     "the launch runs 'pretrain_bert.py'; pipesim reads pretrain_gpt.py's arguments"),
    (BASE + "--tensor-model-parallel-size 3", "8 GPUs are not a multiple of tp x pp x cp = 3 (Megatron asserts it)"),
    (BASE + "--global-batch-size 12", "--global-batch-size 12 is not a multiple of --micro-batch-size x dp = 1 x 8"),
    (BASE + "--recompute-granularity full --recompute-method block --recompute-num-layers 2",
     "--recompute-granularity full with --recompute-method block --recompute-num-layers 2: pipesim models every "
     "layer recomputed on its own (uniform, 1)"),
    (BASE + "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
            "--moe-layer-recompute", "--moe-layer-recompute with --recompute-granularity full (Megatron raises: 'Do "
                                     "not set --moe-layer-recompute with full recompute granularity')"),
    (BASE + "--moe-layer-recompute", "--moe-layer-recompute recomputes the MoE layers: this model has none (no "
                                     "--num-experts)"),
    (BASE + "--hidden-dropout 0", "--hidden-dropout 0 with --attention-dropout 0.1: pipesim's dropout runs in all "
                                  "three places or none (give both above 0, or both 0)"),
    (BASE.replace("--vocab-size 1024 ", ""), "the vocabulary comes from the tokenizer file; give --vocab-size in the "
                                             "file or --vocab after it"),
    (BASE + "--rampup-batch-size 16 8 1000", "--rampup-batch-size changes the batch over the run; pipesim times one "
                                             "step of one batch"),
    (BASE + "--no-bias-gelu-fusion", "--no-bias-gelu-fusion alone: pipesim turns Megatron's five fusions off "
                                     "together (--no-kernel-fusion)"),
    (BASE + "--num-experts 4 --moe-grouped-gemm", "--moe-token-dispatcher-type allgather: Megatron's allgather "
                                                  "dispatcher is not modelled: give alltoall or flex"),
    (BASE + "--num-experts 4 --moe-token-dispatcher-type alltoall", "experts without --moe-grouped-gemm run one GEMM "
                                                                    "per expert (SequentialMLP)"),
    (BASE + "--transformer-impl inference_optimized", "--transformer-impl inference_optimized: pipesim times local "
                                                      "or transformer_engine"),
    (BASE + "--softmax-type off-by-one", "--softmax-type off-by-one: pipesim models the vanilla softmax and the "
                                         "learnable one (a sink logit per head)"),
    (BASE + "--window-size 63,0 --window-attn-skip-freq [1,1,0]", "--window-attn-skip-freq [1,1,0]: pipesim models "
                                                                  "full attention on every N-th layer"),
    (BASE + "--bf16 extra", "--bf16 takes no value, got 'extra'"),
    (BASE + "--checkpoint-activations", "--checkpoint-activations is no longer valid in Megatron-LM v0.15.3"),
    (BASE.replace("--max-position-embeddings 512", "--max-position-embeddings 256"),
     "--max-position-embeddings 256 is below --seq-length 512 (Megatron asserts"),
])
def test_what_pipesim_does_not_model_is_refused_in_one_line(tmp_path, capsys, text, message):
    path = _file(tmp_path, text)
    assert main(["simulate", "--from-megatron", path, "--hardware", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"pipesim: error: --from-megatron {path}: ") and message in err


def test_the_files_transformer_impl_reaches_the_command(tmp_path):
    """Megatron-core's default (transformer_engine) is the profile's, so only local is written out."""
    for impl, written in (("", None), ("--transformer-impl transformer_engine", None),
                          ("--transformer-impl local", "local")):
        argv = expand(["simulate", "--from-megatron", _file(tmp_path, BASE + impl), "--hardware", "dgx-h100"])
        assert (argv[argv.index("--transformer-impl") + 1] if "--transformer-impl" in argv else None) == written


def test_one_job_file_and_no_framework(tmp_path, capsys):
    path = _file(tmp_path, BASE)
    assert main(["simulate", "--from-megatron", path, "--framework", "nemo"]) == 2
    assert "the file is Megatron-LM's (--framework megatron-core); drop --framework" in capsys.readouterr().err
    assert main(["simulate", "--from-megatron", path, "--from-torchtitan", path]) == 2
    assert capsys.readouterr().err == ("pipesim: error: --from-torchtitan and --from-megatron: give one job file\n")


def test_plan_takes_the_files_job_and_searches_its_layout(tmp_path):
    argv = expand(["plan", "--from-megatron", str(EXAMPLE), "--hardware", "dgx-h100"])
    assert argv[:4] == ["plan", "--model", "gpt", "--framework"]
    assert "--tp" not in argv and "--recompute" not in argv and "--zero" not in argv  # the layout is searched
    out = tmp_path / "plan.json"
    assert main(["plan", "--from-megatron", str(EXAMPLE), "--hardware", "dgx-h100", "--max-candidates", "3",
                 "--top", "1", "--json", str(out)]) == 0
    winner = json.loads(out.read_text())["winner"]["simulate_command"].split()
    for flag, value in (("--layers", "32"), ("--seq", "8192"), ("--batch", "128"), ("--dtype", "bfloat16"),
                        ("--vocab", "128256"), ("--normalization", "RMSNorm")):
        assert winner[winner.index(flag) + 1] == value, flag


SMALL = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
         "--micro-batch-size 1 --global-batch-size 16 --bf16 --vocab-size 32000")


def test_plan_keeps_the_files_software_choices_and_searches_the_layout(tmp_path):
    """The plan searches the degrees, the schedule, recomputation and ZeRO; the file's overlaps, fusions and
    gradient dtype are the job's and stay (dropping them would plan another run)."""
    path = _file(tmp_path, SMALL + " --tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer "
                 "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap --cross-entropy-loss-fusion "
                 "--grad-reduce-in-bf16 --decoder-first-pipeline-num-layers 1 --pipeline-model-parallel-size 2")
    argv = expand(["plan", "--from-megatron", path, "--hardware", "dgx-h100"])
    for kept in ("--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap", "--cross-entropy-loss-fusion",
                 "--grad-reduce-in-bf16"):
        assert kept in argv
    for searched in ("--tp", "--stages", "--zero", "--sequence-parallel", "--decoder-first-pipeline-num-layers"):
        assert searched not in argv


@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_no_output_replaces_the_launch_file(tmp_path, capsys, command):
    path = _file(tmp_path, SMALL, "run.json")  # a name the outputs' own check takes
    before = Path(path).read_text()
    assert main([command, "--from-megatron", path, "--hardware", "dgx-h100", "--json", path]) == 2
    assert capsys.readouterr().err.strip() == f"pipesim: error: --json {path} is the file --from-megatron reads: " \
                                              "give another file"
    assert Path(path).read_text() == before


@pytest.mark.parametrize(("launch", "line"), [
    ("torchrun --nproc-per-node \u00b2 pretrain_gpt.py", "torchrun's --nproc-per-node '\u00b2': give a whole number of "
                                                         "GPUs and nodes"),
    ("torchrun --nproc-per-node 8 my_pretrain_gpt.py", "the launch runs 'my_pretrain_gpt.py'; pipesim reads "
                                                       "pretrain_gpt.py's arguments"),
])
def test_the_launcher_is_read_strictly(tmp_path, capsys, launch, line):
    path = _file(tmp_path, f"{launch} {SMALL}")
    assert main(["simulate", "--from-megatron", path, "--hardware", "dgx-h100"]) == 2
    assert capsys.readouterr().err.strip() == f"pipesim: error: --from-megatron {path}: {line}"


MOE = " --num-experts 4 --moe-grouped-gemm --moe-token-dispatcher-type alltoall"


@pytest.mark.parametrize(("text", "line"), [
    (SMALL.replace("--num-layers 4", "--num-layers 5") + " --pipeline-model-parallel-size 2",
     "5 layers (with the embedding and loss the split counts) do not split into --pipeline-model-parallel-size 2 x 1 "
     "chunks (Megatron asserts an even split without a layout or --decoder-first/last-pipeline-num-layers)"),
    (SMALL + " --num-virtual-stages-per-pipeline-rank 2",
     "a virtual pipeline at --pipeline-model-parallel-size 1: Megatron's interleaved schedule needs more than 1 (more "
     "than 2 with --no-overlap-p2p-communication)"),
    (SMALL + " --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
     "--no-overlap-p2p-communication",
     "a virtual pipeline at --pipeline-model-parallel-size 2: Megatron's interleaved schedule needs more than 1 (more "
     "than 2 with --no-overlap-p2p-communication)"),
    (SMALL.replace("--bf16", "--fp16") + MOE,
     "--moe-grouped-gemm without --bf16 (Megatron asserts 'Currently GroupedGEMM for MoE only supports bf16 dtype.')"),
    (SMALL + MOE + " --moe-pad-expert-input-to-capacity",
     "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (Megatron asserts it)"),
    (SMALL + MOE + " --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
     "--overlap-moe-expert-parallel-comm",
     "--overlap-moe-expert-parallel-comm overlaps the expert-parallel all-to-alls: it needs "
     "--expert-model-parallel-size > 1 (Megatron asserts it)"),
    (SMALL + " --hidden-dropout nan --attention-dropout nan", "--hidden-dropout nan: a probability from 0 up to 1"),
    (SMALL + " --hidden-dropout 0.1 --attention-dropout inf", "--attention-dropout inf: a probability from 0 up to 1"),
    (SMALL + " --padded-vocab-size 32001 --tensor-model-parallel-size 2",
     "--padded-vocab-size 32001 is not a multiple of --tensor-model-parallel-size 2"),
    # flags read past, their values still Megatron's argparse's (arguments.py @ core_v0.15.3)
    (SMALL + " --lr x", "--lr 'x' is not a number (Megatron's argparse refuses it)"),
    (SMALL + " --train-iters 1e3", "--train-iters '1e3' is not an integer (Megatron's argparse refuses it)"),
    (SMALL + " --lr-decay-style cosin", "--lr-decay-style 'cosin': Megatron's choices are constant, linear, cosine, "
                                        "inverse-square-root, WSD"),
    (SMALL + " --use-mcore-models yes", "--use-mcore-models takes no value, got 'yes'"),
    (SMALL + " --mtp-loss-scaling-factor", "--mtp-loss-scaling-factor takes one value, got 0"),
])
def test_what_megatron_refuses_to_start_with_is_refused(tmp_path, capsys, text, line):
    path = _file(tmp_path, text)
    assert main(["simulate", "--from-megatron", path, "--hardware", "dgx-h100"]) == 2
    assert capsys.readouterr().err.strip() == f"pipesim: error: --from-megatron {path}: {line}"


def test_a_typed_model_kind_is_refused_and_a_config_replaces_the_files(tmp_path, capsys):
    path = _file(tmp_path, SMALL)
    assert main(["simulate", "--from-megatron", path, "--hardware", "dgx-h100", "--model", "gpt"]) == 2
    assert "--model gpt after the file: the file's model is its --num-layers" in capsys.readouterr().err
    argv = expand(["simulate", "--from-megatron", path, "--model-config", "llama3-8b"])
    assert "--hidden" not in argv and "--vocab" not in argv  # none of the file's model flags is kept
    d = _run(capsys, ["simulate", "--from-megatron", path, "--model-config", "llama3-8b", "--layers", "4",
                      "--hardware", "dgx-h100"])
    assert d["model_config"]["source"] == "llama3-8b"


def test_a_typed_degree_moves_the_data_parallel_degree_as_in_megatron(tmp_path, capsys):
    """WORLD_SIZE stays the launch's (8): --tp 2 typed after the file leaves dp = 8 / 2 = 4, not the file's 8."""
    path = _file(tmp_path, "torchrun --nproc-per-node 8 pretrain_gpt.py " + SMALL)
    argv = expand(["simulate", "--from-megatron", path, "--tp", "2"])
    assert argv[argv.index("--dp") + 1] == "4" and argv[-2:] == ["--tp", "2"]
    d = _run(capsys, ["simulate", "--from-megatron", path, "--tp", "2", "--hardware", "dgx-h100"])
    assert (d["parallel"]["dp"], d["parallel"]["tp"]) == (4, 2)
