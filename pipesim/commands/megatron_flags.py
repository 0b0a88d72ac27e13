"""Every Megatron-LM flag `--from-megatron` knows, classified once: read (the importer turns it into pipesim's flags),
passed (pipesim has it by the same name and meaning), read past (no effect on a step's time or memory as pipesim
models it) or refused with its reason; a flag in none of them is refused as unknown.

Names, defaults and meanings are NVIDIA/Megatron-LM v0.15.3's megatron/training/arguments.py (the version
pipesim's megatron-core profile and its plan exports cite); the few flags of later Megatron-core that pipesim's
own flags and exports use are marked so (LATER).
"""

from __future__ import annotations

SWITCH, VALUE, LIST = 0, 1, -1  # a flag's values: none, one, one or more

# read by pipesim.commands.megatron_import: flag -> its values
READ = {
    # the layout
    "--tensor-model-parallel-size": VALUE, "--pipeline-model-parallel-size": VALUE, "--context-parallel-size": VALUE,
    "--cp-comm-type": LIST, "--expert-model-parallel-size": VALUE, "--expert-tensor-parallel-size": VALUE,
    "--num-layers-per-virtual-pipeline-stage": VALUE, "--num-virtual-stages-per-pipeline-rank": VALUE,
    "--pipeline-model-parallel-layout": VALUE, "--overlap-moe-expert-parallel-comm": SWITCH,
    "--sequence-parallel": SWITCH, "--use-distributed-optimizer": SWITCH,
    "--microbatch-group-size-per-virtual-pipeline-stage": VALUE, "--distributed-backend": VALUE,
    "--num-distributed-optimizer-instances": VALUE, "--empty-unused-memory-level": VALUE,
    # the batch
    "--micro-batch-size": VALUE, "--global-batch-size": VALUE, "--seq-length": VALUE,
    # precision
    "--bf16": SWITCH, "--fp16": SWITCH, "--fp8-format": VALUE, "--fp8-recipe": VALUE, "--transformer-impl": VALUE,
    "--main-grads-dtype": VALUE,
    # recomputation
    "--recompute-activations": SWITCH, "--recompute-granularity": VALUE, "--recompute-method": VALUE,
    "--recompute-num-layers": VALUE, "--recompute-modules": LIST, "--moe-layer-recompute": SWITCH,
    # attention and kernels
    "--use-flash-attn": SWITCH, "--attention-backend": VALUE, "--no-masked-softmax-fusion": SWITCH,
    "--no-bias-gelu-fusion": SWITCH, "--no-bias-swiglu-fusion": SWITCH, "--no-bias-dropout-fusion": SWITCH,
    "--no-rope-fusion": SWITCH, "--cuda-graph-scope": LIST, "--optimizer": VALUE, "--softmax-type": VALUE,
    # the model
    "--num-layers": VALUE, "--hidden-size": VALUE, "--ffn-hidden-size": VALUE, "--num-attention-heads": VALUE,
    "--group-query-attention": SWITCH, "--num-query-groups": VALUE, "--kv-channels": VALUE, "--swiglu": SWITCH,
    "--squared-relu": SWITCH, "--normalization": VALUE, "--disable-bias-linear": SWITCH, "--add-qkv-bias": SWITCH,
    "--position-embedding-type": VALUE, "--use-rotary-position-embeddings": SWITCH, "--rotary-percent": VALUE,
    "--rotary-base": VALUE, "--rotary-seq-len-interpolation-factor": VALUE, "--use-rope-scaling": SWITCH,
    "--rope-scaling-factor": VALUE, "--norm-epsilon": VALUE,
    "--untie-embeddings-and-output-weights": SWITCH, "--hidden-dropout": VALUE, "--attention-dropout": VALUE,
    "--qk-layernorm": SWITCH, "--max-position-embeddings": VALUE, "--vocab-size": VALUE, "--window-size": VALUE,
    "--window-attn-skip-freq": VALUE, "--multi-latent-attention": SWITCH, "--rope-type": VALUE,
    "--rotary-scaling-factor": VALUE, "--mscale": VALUE, "--mscale-all-dim": VALUE,
    "--padded-vocab-size": VALUE, "--make-vocab-size-divisible-by": VALUE, "--tokenizer-type": VALUE,
    # experts
    "--num-experts": VALUE, "--moe-router-topk": VALUE, "--moe-ffn-hidden-size": VALUE,
    "--moe-shared-expert-intermediate-size": VALUE, "--moe-shared-expert-gate": SWITCH,
    "--moe-token-dispatcher-type": VALUE, "--moe-grouped-gemm": SWITCH,
    "--moe-layer-freq": VALUE, "--moe-expert-capacity-factor": VALUE, "--moe-pad-expert-input-to-capacity": SWITCH,
}

# pipesim's flag of the same name and meaning, typed as the file has it: flag -> its values
PASSED = {
    "--account-for-embedding-in-pipeline-split": SWITCH, "--account-for-loss-in-pipeline-split": SWITCH,
    "--decoder-first-pipeline-num-layers": VALUE, "--decoder-last-pipeline-num-layers": VALUE,
    "--overlap-p2p-communication-warmup-flush": SWITCH, "--overlap-grad-reduce": SWITCH, "--ddp-bucket-size": VALUE,
    "--overlap-param-gather": SWITCH, "--tp-comm-overlap": SWITCH, "--tp-comm-overlap-cfg": VALUE,
    "--no-gradient-accumulation-fusion": SWITCH, "--cross-entropy-loss-fusion": SWITCH,
    "--cross-entropy-fusion-impl": VALUE, "--accumulate-allreduce-grads-in-fp32": SWITCH,
    "--grad-reduce-in-bf16": SWITCH, "--fp8-param-gather": SWITCH, "--moe-router-load-balancing-type": VALUE,
    "--moe-aux-loss-coeff": VALUE, "--moe-z-loss-coeff": VALUE, "--moe-token-drop-policy": VALUE,
    "--first-last-layers-bf16": SWITCH,
    "--num-layers-at-start-in-bf16": VALUE, "--num-layers-at-end-in-bf16": VALUE, "--fp4-format": VALUE,
    "--fp4-recipe": VALUE, "--fp4-param-gather": SWITCH, "--use-precision-aware-optimizer": SWITCH,
    "--main-params-dtype": VALUE, "--exp-avg-dtype": VALUE, "--exp-avg-sq-dtype": VALUE,
    "--cuda-graph-impl": VALUE,
    "--moe-enable-deepep": SWITCH, "--moe-deepep-num-sms": VALUE,
    "--no-overlap-p2p-communication": SWITCH,  # pipesim's flag of that name (the interleaved sends held)
    # DeepSeek-V3's pieces (pipesim.commands.latent_args); --multi-latent-attention is READ (it changes what
    # --qk-layernorm, --kv-channels and --num-query-groups mean)
    "--q-lora-rank": VALUE, "--kv-lora-rank": VALUE, "--qk-head-dim": VALUE, "--qk-pos-emb-head-dim": VALUE,
    "--v-head-dim": VALUE, "--mtp-num-layers": VALUE, "--moe-router-enable-expert-bias": SWITCH,
    "--moe-router-num-groups": VALUE, "--moe-router-group-topk": VALUE, "--moe-shared-expert-overlap": SWITCH,
    # Llama 4's pieces (pipesim.commands.llama4_args) and the router's score function
    "--qk-l2-norm": SWITCH, "--no-rope-freq": VALUE, "--moe-router-score-function": VALUE,
    "--moe-apply-probs-on-input": SWITCH,
}
# Megatron-core after v0.15.3 (its TransformerConfig fields as flags, core_v0.16.0 on), which pipesim's own flags and
# its plan exports use: read as pipesim's flags of those names
LATER = {"--moe-flex-dispatcher-backend": VALUE, "--moe-hybridep-num-sms": VALUE,
         "--activation-func-fp8-input-store": SWITCH,
         # Muon (NVIDIA/Megatron-LM d7288711ba; --optimizer muon / dist_muon is READ): pipesim's flags of these names
         "--muon-num-ns-steps": VALUE, "--muon-no-split-qkv": SWITCH, "--muon-use-nesterov": SWITCH}
# Muon's choices that would change its step (later Megatron-core): read, and refused unless at their default
READ.update({"--muon-tp-mode": VALUE, "--muon-fp32-matmul-prec": VALUE, "--muon-scalar-optimizer": VALUE})

# read past, group by group: none changes a step's time or memory as pipesim models them
IGNORED: dict[str, tuple[str, ...]] = {
    "the learning rate and its schedule (_add_learning_rate_args): the optimizer's step costs the same": (
        "--lr", "--lr-decay-style", "--lr-wsd-decay-style", "--lr-decay-iters", "--lr-decay-samples",
        "--lr-wsd-decay-samples", "--lr-wsd-decay-iters", "--lr-warmup-fraction", "--lr-warmup-iters",
        "--lr-warmup-samples", "--lr-warmup-init", "--min-lr", "--override-opt_param-scheduler",
        "--override-opt-param-scheduler", "--use-checkpoint-opt_param-scheduler",
        "--use-checkpoint-opt-param-scheduler",
        "--decoupled-lr", "--decoupled-min-lr"),
    "regularisation and Adam's hyperparameters (_add_regularization_args): numbers, not work": (
        "--weight-decay", "--start-weight-decay", "--end-weight-decay", "--weight-decay-incr-style", "--clip-grad",
        "--adam-beta1", "--adam-beta2", "--adam-eps", "--sgd-momentum"),
    "initialisation and seeds (_add_initialization_args): before the first step": (
        "--seed", "--data-parallel-random-init", "--init-method-std", "--embedding-init-method-std",
        "--init-method-xavier-uniform", "--use-cpu-initialization", "--te-rng-tracker", "--inference-rng-tracker"),
    "checkpoints (_add_checkpointing_args): saved and loaded between steps": (
        "--save", "--save-interval", "--persistent-save-interval", "--save-retain-interval", "--no-save-optim",
        "--no-save-rng", "--load", "--no-load-optim", "--load-main-params-from-ckpt", "--no-load-rng",
        "--no-strict-fsdp-dtensor-load", "--non-persistent-save-interval", "--non-persistent-ckpt-type",
        "--non-persistent-global-ckpt-dir", "--non-persistent-local-ckpt-dir", "--non-persistent-local-ckpt-algo",
        "--finetune", "--pretrained-checkpoint", "--ckpt-step", "--no-initialization", "--use-checkpoint-args",
        "--use-mp-args-from-checkpoint-args", "--no-use-tokenizer-model-from-checkpoint-args",
        "--exit-on-missing-checkpoint", "--use-dist-ckpt", "--use-persistent-ckpt-worker", "--auto-detect-ckpt-format",
        "--dist-ckpt-format", "--ckpt-format", "--ckpt-convert-format", "--ckpt-convert-save",
        "--ckpt-convert-update-legacy-dist-opt-format", "--ckpt-fully-parallel-save", "--no-ckpt-fully-parallel-save",
        "--async-save", "--ckpt-fully-parallel-load", "--ckpt-assume-constant-structure", "--dist-ckpt-strictness",
        "--dist-ckpt-save-pre-mcore-014", "--dist-ckpt-optim-fully-reshardable",
        "--distrib-optim-fully-reshardable-mem-efficient"),
    "logging, timers and profiling (_add_logging_args, the profile flags): they watch the run": (
        "--log-throughput", "--log-progress", "--timing-log-level",
        "--log-energy", "--no-barrier-with-level-1-timing", "--timing-log-option", "--tensorboard-log-interval",
        "--tensorboard-queue-size", "--log-timers-to-tensorboard", "--no-log-loss-scale-to-tensorboard",
        "--log-validation-ppl-to-tensorboard", "--log-memory-to-tensorboard", "--log-world-size-to-tensorboard",
        "--wandb-project", "--wandb-entity", "--wandb-exp-name", "--wandb-save-dir", "--logging-level",
        "--tensorboard-dir", "--log-interval", "--profile", "--profile-step-start", "--profile-step-end",
        "--use-pytorch-profiler", "--profile-ranks", "--record-memory-history", "--memory-snapshot-path",
        "--no-one-logger", "--one-logger-project", "--one-logger-run-name", "--one-logger-async", "--app-tag-run-name",
        "--app-tag-run-version", "--config-logger-dir", "--log-straggler", "--disable-straggler-on-startup",
        "--straggler-ctrlr-port", "--straggler-minmax-count", "--run-workload-inspector-server"),
    "evaluation (_add_validation_args): between training steps": (
        "--full-validation", "--multiple-validation-sets", "--eval-iters", "--eval-interval", "--skip-train"),
    "the run's length and exits: how many steps, not what one costs": (
        "--train-iters", "--train-samples", "--exit-interval", "--exit-duration-in-mins", "--exit-signal-handler",
        "--iterations-to-skip", "--adlr-autoresume", "--adlr-autoresume-interval"),
    "data and its loader (_add_data_args): the tokens' content, read ahead of the GPUs": (
        "--data-path", "--split", "--train-data-path", "--valid-data-path", "--test-data-path", "--data-args-path",
        "--per-split-data-args-path", "--data-cache-path", "--no-mmap-bin-files", "--mock-data", "--num-workers",
        "--reset-position-ids", "--eod-mask-loss", "--no-create-attention-mask-in-dataloader",
        "--num-dataset-builder-threads", "--object-storage-cache-path", "--mid-level-dataset-surplus",
        "--dataloader-type"),
    "the tokenizer's files (_add_tokenizer_args; the vocabulary's size is read from --vocab-size)": (
        "--vocab-file", "--merge-file", "--vocab-extra-ids", "--tokenizer-model", "--tokenizer-metadata",
        "--tiktoken-pattern", "--tiktoken-num-special-tokens", "--tiktoken-special-tokens", "--legacy-tokenizer"),
    "fault tolerance and restarts: outside a step": (
        "--enable-ft-package", "--calc-ft-timeouts", "--inprocess-restart", "--inprocess-max-iterations",
        "--inprocess-monitor-thread-interval", "--inprocess-monitor-process-interval",
        "--inprocess-progress-watchdog-interval", "--inprocess-heartbeat-interval", "--inprocess-soft-timeout",
        "--inprocess-hard-timeout", "--inprocess-heartbeat-timeout", "--inprocess-barrier-timeout",
        "--inprocess-completion-timeout", "--inprocess-last-call-wait", "--inprocess-termination-grace-time",
        "--inprocess-granularity", "--inprocess-active-world-size", "--inprocess-empty-cuda-cache", "--rerun-mode",
        "--distributed-timeout-minutes", "--distributed-timeout-seconds-after-init", "--disable-msc",
        "--check-weight-hash-across-dp-replicas-interval", "--result-rejected-tracker-filename",
        "--disable-gloo-process-groups", "--no-check-for-nan-in-loss-and-grad", "--check-for-spiky-loss",
        "--check-for-large-grads", "--manual-gc", "--manual-gc-interval", "--no-manual-gc-eval",
        "--local-rank", "--tp-comm-bootstrap-backend"),
    "numerics of kernels pipesim times the same (the norm's 1p form, the rotary pairs' interleaving, loss "
    "scaling, fp32 softmax inside the fused kernel, the loss's token averaging)": (
        "--apply-layernorm-1p", "--rotary-interleaved", "--loss-scale",
        "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis",
        "--apply-query-key-layer-scaling", "--attention-softmax-in-fp32", "--calculate-per-token-loss",
        "--fp8-margin", "--fp8-interval", "--fp8-amax-history-len", "--fp8-amax-compute-algo",
        "--moe-input-jitter-eps",
        "--moe-per-layer-logging", "--moe-router-dtype", "--moe-router-pre-softmax",
        "--moe-router-topk-scaling-factor", "--moe-router-bias-update-rate", "--mtp-loss-scaling-factor",
        "--moe-router-force-load-balancing", "--ddp-average-in-collective"),
    "Muon's hyperparameters (later Megatron-core): numbers, not work (every coefficient set runs the same three "
    "GEMMs a Newton-Schulz step)": (
        "--muon-momentum", "--muon-scale-mode", "--muon-extra-scale-factor", "--muon-coefficient-type"),
    "flags v0.15.3 keeps but no longer acts on (--no-async-tensor-model-parallel-allreduce: 'DEPRECATED. This flag "
    "is ignored.'; scatter_gather_tensors_in_pipeline read nowhere else; Megatron-core models the default)": (
        "--no-async-tensor-model-parallel-allreduce", "--no-scatter-gather-tensors-in-pipeline", "--use-mcore-models"),
}
IGNORED_FLAGS = frozenset(flag for flags in IGNORED.values() for flag in flags)

# refused with a reason of their own (any other flag: unknown, or "changes the run and pipesim does not model it")
REFUSED = {
    "--rampup-batch-size": "changes the batch over the run; pipesim times one step of one batch",
    "--decrease-batch-size-if-needed": "changes the batch over the run; pipesim times one step of one batch",
    "--batch-size": "is no longer valid in Megatron-LM v0.15.3 (use --micro-batch-size)",
    "--model-parallel-size": "is no longer valid in Megatron-LM v0.15.3 (use --tensor-model-parallel-size)",
    "--warmup": "is no longer valid in Megatron-LM v0.15.3 (use --lr-warmup-fraction)",
    "--checkpoint-activations": "is no longer valid in Megatron-LM v0.15.3, which exits on it (use "
                                "--recompute-granularity)",
    "--use-legacy-models": "runs Megatron's legacy layers; pipesim times Megatron-core's",
    "--encoder-seq-length": "is the encoder's (T5, BERT); pipesim models GPT's decoder (give --seq-length)",
    "--decoder-seq-length": "is an encoder-decoder's; pipesim models GPT's decoder (give --seq-length)",
    "--encoder-num-layers": "is an encoder-decoder's; pipesim models GPT's decoder (give --num-layers)",
    "--decoder-num-layers": "is an encoder-decoder's; pipesim models GPT's decoder (give --num-layers)",
    "--reset-attention-mask": "attends within documents (a mask other than the causal one), not modelled",
    "--fp32-residual-connection": "keeps the residual stream in float32, not modelled",
    "--fp16-lm-cross-entropy": "runs the cross-entropy in fp16; pipesim times it in float32",
    "--no-fp8-wgrad": "runs the weight-gradient GEMMs in 16 bits under FP8; pipesim times all three in FP8",
    "--distribute-saved-activations": "splits the checkpointed inputs over the tp ranks, not modelled",
    "--moe-use-legacy-grouped-gemm": "pipesim times Transformer Engine's grouped GEMM",
    "--delay-wgrad-compute": "splits the experts' weight gradients out of their backward, not modelled",
    "--optimizer-cpu-offload": "offloads the optimizer to the CPU, not modelled",
    "--use-torch-fsdp2": "Megatron's torch FSDP2 wrapping is not modelled (pipesim's --zero 3 is torchtitan's)",
    "--use-megatron-fsdp": "Megatron-FSDP is not modelled",
    "--enable-cuda-graph": "is the older CUDA-graph switch; give --cuda-graph-impl local",
    "--external-cuda-graph": "is the older CUDA-graph switch; give --cuda-graph-impl transformer_engine",
    "--defer-embedding-wgrad-compute": "defers the output layer's weight gradient, not modelled",
    "--overlap-param-gather-with-optimizer-step": "overlaps the first chunk's gather with the optimizer, not modelled",
    "--use-ring-exchange-p2p": "pipesim times the pipeline sends as NCCL's batch_isend_irecv",
    "--ddp-num-buckets": "pipesim sizes the gradient buckets by --ddp-bucket-size",
    "--log-params-norm": "adds a pass over every parameter and an all-reduce to each step, which pipesim does not time",
    "--log-num-zeros-in-grad": "adds a pass over every gradient and an all-reduce to each step, which pipesim does not "
                               "time",
}

__all__ = ["IGNORED", "IGNORED_FLAGS", "LATER", "LIST", "PASSED", "READ", "REFUSED", "SWITCH", "VALUE"]
