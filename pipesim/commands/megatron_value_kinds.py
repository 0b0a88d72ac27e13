"""How Megatron-LM reads the flags pipesim reads past (pipesim.commands.megatron_flags.IGNORED): a switch (store_true or
store_false: no value), an integer, a number, or one of its choices, as megatron/training/arguments.py @ core_v0.15.3
declares them. Megatron's argparse refuses anything else before a run starts, so a launch file pipesim reads is refused
too (one line), not read past as a run Megatron would not start. Flags of str type, with nargs or a computed type, and
flags after v0.15.3 are not listed: any value.
"""

from __future__ import annotations

from pipesim.errors import PipesimError

SWITCHES = frozenset((
    "--adlr-autoresume", "--apply-layernorm-1p", "--apply-query-key-layer-scaling", "--async-save",
    "--attention-softmax-in-fp32", "--auto-detect-ckpt-format", "--calc-ft-timeouts", "--calculate-per-token-loss",
    "--check-for-large-grads", "--check-for-spiky-loss", "--ckpt-assume-constant-structure",
    "--ckpt-convert-update-legacy-dist-opt-format", "--ckpt-fully-parallel-load", "--ckpt-fully-parallel-save",
    "--data-parallel-random-init", "--ddp-average-in-collective", "--disable-gloo-process-groups", "--disable-msc",
    "--disable-straggler-on-startup", "--dist-ckpt-optim-fully-reshardable", "--dist-ckpt-save-pre-mcore-014",
    "--distrib-optim-fully-reshardable-mem-efficient", "--enable-ft-package", "--eod-mask-loss",
    "--exit-on-missing-checkpoint", "--exit-signal-handler", "--finetune", "--full-validation",
    "--inference-rng-tracker", "--init-method-xavier-uniform", "--inprocess-empty-cuda-cache",
    "--inprocess-restart", "--legacy-tokenizer", "--load-main-params-from-ckpt", "--log-energy",
    "--log-memory-to-tensorboard", "--log-progress", "--log-straggler", "--log-throughput",
    "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard", "--log-world-size-to-tensorboard",
    "--manual-gc", "--mock-data", "--moe-per-layer-logging", "--moe-router-force-load-balancing",
    "--moe-router-pre-softmax", "--multiple-validation-sets", "--no-async-tensor-model-parallel-allreduce",
    "--no-barrier-with-level-1-timing", "--no-check-for-nan-in-loss-and-grad", "--no-ckpt-fully-parallel-save",
    "--no-create-attention-mask-in-dataloader", "--no-initialization", "--no-load-optim", "--no-load-rng",
    "--no-log-loss-scale-to-tensorboard", "--no-manual-gc-eval", "--no-mmap-bin-files", "--no-one-logger",
    "--no-save-optim", "--no-save-rng", "--no-scatter-gather-tensors-in-pipeline", "--no-strict-fsdp-dtensor-load",
    "--no-use-tokenizer-model-from-checkpoint-args", "--one-logger-async", "--override-opt-param-scheduler",
    "--override-opt_param-scheduler", "--profile", "--reset-position-ids", "--rotary-interleaved",
    "--run-workload-inspector-server", "--skip-train", "--te-rng-tracker", "--use-checkpoint-args",
    "--use-checkpoint-opt-param-scheduler", "--use-checkpoint-opt_param-scheduler", "--use-cpu-initialization",
    "--use-dist-ckpt", "--use-mcore-models", "--use-mp-args-from-checkpoint-args", "--use-persistent-ckpt-worker",
    "--use-pytorch-profiler"))
INTEGERS = frozenset((
    "--adlr-autoresume-interval", "--check-weight-hash-across-dp-replicas-interval", "--ckpt-step",
    "--distributed-timeout-minutes", "--distributed-timeout-seconds-after-init", "--eval-interval", "--eval-iters",
    "--exit-duration-in-mins", "--exit-interval", "--fp8-amax-history-len", "--fp8-interval", "--fp8-margin",
    "--hysteresis", "--inprocess-active-world-size", "--inprocess-max-iterations", "--local-rank", "--log-interval",
    "--logging-level", "--lr-decay-iters", "--lr-decay-samples", "--lr-warmup-iters", "--lr-warmup-samples",
    "--lr-wsd-decay-iters", "--lr-wsd-decay-samples", "--manual-gc-interval", "--non-persistent-save-interval",
    "--num-dataset-builder-threads", "--num-workers", "--persistent-save-interval", "--profile-step-end",
    "--profile-step-start", "--save-interval", "--save-retain-interval", "--seed", "--straggler-ctrlr-port",
    "--straggler-minmax-count", "--tensorboard-log-interval", "--tensorboard-queue-size",
    "--tiktoken-num-special-tokens", "--timing-log-level", "--train-iters", "--train-samples", "--vocab-extra-ids"))
NUMBERS = frozenset((
    "--adam-beta1", "--adam-beta2", "--adam-eps", "--clip-grad", "--decoupled-lr", "--decoupled-min-lr",
    "--embedding-init-method-std", "--end-weight-decay", "--init-method-std", "--initial-loss-scale",
    "--inprocess-barrier-timeout", "--inprocess-completion-timeout", "--inprocess-hard-timeout",
    "--inprocess-heartbeat-interval", "--inprocess-heartbeat-timeout", "--inprocess-last-call-wait",
    "--inprocess-monitor-process-interval", "--inprocess-monitor-thread-interval",
    "--inprocess-progress-watchdog-interval", "--inprocess-soft-timeout", "--inprocess-termination-grace-time",
    "--loss-scale", "--loss-scale-window", "--lr", "--lr-warmup-fraction", "--lr-warmup-init",
    "--mid-level-dataset-surplus", "--min-loss-scale", "--min-lr", "--moe-input-jitter-eps",
    "--moe-router-bias-update-rate", "--moe-router-topk-scaling-factor", "--mtp-loss-scaling-factor",
    "--sgd-momentum", "--start-weight-decay", "--weight-decay"))
CHOICES = {
    "--ckpt-convert-format": ('torch', 'torch_dist', 'zarr'),
    "--ckpt-format": ('torch', 'torch_dist', 'zarr', 'torch_dcp', 'fsdp_dtensor'),
    "--dataloader-type": ('single', 'cyclic', 'external'),
    "--fp8-amax-compute-algo": ('most_recent', 'max'),
    "--inprocess-granularity": ('node', 'rank'),
    "--lr-decay-style": ('constant', 'linear', 'cosine', 'inverse-square-root', 'WSD'),
    "--lr-wsd-decay-style": ('exponential', 'linear', 'cosine', 'minus_sqrt'),
    "--moe-router-dtype": ('fp32', 'fp64'),
    "--non-persistent-local-ckpt-algo": ('fully_parallel', 'atomic'),
    "--rerun-mode": ('disabled', 'validate_results', 'report_stats'),
    "--timing-log-option": ('max', 'minmax', 'all'),
    "--tp-comm-bootstrap-backend": ('nccl', 'mpi', 'gloo'),
    "--weight-decay-incr-style": ('constant', 'linear', 'cosine'),
}


def check_read_past(flag: str, values: list[str], where: str) -> None:
    """PipesimError (one line) where Megatron's argparse would refuse `values` for read-past `flag`."""
    if flag in SWITCHES:
        if values:
            raise PipesimError(f"{where}: {flag} takes no value, got {' '.join(values)!r}")
        return
    kind = int if flag in INTEGERS else float if flag in NUMBERS else None
    if kind is None and flag not in CHOICES:
        return
    if len(values) != 1:
        raise PipesimError(f"{where}: {flag} takes one value, got {len(values)}")
    text = values[0]
    if flag in CHOICES and text not in CHOICES[flag]:
        raise PipesimError(f"{where}: {flag} {text!r}: Megatron's choices are {', '.join(CHOICES[flag])}")
    if kind is not None:
        try:
            kind(text)
        except ValueError:
            raise PipesimError(f"{where}: {flag} {text!r} is not {'an integer' if kind is int else 'a number'} "
                               "(Megatron's argparse refuses it)") from None


__all__ = ["CHOICES", "INTEGERS", "NUMBERS", "SWITCHES", "check_read_past"]
