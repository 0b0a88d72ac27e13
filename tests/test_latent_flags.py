"""Megatron-LM's flags for DeepSeek-V3's pieces (pipesim.commands.latent_args): --multi-latent-attention and its widths,
--mtp-num-layers and the DeepSeek routing flags. A Megatron-LM launch of DeepSeek-V3 (Megatron-LM core_v0.15.3
examples/post_training/modelopt/conf/deepseek-ai/DeepSeek-R1.sh, its MODEL_ARGS) simulates to the same step as the
bundled config.json; the flags build what they name; what pipesim does not model is refused in one line."""

from __future__ import annotations

import json

import pytest

from pipesim.cli import build_parser, main
from pipesim.commands.common import model_config
from pipesim.model.latent_attention import LatentAttention

# DeepSeek-R1.sh's MODEL_ARGS (DeepSeek-V3's architecture), as Megatron-LM ships them, less what is not a training
# run's shape (--save-interval, --tokenizer-type's model) and less what pipesim refuses alone
# (--no-masked-softmax-fusion and --no-rope-fusion: pipesim turns Megatron's five fusions off together;
# --moe-shared-expert-overlap: not modelled; --recompute-activations and --moe-layer-recompute: full recomputation
# below fits the 80 GiB), with the checkpoint's multi-token-prediction module, no dropout (the config.json's) and
# DeepSeek's vocabulary
DEEPSEEK_R1 = (
    "--bf16 --disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope "
    "--normalization RMSNorm --swiglu --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 "
    "--num-attention-heads 128 --kv-channels 128 --multi-latent-attention --kv-lora-rank 512 --v-head-dim 128 "
    "--q-lora-rank 1536 --qk-head-dim 128 --qk-layernorm --qk-pos-emb-head-dim 64 --num-experts 256 "
    "--moe-layer-freq [0]*3+[1]*58 --moe-ffn-hidden-size 2048 --moe-router-dtype fp32 "
    "--moe-router-score-function sigmoid --moe-router-bias-update-rate 1e-3 --moe-router-enable-expert-bias "
    "--moe-router-topk 8 --moe-router-num-groups 8 --moe-router-group-topk 4 --moe-router-pre-softmax "
    "--moe-router-topk-scaling-factor 2.5 --moe-shared-expert-intermediate-size 2048 --moe-aux-loss-coeff 1e-4 "
    "--moe-router-load-balancing-type seq_aux_loss --moe-token-dispatcher-type alltoall --moe-token-drop-policy probs "
    "--seq-length 4096 --max-position-embeddings 163840 --make-vocab-size-divisible-by 1280 --use-mcore-models "
    "--rotary-base 10000 --rotary-percent 1.0 --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0 "
    "--mtp-num-layers 1 --hidden-dropout 0 --attention-dropout 0 --vocab-size 129280 --moe-grouped-gemm")
LAYOUT = ("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 16 --decoder-first-pipeline-num-layers 3 "
          "--decoder-last-pipeline-num-layers 2 --expert-model-parallel-size 32 --use-distributed-optimizer "
          "--micro-batch-size 1 --global-batch-size 1024 --recompute-granularity full --recompute-method uniform "
          "--recompute-num-layers 1")
SAME_LAYOUT = ["--framework", "megatron-core", "--tp", "1", "--dp", "32", "--ep", "32", "--zero", "1",
               "--batch", "1024", "--microbatch-size", "1", "--seq", "4096", "--dtype", "bfloat16", "--stages", "16",
               "--recompute", "full", "--moe-token-dispatcher-type", "alltoall",
               "--decoder-first-pipeline-num-layers", "3", "--decoder-last-pipeline-num-layers", "2",
               "--hardware", "dgx-h100", "--nodes", "64"]
GPT = ["--model", "gpt", "--layers", "4", "--hidden", "1024", "--heads", "8", "--seq", "512", "--batch", "8",
       "--position-embedding-type", "rope", "--disable-bias-linear"]


def _json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _model(argv: list[str]):
    return model_config(build_parser().parse_args(["simulate", "1f1b", *argv]))


def test_megatrons_deepseek_v3_launch_simulates_as_its_config_json(tmp_path, capsys):
    """The same step time and the same parameters on every rank as --model-config deepseek-v3 in that layout."""
    path = tmp_path / "deepseek_r1.sh"
    path.write_text(f"torchrun --nproc_per_node=8 --nnodes=64 pretrain_gpt.py {LAYOUT} {DEEPSEEK_R1}\n")
    mine = _json(capsys, ["simulate", "--from-megatron", str(path), "--hardware", "dgx-h100", "--nodes", "64"])
    theirs = _json(capsys, ["simulate", "1f1b", "--model-config", "deepseek-v3", *SAME_LAYOUT])
    assert mine["step_time"] == theirs["step_time"]
    assert mine["memory"]["param_bytes"] == theirs["memory"]["param_bytes"]


def test_the_flags_build_latent_attention_mtp_and_deepseek_routing():
    """Megatron's defaults for the widths (q-lora-rank none, kv-lora-rank 32, qk-head-dim 128, qk-pos-emb-head-dim 64,
    v-head-dim 128), each typed width over them or over a file's; --qk-layernorm there is the latents' norms."""
    latent = [*GPT, "--multi-latent-attention", "--qk-layernorm"]
    assert _model(latent).mla == LatentAttention(q_lora_rank=None, kv_lora_rank=32, qk_nope_dim=128, qk_rope_dim=64,
                                                 v_head_dim=128)
    assert _model(latent).qk_norm is False
    typed = _model([*latent, "--q-lora-rank", "96", "--kv-lora-rank", "64", "--qk-head-dim", "32",
                    "--qk-pos-emb-head-dim", "16", "--v-head-dim", "48", "--mtp-num-layers", "2"])
    assert (typed.mla, typed.mtp_layers) == (LatentAttention(96, 64, 32, 16, 48), 2)
    over = _model(["--model-config", "deepseek-v3", "--seq", "4096", "--kv-lora-rank", "256", "--mtp-num-layers", "0"])
    assert (over.mla, over.mtp_layers) == (LatentAttention(1536, 256, 128, 64, 128), 0)
    moe = _model(["--model", "moe", *GPT[2:], "--num-experts", "8", "--moe-router-enable-expert-bias",
                  "--moe-router-num-groups", "4", "--moe-router-group-topk", "2"]).moe
    assert (moe.expert_bias, moe.groups, moe.group_topk) == (True, 4, 2)


@pytest.mark.parametrize(("argv", "line"), [
    ([*GPT, "--multi-latent-attention"], "--multi-latent-attention without --qk-layernorm: Megatron then builds the "
                                         "latents without their norms, which pipesim does not model (DeepSeek's have "
                                         "them)"),
    ([*GPT, "--kv-lora-rank", "64"], "--kv-lora-rank sizes latent attention: give --multi-latent-attention"),
    (["--model-config", "llama3-8b", "--v-head-dim", "64"],
     "--v-head-dim sizes latent attention: give --multi-latent-attention (--model-config llama3-8b has none)"),
    ([*GPT, "--moe-router-enable-expert-bias"],
     "--moe-router-enable-expert-bias needs a mixture-of-experts model (--model moe or a mixture-of-experts "
     "--model-config)"),
    (["--model", "moe", "--num-experts", "8", "--moe-router-num-groups", "4"],
     "--moe-router-num-groups 4 needs --moe-router-group-topk"),
    (["--model", "mlp", "--mtp-num-layers", "1"], "--mtp-num-layers needs a transformer (--model gpt or "
                                                  "--model-config)"),
    (["--model", "moe", "--num-experts", "8", "--moe-router-group-topk", "1"],
     "--moe-router-group-topk 1 needs --moe-router-num-groups"),
    ([*GPT, "--multi-latent-attention", "--qk-layernorm", "--qk-pos-emb-head-dim", "3"],
     "latent attention qk_rope_dim 3 is odd: rotary embeddings turn pairs of features"),
    ([*GPT, "--mtp-num-layers", "100000"], "100000 multi-token-prediction modules beside 4 layers are above "
                                          "pipesim's bound of 65,536 layers (DeepSeek-V3 has 1)"),
    (["--cost", "F=1,B=2", "--multi-latent-attention"],
     "--multi-latent-attention needs a model, but --cost gives the seconds: drop one"),
    # DeepSeek-V3's 8 groups, 4 per token, cannot hold a token's 8 experts among 8: the flags named, with the file
    (["--model-config", "deepseek-v3", "--seq", "4096", "--num-experts", "8"],
     "--num-experts over --model-config deepseek-v3's experts: moe group_topk must be given with groups > 1, between "
     "1 and groups (8), its groups holding top_k (8) experts; got 4"),
])
def test_what_pipesim_does_not_model_is_refused_in_one_line(capsys, argv, line):
    assert main(["simulate", "1f1b", "--stages", "2", "--microbatches", "4", *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"pipesim: error: {line}\n"


@pytest.mark.parametrize(("extra", "line"), [
    ("--rope-type bogus", "--rope-type bogus: Megatron's choices are rope and yarn"),
    ("--rope-type yarn --mscale x", "--mscale 'x' is not a number"),
    ("--kv-channels x", "--kv-channels 'x' is not an integer")])
def test_megatrons_values_beside_latent_attention_are_checked_though_read_past(tmp_path, capsys, extra, line):
    """Fuzzed on 2026-12-07: read past unchecked, they ran where Megatron's argparse refuses them."""
    path = tmp_path / "run.sh"
    path.write_text("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
                    "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 --vocab-size 1024 "
                    f"--position-embedding-type rope --disable-bias-linear --multi-latent-attention --qk-layernorm "
                    f"--bf16 {extra}\n")
    assert main(["simulate", "--from-megatron", str(path)]) == 2
    assert capsys.readouterr().err == f"pipesim: error: --from-megatron {path}: {line}\n"


def test_yarn_on_standard_attention_from_megatrons_flags_is_refused(tmp_path, capsys):
    """With latent attention YaRN's mscale is applied inside its own RoPE kernel (multi_latent_attention.py), so the
    launch above reads past it; on standard attention pipesim takes YaRN's factor from a config.json only."""
    path = tmp_path / "run.sh"
    path.write_text("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
                    "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 --vocab-size 1024 "
                    "--position-embedding-type rope --rope-type yarn --rotary-scaling-factor 4 --bf16\n")
    assert main(["simulate", "--from-megatron", str(path)]) == 2
    assert capsys.readouterr().err == (f"pipesim: error: --from-megatron {path}: --rope-type yarn on standard "
                                       "attention: pipesim reads YaRN's attention factor from a --model-config (its "
                                       "rope_scaling), not from Megatron's flags\n")


def test_typed_experts_and_their_groups_are_checked_together():
    """--num-experts 8 with --moe-router-num-groups 2 --moe-router-group-topk 2 over DeepSeek-V3's 8 groups: the new
    count is checked against the typed groups, not the file's."""
    moe = _model(["--model-config", "deepseek-v3", "--seq", "4096", "--num-experts", "8",
                  "--moe-router-num-groups", "2", "--moe-router-group-topk", "2"]).moe
    assert (moe.experts, moe.groups, moe.group_topk, moe.top_k) == (8, 2, 2, 8)
